"""The shim's first lines: ask the host's hit daemon (daemon.py) to serve this compile.

The source of this module is copied whole into the ``neuronx-cc`` script that
``neffcache shim-dir`` writes, ahead of everything else, so it imports built-in
modules only: a Python start that imports nothing more costs about a third of one
that imports the wrapper (docs/architecture.md#the-hit-daemon). ``ask`` sends the
command, the working directory, the environment, the umask, the interpreter's search
path and the caller's standard output and error (their descriptors) over a Unix
socket, and waits for one answer: served, with an exit code, or declined. Anything
else (no daemon, a stale socket, a directory that is not the user's own, a daemon
that dies or takes too long) is also a decline: the shim then does the whole call in
its own process, exactly as without a daemon, and says whether to start one.
"""

from __future__ import annotations

import marshal
import os
import sys

# The request's layout; a daemon declines any other.
PROTOCOL = 1
# The daemon's answers: ``=`` and an exit code of three digits, or ``-``.
SERVED = b"="
DECLINED = b"-"
_CONNECT_TIMEOUT = 1.0
_ANSWER_TIMEOUT = 30.0  # per read; NEFFCACHE_DAEMON_WAIT
_OFF = ("0", "false", "no", "off")
# A Unix socket's name is at most 107 bytes on Linux: a longer one cannot be bound.
MAX_PATH = 100


def socket_path(environ: dict[str, str] | os._Environ[str], uid: int) -> tuple[str, str]:
    """(the directory, the socket) of the daemon for this interpreter and search path.

    One per user (the directory is theirs, mode 0700), per interpreter and per
    ``sys.path``: the daemon imports what this process would import, so a caller
    under another virtual environment or ``PYTHONPATH`` never meets a daemon that
    keys with other packages (NKI's version is part of a key). And per mount and
    network namespace: a container that shares the directory with the host (or
    another container) would otherwise have its ``--output`` written in the daemon's
    filesystem, and its server asked at the daemon's ``127.0.0.1``."""
    base = environ.get("NEFFCACHE_DAEMON_DIR") or os.path.join(
        environ.get("XDG_RUNTIME_DIR") or "/tmp", f"neffcache-{uid}"
    )
    # FNV-1a, 64 bits: hashlib is not built in, and a name needs no strength (the
    # daemon compares the search path and the namespaces itself).
    h = 0xCBF29CE484222325
    named = [sys.executable, sys.version, *namespaces(), *sys.path]
    for byte in "\0".join(named).encode("utf-8", "replace"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return base, os.path.join(base, f"hits-{h:016x}.sock")


def namespaces() -> list[str]:
    """This process's mount and network namespaces (``mnt:[4026531841]``), as Linux
    names them; ``?`` where it cannot tell."""
    found = []
    for kind in ("mnt", "net"):
        try:
            found.append(os.readlink(f"/proc/self/ns/{kind}"))
        except OSError:
            found.append("?")
    return found


def private(directory: str, uid: int) -> bool | None:
    """Whether ``directory`` is the user's own and no one else's (None: it is not
    there). A socket in a directory others can write could be theirs."""
    try:
        status = os.stat(directory)
    except OSError:
        return None
    return status.st_uid == uid and not status.st_mode & 0o077


def ask(argv: list[str]) -> tuple[int | None, str | None]:
    """(the exit code when the daemon served the call, else None; the socket to start
    a daemon on when none answered there and one may be started, else None)."""
    environ = os.environ
    if environ.get("NEFFCACHE_DAEMON", "").strip().lower() in _OFF:
        return None, None
    if environ.get("NEFFCACHE_IN_WRAPPER"):
        return None, None  # the compiler the wrapper runs: never served, never started
    uid = os.getuid()
    directory, path = socket_path(environ, uid)
    if len(path.encode("utf-8", "replace")) > MAX_PATH:
        return None, None  # NEFFCACHE_DAEMON_DIR too deep for a socket: no daemon
    mine = private(directory, uid)
    if not mine:
        return None, (path if mine is None else None)  # absent: start one; else never
    import _socket  # built in; ``socket`` would import enum and selectors

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(_CONNECT_TIMEOUT)
        try:
            s.connect(path)
        except OSError:
            return None, path  # none there, or a dead one's socket: start one
        s.settimeout(_wait(environ))
        umask = os.umask(0o022)
        os.umask(umask)
        payload = marshal.dumps(
            (PROTOCOL, argv, os.getcwd(), dict(environ), umask, sys.path, namespaces(), os.getpid())
        )
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (1, 2))
        sent = s.sendmsg([payload], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        if sent < len(payload):
            s.sendall(payload[sent:])
        s.shutdown(_socket.SHUT_WR)
        answer = b""
        while len(answer) < 4:
            chunk = s.recv(4 - len(answer))
            answer += chunk
            if not chunk or answer[:1] != SERVED:
                break
    except (OSError, ValueError):
        return None, None  # a daemon that failed this call: this process serves it
    finally:
        s.close()
    if answer[:1] == SERVED and len(answer) == 4 and answer[1:].isdigit():
        return int(answer[1:]), None
    return None, None


def _wait(environ: dict[str, str] | os._Environ[str]) -> float:
    try:
        wait = float(environ.get("NEFFCACHE_DAEMON_WAIT") or _ANSWER_TIMEOUT)
    except ValueError:
        return _ANSWER_TIMEOUT
    return wait if 0 < wait < 86400 else _ANSWER_TIMEOUT
