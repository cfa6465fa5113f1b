"""HTTP endpoints under load: nvdp's own server against maintained ones, same machine, same run.

    .venv/bin/python bench/endpoints_bench.py                 # nvdp, http.server, waitress if importable
    .venv/bin/python bench/endpoints_bench.py --rounds 3 --baseline before=/tmp/old/src
    .venv/bin/python bench/endpoints_bench.py --quick         # 100 scrapes, a smoke run

Each server runs in a process of its own that has first imported what the serving plugin holds anyway
(`nvdp.plugin.main`, `manager`, `server`, prometheus-client): its start-up is the time, modules and
peak memory (VmHWM) that importing and starting the server adds to that. It serves the routes a
plugin with `--metrics-address` serves: `/metrics` (the plugin's series for a100-sxm-8 with
time-slicing x4, 32 devices, made by prometheus-client at each scrape), `/healthz` (2 ms, what the
plugin's calls to its gRPC servers take) and `/readyz`.

Then, all at once from this process: 500 scrapes of `/metrics`, 100 at a time (10 s timeout each,
the chart's scrapeTimeout); 10 slowloris clients, each sending a header byte a second and never
ending its request (reconnecting when dropped); malformed requests one after another (garbage, binary,
a 20 KiB request line, a TLS ClientHello, a half request then close, POST, an unknown path); and the
kubelet's probes, `/healthz` and `/readyz` alternately every 0.5 s with the chart's 5 s timeout. The
probes go on for 5 s after the storm (the slowloris clients still there), and one last probe is
sent after everything stopped. Counted: scrapes answered 200 / 503 / not answered; probes answered
200 within 5 s and their latency; malformed requests answered with a status line / closed / given
no status line / hung; slowloris connections the server closed, and the longest one held open (seen
from the client: up to a second late); the server's peak thread count and VmHWM.

Servers: `nvdp` (`nvdp.daemon.report.endpoints.HttpEndpoints`); `http.server` (the standard library's
`ThreadingHTTPServer`, the base of prometheus-client's `start_http_server`, with the system's listen
backlog and a 3 s socket timeout, its only deadline, which is per read); `waitress` (waitress 3, a
maintained pure-Python WSGI server: 4 threads, `channel_timeout` 3 s checked every second, its
defaults otherwise) when it can be imported (`pip install --target DIR waitress`, then
`--path DIR`); `--baseline LABEL=DIR` adds nvdp's server from another source tree
(`git archive <commit> src | tar -x -C /tmp/old`). Server order rotates each round.

Exit status 0 with the table; 1 when a server could not start.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PROBE_TIMEOUT_S = 5.0  # the chart's timeoutSeconds for both probes
SCRAPE_TIMEOUT_S = 10.0  # the chart's ServiceMonitor scrapeTimeout
MALFORMED = [
    b"garbage\r\n\r\n",
    b"\x00\xff\xfe\x01 binary \x80\r\n\r\n",
    b"GET /" + b"A" * 20480 + b" HTTP/1.1\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(32),  # a TLS ClientHello's start
    b"GET /metr",  # then closes
    b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    b"GET /nothing HTTP/1.1\r\n\r\n",
    b"\r\n\r\n",
]


# --- the server process ---------------------------------------------------------------------------

def _status_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _routes() -> dict[str, Any]:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from nvdp.daemon.report.endpoints import Response
    from nvdp.daemon.report.recording import Recorder

    recorder = Recorder()
    series = recorder.enable_metrics()

    def metrics() -> Response:
        recorder.resource_state([("nvidia.com/gpu", 32, 0)], ["nvidia.com/gpu"])
        return Response(200, generate_latest(series.PLUGIN), CONTENT_TYPE_LATEST)

    def healthz() -> Response:
        time.sleep(0.002)
        return Response(200, b"live\nmanager: ok\nserver nvidia.com/gpu: ok\nhealth loop: ok\n")

    def readyz() -> Response:
        return Response(200, b"ready\nnvidia.com/gpu: registered\n")

    return {"/metrics": metrics, "/healthz": healthz, "/readyz": readyz}


def _start_nvdp(routes: dict[str, Any]) -> int:
    import logging

    from nvdp.daemon.report.endpoints import HttpEndpoints

    server = HttpEndpoints("127.0.0.1:0", routes, logging.getLogger("bench"))
    server.start()
    return server.port


def _start_http_server(routes: dict[str, Any]) -> int:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        timeout = 3.0  # per read: the only deadline http.server has

        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            response = route() if route else None
            self.send_response(response.status if response else 404)
            body = response.body if response else b"not found\n"
            self.send_header("Content-Type", response.content_type if response else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = socket.SOMAXCONN
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that went away: its traceback on stderr is no figure

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return int(server.server_address[1])


def _start_waitress(routes: dict[str, Any]) -> int:
    import waitress  # type: ignore[import-not-found,unused-ignore,import-untyped]

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        route = routes.get(environ["PATH_INFO"])
        if route is None or environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        response = route()
        start_response(f"{response.status} OK", [("Content-Type", response.content_type)])
        return [response.body]

    server = waitress.create_server(app, host="127.0.0.1", port=0, threads=4, channel_timeout=3,
                                    cleanup_interval=1)
    threading.Thread(target=server.run, daemon=True).start()
    return int(server.effective_port)


STARTERS = {"nvdp": _start_nvdp, "http.server": _start_http_server, "waitress": _start_waitress}


def serve(kind: str) -> None:
    """The server process: print its start-up figures and port as JSON, serve until stdin closes.

    Start-up is measured before prometheus-client is imported, as in a plugin serving only the probes
    (the chart's default): prometheus-client imports http.server itself."""
    import nvdp.plugin.main
    import nvdp.plugin.manager
    import nvdp.plugin.server  # noqa: F401

    handlers: dict[str, Any] = {}  # filled once started (prometheus-client then)
    routes = {path: (lambda path=path: handlers[path]()) for path in ("/metrics", "/healthz", "/readyz")}
    modules, peak = len(sys.modules), _status_kib("self", "VmHWM")
    started = time.perf_counter()
    port = STARTERS[kind](routes)
    start_ms = (time.perf_counter() - started) * 1000
    figures = {"port": port, "start_ms": start_ms, "modules": len(sys.modules) - modules,
               "hwm_kib": _status_kib("self", "VmHWM") - peak}
    handlers.update(_routes())
    routes["/metrics"]()  # prometheus-client's first scrape, not the server's cost
    print(json.dumps(figures), flush=True)
    sys.stdin.read()


# --- the load, from this process ------------------------------------------------------------------

def _request(port: int, data: bytes, timeout: float) -> tuple[str, float]:
    """('200', seconds) for an answer, 'closed' (no answer), 'reset' or 'timeout'."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.settimeout(max(0.01, started + timeout - time.monotonic()))
            conn.sendall(data)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
                conn.settimeout(max(0.01, started + timeout - time.monotonic()))
    except TimeoutError:
        return "timeout", time.monotonic() - started
    except ConnectionError:
        return "reset", time.monotonic() - started
    except OSError as err:
        return type(err).__name__, time.monotonic() - started
    elapsed = time.monotonic() - started
    if not answer:
        return "closed", elapsed
    if not answer.startswith(b"HTTP/"):
        return "no-status-line", elapsed
    return answer.split(b" ", 2)[1].decode(), elapsed


def _closed(conn: socket.socket) -> bool:
    """Whether the server closed `conn` (end of stream or reset), without waiting; an answer is read."""
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return conn.recv(65536) == b""
    except ConnectionError:
        return True


class Load:
    def __init__(self, port: int, pid: int, scrapes: int) -> None:
        self.port, self.pid, self.scrapes = port, pid, scrapes
        self.done = threading.Event()
        self.storm_over = threading.Event()
        self.scrape_results: list[str] = []
        self.probes: list[tuple[str, float]] = []
        self.malformed: list[str] = []
        self.slow_held: list[float] = []  # how long each slowloris connection stayed open
        self.slow_cut = 0  # slowloris connections the server closed
        self.peak_threads = 0

    def slowloris(self) -> None:
        while not self.done.is_set():
            opened = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=PROBE_TIMEOUT_S) as conn:
                    conn.sendall(b"GET /metrics HTTP/1.1\r\n")
                    while not self.done.wait(1.0) and not _closed(conn):
                        conn.sendall(b"X")  # a header that never ends
            except OSError:
                pass
            self.slow_held.append(time.monotonic() - opened)
            self.slow_cut += not self.done.is_set()
            self.done.wait(0.1)  # a server that refuses at once must not make this a busy loop

    def prober(self) -> None:
        paths = ["/healthz", "/readyz"]
        while not self.done.is_set():
            path = paths[len(self.probes) % 2]
            self.probes.append(_request(self.port, f"GET {path} HTTP/1.1\r\nHost: node\r\n\r\n".encode(),
                                        PROBE_TIMEOUT_S))
            self.done.wait(0.5)

    def bad_clients(self) -> None:
        while not self.storm_over.is_set():
            for request in MALFORMED:
                self.malformed.append(_request(self.port, request, PROBE_TIMEOUT_S)[0])

    def threads(self) -> None:
        while not self.done.wait(0.1):
            try:
                self.peak_threads = max(self.peak_threads, _status_kib(self.pid, "Threads"))
            except (OSError, KeyError):
                return

    def run(self) -> float:
        from concurrent.futures import ThreadPoolExecutor

        helpers = [threading.Thread(target=self.slowloris) for _ in range(10)]
        helpers += [threading.Thread(target=t) for t in (self.prober, self.bad_clients, self.threads)]
        for helper in helpers:
            helper.start()
        time.sleep(1.0)  # the slowloris clients are in
        started = time.monotonic()
        get = b"GET /metrics HTTP/1.1\r\nHost: node\r\nAccept: text/plain\r\n\r\n"
        with ThreadPoolExecutor(100) as pool:  # 100 scrapes at a time
            answers = pool.map(lambda _: _request(self.port, get, SCRAPE_TIMEOUT_S), range(self.scrapes))
            self.scrape_results = [r for r, _ in answers]
        storm_s = time.monotonic() - started
        self.storm_over.set()
        time.sleep(5.0)  # the probes go on, the slowloris clients still there
        self.done.set()
        for helper in helpers:
            helper.join(30)
        return storm_s


def measure(kind: str, python_path: list[str], scrapes: int) -> dict[str, Any]:
    import subprocess

    from plugin_bench import percentile

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*python_path, str(ROOT / "src")])}
    served = subprocess.Popen([sys.executable, __file__, "--serve", kind], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, text=True)
    assert served.stdout is not None and served.stdin is not None
    try:
        first = served.stdout.readline()
        if not first:
            raise SystemExit(f"{kind}: the server did not start (see above)")
        started = json.loads(first)
        load = Load(started["port"], served.pid, scrapes)
        storm_s = load.run()
        last = _request(started["port"], b"GET /healthz HTTP/1.1\r\n\r\n", PROBE_TIMEOUT_S)[0]
        hwm = _status_kib(served.pid, "VmHWM")
    finally:
        served.stdin.close()
        served.wait(10)
    probe_ok = [s for r, s in load.probes if r == "200"]
    latencies = [s * 1000 for _, s in load.probes]
    return {
        **started, "storm_s": storm_s, "last_probe": last, "hwm_total_kib": hwm,
        "peak_threads": load.peak_threads,
        "scrapes": {r: load.scrape_results.count(r) for r in sorted(set(load.scrape_results))},
        "probes": len(load.probes), "probes_ok": len(probe_ok),
        "probe_p50_ms": percentile(latencies, 50), "probe_max_ms": max(latencies),
        "malformed": {r: load.malformed.count(r) for r in sorted(set(load.malformed))},
        "slow_held_max_s": max(load.slow_held, default=0.0), "slow_connections": len(load.slow_held),
        "slow_cut": load.slow_cut,
    }


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in counts.items())


def _malformed(counts: dict[str, int]) -> str:
    """Answered with a status line / closed without one / no status line / hung (past the 5 s)."""
    answered = sum(v for k, v in counts.items() if k.isdigit())
    closed = counts.get("closed", 0) + counts.get("reset", 0)
    return f"{answered}/{closed}/{counts.get('no-status-line', 0)}/{counts.get('timeout', 0)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=sorted(STARTERS), help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="100 scrapes instead of 500")
    parser.add_argument("--path", action="append", default=[], metavar="DIR",
                        help="a directory added to the servers' import path (e.g. where waitress is)")
    parser.add_argument("--baseline", action="append", default=[], metavar="LABEL=DIR",
                        help="nvdp's server from another source tree")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    import subprocess

    sys.path.insert(0, str(ROOT / "bench"))
    from plugin_bench import load_average, print_rows

    paths = [str(Path(p).resolve()) for p in args.path]
    columns: dict[str, tuple[str, list[str]]] = {"nvdp": ("nvdp", paths)}
    for baseline in args.baseline:
        label, _, directory = baseline.partition("=")
        columns[f"nvdp {label}"] = ("nvdp", [str(Path(directory).resolve()), *paths])
    columns["http.server"] = ("http.server", paths)
    probe = subprocess.run([sys.executable, "-c", "import waitress"], capture_output=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
    if probe.returncode == 0:
        columns["waitress"] = ("waitress", paths)
    else:
        print("waitress: not importable, left out (pip install --target DIR waitress; --path DIR)")
    scrapes = 100 if args.quick else 500
    print(f"{os.cpu_count()} CPUs, load average {load_average()}, Python {sys.version.split()[0]}, "
          f"{scrapes} scrapes 100 at a time, 10 slowloris clients, malformed requests, "
          f"{args.rounds} round(s)")
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in columns}
    labels = list(columns)
    for round_no in range(args.rounds):
        for label in labels[round_no % len(labels):] + labels[:round_no % len(labels)]:
            kind, python_path = columns[label]
            results[label].append(measure(kind, python_path, scrapes))
            print(f"round {round_no + 1} {label}: {json.dumps(results[label][-1])}", flush=True)
    table = [("figure", *labels)]

    def row(name: str, cell: Any) -> None:
        table.append((name, *(" / ".join(cell(r) for r in results[label]) for label in labels)))

    row("start: ms", lambda r: f"{r['start_ms']:.1f}")
    row("start: modules added", lambda r: str(r["modules"]))
    row("start: VmHWM added KiB", lambda r: str(r["hwm_kib"]))
    row("scrapes (200 / 503 / none)", lambda r: _counts(r["scrapes"]))
    row("storm s", lambda r: f"{r['storm_s']:.1f}")
    row("probes 200 within 5 s", lambda r: f"{r['probes_ok']}/{r['probes']}")
    row("probe p50 / max ms", lambda r: f"{r['probe_p50_ms']:.0f}/{r['probe_max_ms']:.0f}")
    row("probe after the run", lambda r: r["last_probe"])
    row("malformed: status/closed/no status/hung", lambda r: _malformed(r["malformed"]))
    row("slowloris closed by server / held max s",
        lambda r: f"{r['slow_cut']}/{r['slow_held_max_s']:.1f}")
    row("peak threads", lambda r: str(r["peak_threads"]))
    row("VmHWM MiB", lambda r: f"{r['hwm_total_kib'] / 1024:.1f}")
    print()
    print_rows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
