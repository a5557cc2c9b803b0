"""How ``neffcache serve`` runs uvicorn: on a socket bound before anything starts, and
with neffcache's own log lines shown beside uvicorn's.

uvicorn binds its port only after the application's start-up: a port in use would be
reported after "Application startup complete.", the lifespan already run. Bound here
first, it is one line and exit 2 before any of that (``bind``).

uvicorn configures only its own loggers. Without ``server_logging`` the
``neffcache.server`` loggers have no handler: their info lines (refusals, the audit
trail, eviction passes) go nowhere and their warnings reach Python's last-resort
handler without a level or uvicorn's layout.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import logging
import logging.config
import socket
from collections.abc import Iterator
from typing import Any

LOGGER = "neffcache"


class BindError(Exception):
    """The port cannot be had: the message says which and what to do."""


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), as uvicorn binds one
    (``SO_REUSEADDR``: a restart need not wait out the old process's ``TIME_WAIT``;
    Linux still refuses a port something listens on)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BindError(_why(host, port, exc)) from None
    return sock


def _why(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use: stop what listens there "
            f"(`ss -ltnp 'sport = :{port}'` names it), or choose another with --port"
        )
    if exc.errno == errno.EACCES:
        return f"may not listen on port {port} on {host}: choose one above 1023 with --port"
    return f"cannot listen on {host} port {port}: {exc.strerror or exc}"


@contextlib.contextmanager
def server_logging() -> Iterator[None]:
    """uvicorn's logging set-up, plus the ``neffcache`` loggers at info level through
    uvicorn's handler and format, for as long as the server runs. They stop
    propagating meanwhile, so a handler on the root logger (an embedding process's)
    does not print each line twice; afterwards they are as they were (a test that
    runs ``serve`` inside the test process leaves no handler behind)."""
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"][LOGGER] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    logger = logging.getLogger(LOGGER)
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    logging.config.dictConfig(config)
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.propagate = propagate
        logger.setLevel(level)  # which also drops the loggers' cached levels


def run(app: Any, sock: socket.socket, config: dict[str, Any]) -> int:
    """Serve ``app`` on the bound ``sock`` until a signal stops it; the exit status,
    as ``uvicorn.run`` ends (a failed lifespan start-up exits inside uvicorn with the
    same status). ``config`` is ``uvicorn.Config``'s options; logging is
    ``server_logging``'s."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_config=None, **config))
    # uvicorn stops gracefully on Ctrl+C, then raises the captured SIGINT again.
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    return 0 if server.started else STARTUP_FAILURE
