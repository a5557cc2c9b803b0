"""The hit daemon (docs/architecture.md#the-hit-daemon): whether the shim on PATH can
use one, whether one runs, and whether the shim skips it for now, having found it
silent (its mark, ``shimclient.silent_mark``, read as the shim reads it).

The socket is named after the shim's interpreter and search path
(``shimclient.socket_path``), so it is computed in the shim's own Python, by the
probe (``probe_script.daemon``). Every problem found here is a ``WARN``, never a
``FAIL``: without a daemon the shim does the whole call itself, so each compile is
still cached and served, only a hit costs the wrapper's imports again.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from typing import Any, NamedTuple

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
# docs/client.md's words for NEFFCACHE_DAEMON=0.
_TURN_OFF = (
    "export NEFFCACHE_DAEMON=0: the shim never asks nor starts a hit daemon; each call is "
    "a process of its own"
)


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
    running = _answers(path)
    mark = silence(path, time.time())
    facts = {**data, "running": running, "log": log, "silent": _silent_data(mark)}
    if mark is not None and mark.current:
        return _skipped_by_the_shim(path, mark, running, said, facts)
    # A mark older than SILENT_FOR is history the shim ignores: a detail, not a warning.
    details = [mark.stale()] if mark is not None else []
    if running:
        return passed(f"running: a hit daemon answers on {path}{said}", details=details, **facts)
    return passed(
        f"none running yet on {path}; the next shim call starts one{said}",
        details=details,
        **facts,
    )


class Silence(NamedTuple):
    """The shim's mark on a daemon that went silent (``shimclient.silent_mark``), as the
    shim reads it: only its time of change counts, whatever the file is."""

    mark: str
    marked: float  # when the daemon last went silent, by this host's clock
    now: float
    odd: str | None  # what the mark is when not the empty file the shim makes

    @property
    def until(self) -> float:
        return self.marked + shimclient.SILENT_FOR

    @property
    def current(self) -> bool:
        """Whether the shim skips the daemon now (``shimclient._ask``'s own test)."""
        return self.now - self.marked < shimclient.SILENT_FOR

    def said(self) -> str:
        ahead = " (ahead of this host's clock)" if self.marked > self.now else ""
        return f"marked silent at {utc(self.marked)}{ahead} in {self.mark}"

    def stale(self) -> str:
        limit = f"{shimclient.SILENT_FOR:.0f} s"
        return f"{self.said()}, over {limit} ago: the shim no longer skips this daemon"


def silence(path: str, now: float) -> Silence | None:
    """The mark beside the socket ``path``, or None when there is none the shim could
    read. Never raises: the mark is a file anyone with the directory may have made."""
    mark = shimclient.silent_mark(path)
    try:
        status = os.stat(mark)  # followed, as the shim follows it
        link = os.lstat(mark)
    except (OSError, ValueError):
        return None  # none, a dangling or looping link: the shim ignores it too
    if stat.S_ISLNK(link.st_mode):
        odd: str | None = "a symbolic link"
    elif not stat.S_ISREG(status.st_mode):
        odd = "a directory" if stat.S_ISDIR(status.st_mode) else "not a regular file"
    else:
        odd = None
    return Silence(mark, status.st_mtime, now, odd)


def _skipped_by_the_shim(
    path: str, mark: Silence, running: bool, said: str, facts: dict[str, Any]
) -> Result:
    state = (
        "a daemon accepts connections there but went silent"
        if running
        else "none answers there now, and no shim starts one before then"
    )
    evidence = (
        f"the shim skips the hit daemon on {path} until {utc(mark.until)}: {mark.said()}; "
        f"{state}: meanwhile every hit pays the wrapper's imports{said}"
    )
    rm = "rm -r" if mark.odd == "a directory" else "rm"
    if mark.odd is not None:
        fix = f"the mark is {mark.odd}, not the empty file the shim makes: {rm} {mark.mark}"
    elif mark.marked > mark.now:
        fix = (
            "the mark is dated ahead of this host's clock (planted, or the clock went "
            f"back): {rm} {mark.mark}"
        )
    else:
        fix = f"read why in its log, {path}.log; if it stays silent, {_TURN_OFF}"
    return warned(evidence, fix, **facts)


def _silent_data(mark: Silence | None) -> dict[str, Any] | None:
    if mark is None:
        return None
    return {
        "mark": mark.mark,
        "marked": utc(mark.marked),
        "until": utc(mark.until),
        "current": mark.current,
        "odd": mark.odd,
    }


def utc(when: float) -> str:
    """``when`` as ISO 8601 UTC to the second; a time ``gmtime`` cannot spell (a mark's
    planted far-off date) as seconds since the epoch."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    except (OverflowError, OSError, ValueError):
        return f"{when:.0f} s since the epoch"


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
