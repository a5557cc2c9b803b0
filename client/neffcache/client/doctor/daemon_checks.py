"""The hit daemon (docs/architecture.md#the-hit-daemon): whether the shim on PATH can
use one, and whether one runs.

The socket is named after the shim's interpreter and search path
(``shimclient.socket_path``), so it is computed in the shim's own Python, by the
probe (``probe_script.daemon``). Every problem found here is a ``WARN``, never a
``FAIL``: without a daemon the shim does the whole call itself, so each compile is
still cached and served, only a hit costs the wrapper's imports again.
"""

from __future__ import annotations

import os
import socket

from neffcache.client import shimclient
from neffcache.client.config import wants_neffcache
from neffcache.client.doctor import interpreters
from neffcache.client.doctor.context import Context
from neffcache.client.doctor.model import Result, passed, skipped, warned

# A daemon answers a connect at once (its workers wait in accept); the shim waits as long.
CONNECT_TIMEOUT = 1.0
# How much of the log's end is read for its last line.
_LOG_TAIL = 4096
_OWN_DIR = "set NEFFCACHE_DAEMON_DIR to a short directory of your own (mode 700)"


def daemon(ctx: Context) -> Result:
    environ = ctx.environ
    if shimclient.turned_off(environ):
        return skipped("the hit daemon is off (NEFFCACHE_DAEMON): the shim does every call itself")
    if not wants_neffcache(environ):
        return skipped("no neffcache URL is configured: the shim starts no daemon (config.url)")
    shim = next((t for t in ctx.tools() if t.name == "the shim"), None)
    command = shim.command if shim is not None else None
    if shim is None or command is None:
        return skipped("no neffcache shim on PATH, or not a Python script (paths.shim)")
    facts = ctx.once(
        ("daemon socket", command, shim.path),
        lambda: interpreters.probe(command, environ, daemon_of=shim.path),
    )
    if "socket" not in facts:
        why = facts.get("error") or f"neffcache does not import: {facts.get('neffcache_error')}"
        return skipped(f"cannot name the daemon's socket in the shim's Python: {why}")
    return _judge(str(facts["directory"]), str(facts["socket"]))


def _judge(directory: str, path: str) -> Result:
    data = {"directory": directory, "socket": path}
    size = len(path.encode("utf-8", "replace"))
    if size > shimclient.MAX_PATH:
        return warned(
            f"the daemon's socket {path} would be {size} bytes, over the {shimclient.MAX_PATH} "
            "a Unix socket's name may have: the shim never uses a daemon, and every hit pays "
            "the wrapper's imports",
            _OWN_DIR,
            **data,
        )
    unusable = _not_private(directory)
    if unusable is not None:
        return warned(unusable[0], unusable[1], **data)
    log = last_line(f"{path}.log")
    said = f"; its log's last line: {log}" if log else ""
    if _answers(path):
        return passed(
            f"running: a hit daemon answers on {path}{said}", running=True, log=log, **data
        )
    return passed(
        f"none running yet on {path}; the next shim call starts one{said}",
        running=False,
        log=log,
        **data,
    )


def _not_private(directory: str) -> tuple[str, str] | None:
    """(evidence, fix) when the shim neither uses nor starts a daemon in ``directory``
    (``shimclient.private``), else None."""
    uid = os.getuid()
    try:
        status = os.stat(directory)
    except OSError:
        parent = os.path.dirname(directory.rstrip(os.sep)) or os.sep
        if os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK):
            return None  # the first shim call makes it, mode 0700
        return (
            f"the daemon's directory {directory} does not exist and cannot be made in "
            f"{parent}: the shim never starts a daemon, and every hit pays the wrapper's imports",
            f"mkdir -m 700 {directory}, or {_OWN_DIR}",
        )
    if shimclient.private(directory, uid):
        if os.access(directory, os.W_OK | os.X_OK):
            return None
        return (
            f"the daemon's directory {directory} is yours but not writable: the shim never "
            "starts a daemon there, and every hit pays the wrapper's imports",
            f"chmod 700 {directory}, or {_OWN_DIR}",
        )
    mode = status.st_mode & 0o777
    whose = "yours" if status.st_uid == uid else f"uid {status.st_uid}'s, not yours (uid {uid})"
    evidence = (
        f"the daemon's directory {directory} is {whose}, mode {mode:04o}: a socket there could "
        "be someone else's, so the shim neither uses nor starts a daemon, and every hit pays "
        "the wrapper's imports"
    )
    if status.st_uid != uid:
        return evidence, f"chown {uid} {directory} && chmod 700 {directory}, or {_OWN_DIR}"
    return evidence, f"chmod 700 {directory}, or {_OWN_DIR}"


def _answers(path: str) -> bool:
    """Whether a daemon accepts a connection on ``path``. Nothing is sent: a daemon
    declines a request it cannot read, and this closes without one."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(CONNECT_TIMEOUT)
        probe.connect(path)
        return True
    except OSError:
        return False  # none there, or a socket a daemon that ended left
    finally:
        probe.close()


def last_line(path: str) -> str | None:
    """The last line that is not blank of the file ``path`` (a daemon's log: why it
    did not start, or left), or None when it is empty or absent."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _LOG_TAIL))
            tail = f.read(_LOG_TAIL).decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else None
