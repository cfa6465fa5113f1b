"""The daemons' log: one format on stderr, every record without the fields it does not print."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def setup_logging(name: str = "nvidia-device-plugin", *, keep_handlers: bool = False) -> logging.Logger:
    """Log INFO and above to stderr in LOG_FORMAT; returns the logger named `name`.

    `keep_handlers`: leave a root logger that already has handlers as it is (logging.basicConfig), for
    the daemons whose log volume does not call for the cheaper records (the MPS daemon, GFD).
    """
    # The API client's library logs every request at INFO: one line per watch, list and patch, which
    # buries the daemon's own lines. Its warnings and errors still show.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if keep_handlers:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
        return logging.getLogger(name)
    # The log format uses none of the caller, thread or process fields; not collecting them (the
    # logging module's documented switches) makes each record, one per Allocate, about a third cheaper.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return logging.getLogger(name)
