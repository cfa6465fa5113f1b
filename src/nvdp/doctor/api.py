"""The doctor's one API read, the node's labels, with whatever went wrong said in words and a fix.

No API configuration at all (on a node without a kubeconfig) is a plain fact, not an error: the
checks that would use a label say they could not read it. An API that is configured and answers
wrongly is an error each of those checks reports: refused or unreachable, a TLS failure, a page that
is not the Kubernetes API (a proxy's or login page's HTML), forbidden, no such Node, or no answer in
time. Nothing here raises.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgspec import Struct

from nvdp.doctor.bounded import TimedOut, within

FIX_ADDRESS = (
    "check the API server address: in a pod, KUBERNETES_SERVICE_HOST/PORT (a NetworkPolicy or a proxy "
    "may be in the way); on a node, the server of the current context in the kubeconfig "
    "(`kubectl config view --minify`, or pass --kubeconfig)"
)


class LabelRead(Struct, frozen=True):
    """A Node's labels (None when not read), and why not with the fix."""

    labels: Mapping[str, str] | None
    problem: str = ""
    fix: str = ""
    error: bool = False  # True: an API is configured and failed; False: none configured (or read fine)


NOT_CONFIGURED = LabelRead(None, "no API access")


def read_node_labels(node: str, kubeconfig: str | None, seconds: float) -> LabelRead:
    """The node's labels from the API, within `seconds`; never raises."""
    if not node:
        return LabelRead(None, "no node name (set NODE_NAME or --node-name)")
    try:
        result = within(lambda: _read(node, kubeconfig), seconds, "doctor-api")
    except Exception as err:  # every error becomes a report line
        return _explain(err, "the configured address")
    if isinstance(result, TimedOut):
        return LabelRead(
            None,
            f"the Kubernetes API did not answer within {result.seconds:g} s",
            FIX_ADDRESS,
            error=True,
        )
    return result


def _read(node: str, kubeconfig: str | None) -> LabelRead:
    from nvdp.kube import KubeConnectError, connect, get_node_labels, server_address

    try:
        client = connect(kubeconfig)
    except KubeConnectError as err:
        text = str(err)
        if text.startswith("no Kubernetes API configuration"):
            return LabelRead(None, "no API access")
        return LabelRead(None, text, "fix the kubeconfig named above", error=True)
    try:
        return LabelRead(get_node_labels(client, node).labels)
    except Exception as err:  # every error becomes a report line
        return _explain(err, server_address(client))


def _explain(err: Exception, where: str) -> LabelRead:
    from nvdp.kube import classify

    failure = classify(err)
    if failure.kind == "status":
        code, message = failure.code, failure.detail
        if code in (401, 403):
            return LabelRead(
                None,
                f"the API server refused to show the Node ({code}: {message})",
                "grant get on nodes to the identity used (the chart's ClusterRole gives the plugin's "
                "service account get, list and watch on nodes)",
                error=True,
            )
        if code == 404:
            return LabelRead(
                None,
                f"the API server has no such Node ({message})",
                "set NODE_NAME (or --node-name) to the node's name as `kubectl get nodes` shows it",
                error=True,
            )
        return LabelRead(None, f"the API server answered {code}: {message}", FIX_ADDRESS, error=True)
    if failure.kind == "not-json":
        return LabelRead(
            None,
            f"the server at {where} answered something that is not the Kubernetes API (not JSON: "
            f"{failure.detail}); often a proxy, load balancer or login page",
            FIX_ADDRESS,
            error=True,
        )
    if failure.kind == "tls":
        return LabelRead(
            None,
            f"TLS with the API server at {where} failed: {failure.detail}",
            "the kubeconfig's certificate-authority (in a pod, the service account's ca.crt) must be the "
            "CA that signed the API server's certificate, and the address must be one the certificate "
            "names",
            error=True,
        )
    if failure.kind == "timeout":
        return LabelRead(None, f"the API server at {where} did not answer in time ({failure.detail})",
                         FIX_ADDRESS, True)
    if failure.kind == "unreachable":
        return LabelRead(None, f"cannot reach the API server at {where}: {failure.detail}", FIX_ADDRESS,
                         error=True)
    return LabelRead(None, f"reading the Node failed: {failure.detail}", FIX_ADDRESS, error=True)
