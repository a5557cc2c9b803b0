"""The shim's first lines: ask the host's hit daemon (daemon.py) to serve this compile.

The ``neuronx-cc`` script that ``neffcache shim-dir`` writes runs this module's code,
compiled beside it, ahead of everything else, so it imports built-in modules only: a
Python start that imports nothing more costs about a third of one that imports the
wrapper (docs/architecture.md#the-hit-daemon). ``ask`` sends the command, the working
directory, the environment, the umask, the interpreter's search path and namespaces,
and the caller's standard output and error (their descriptors) over a Unix socket, and
waits for one answer: served, with an exit code, or declined. Anything else (no
daemon, a stale socket, a directory that is not the user's own, a daemon that dies or
goes silent) is also a decline: the shim then does the whole call in its own process,
exactly as without a daemon, and says whether to start one.
"""

from __future__ import annotations

import marshal
import os
import sys
import time

# The request's layout; a daemon declines any other.
PROTOCOL = 2
# The daemon's answers: ``=`` and an exit code of three digits, or ``-``. Before it,
# ``.`` once the request is taken and about every second while it is served.
SERVED = b"="
DECLINED = b"-"
ALIVE = b"."
_CONNECT_TIMEOUT = 1.0
_SILENCE = 10.0  # seconds without a byte from the daemon: NEFFCACHE_DAEMON_WAIT
# A daemon that went silent (stopped, swapping, stuck) is not asked again for this long
# by any shim: each would wait _SILENCE otherwise. Its mark: ``silent_mark``.
SILENT_FOR = 60.0
_OFF = ("0", "false", "no", "off")
# A Unix socket's name is at most 107 bytes on Linux: a longer one cannot be bound.
MAX_PATH = 100


def socket_path(environ: dict[str, str] | os._Environ[str], uid: int) -> tuple[str, str]:
    """(the directory, the socket) of the daemon for this interpreter and search path.

    One per user (the directory is theirs, mode 0700), per group set, per interpreter
    and per ``sys.path``: the daemon imports what this process would import, so a
    caller under another virtual environment or ``PYTHONPATH`` never meets a daemon that
    keys with other packages (NKI's version is part of a key), and it reads and writes
    files with the caller's groups. And per mount and network namespace and filesystem
    encoding: a container that shares the directory with the host would otherwise have
    its ``--output`` written in the daemon's filesystem, its server asked at the
    daemon's ``127.0.0.1``, or its paths' bytes spelled another way."""
    base = environ.get("NEFFCACHE_DAEMON_DIR") or os.path.join(
        environ.get("XDG_RUNTIME_DIR") or "/tmp", f"neffcache-{uid}"
    )
    # FNV-1a, 64 bits: hashlib is not built in, and a name needs no strength (the
    # daemon compares what it names itself).
    h = 0xCBF29CE484222325
    for byte in "\0".join(named()).encode("utf-8", "replace"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return base, os.path.join(base, f"hits-{h:016x}.sock")


def named() -> list[str]:
    """What a daemon must share with its callers, as strings (a ``sys.path`` entry
    that is not one is named by its ``repr``: imports skip it, and so does this)."""
    groups = ",".join(str(g) for g in sorted(os.getgroups()))
    identity = [sys.executable, sys.version, sys.getfilesystemencoding()]
    identity += [f"gid {os.getegid()} groups {groups}", *namespaces()]
    return identity + [p if isinstance(p, str) else repr(p) for p in sys.path]


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


def silent_mark(path: str) -> str:
    """The file beside the socket ``path`` whose time of change is when its daemon last
    went silent: no shim asks it before ``SILENT_FOR`` seconds after that."""
    return f"{path}.silent"


def turned_off(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether ``NEFFCACHE_DAEMON`` turns the daemon off (``0``, ``false``, ``no``,
    ``off``, as the client reads every switch)."""
    return environ.get("NEFFCACHE_DAEMON", "").strip().lower() in _OFF


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
    a daemon on when none answered there and one may be started, else None). Never
    raises: whatever goes wrong here, the shim serves the call itself."""
    try:
        return _ask(argv)
    except Exception:
        return None, None


def _ask(argv: list[str]) -> tuple[int | None, str | None]:
    environ = os.environ
    if turned_off(environ):
        return None, None
    if environ.get("NEFFCACHE_IN_WRAPPER"):
        return None, None  # the compiler the wrapper runs: never served, never started
    uid = os.getuid()
    directory, path = socket_path(environ, uid)
    if not os.path.isabs(path) or len(path.encode("utf-8", "replace")) > MAX_PATH:
        return None, None  # relative (whose directory?) or too long for a socket
    mine = private(directory, uid)
    if not mine:
        return None, (path if mine is None else None)  # absent: start one; else never
    try:
        if time.time() - os.stat(silent_mark(path)).st_mtime < SILENT_FOR:
            return None, None  # it went silent lately: not waited for again yet
    except OSError:
        pass
    import _socket  # built in; ``socket`` would import enum and selectors

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    answer = b""
    try:
        s.settimeout(_CONNECT_TIMEOUT)
        try:
            s.connect(path)
        except OSError:
            return None, path  # none there, or a dead one's socket: start one
        s.settimeout(_wait(environ))
        umask = os.umask(0o022)
        os.umask(umask)
        request = (PROTOCOL, argv, os.getcwd(), dict(environ), umask, named(), os.getpid())
        payload = marshal.dumps(request)
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (1, 2))
        sent = s.sendmsg([payload], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        if sent < len(payload):
            s.sendall(payload[sent:])
        s.shutdown(_socket.SHUT_WR)
        while len(answer) < 4:
            chunk = s.recv(4 - len(answer))
            if not chunk:
                break  # the daemon closed: unanswered
            if not answer:
                chunk = chunk.lstrip(ALIVE)  # it is at work: each wait starts again
            answer += chunk
            if answer[:1] == DECLINED:
                break
    except TimeoutError:
        _mark_silent(path)
        return None, None
    except (OSError, ValueError):
        return None, None  # a daemon that failed this call: this process serves it
    finally:
        s.close()  # the daemon sees the hang-up: a call given up on is not served later
    if answer[:1] == SERVED and len(answer) == 4 and answer[1:].isdigit():
        return int(answer[1:]), None
    return None, None


def _mark_silent(path: str) -> None:
    mark = silent_mark(path)
    try:
        os.close(os.open(mark, os.O_WRONLY | os.O_CREAT, 0o600))
        os.utime(mark)
    except OSError:
        pass


def _wait(environ: dict[str, str] | os._Environ[str]) -> float:
    try:
        wait = float(environ.get("NEFFCACHE_DAEMON_WAIT") or _SILENCE)
    except ValueError:
        return _SILENCE
    return wait if 0 < wait < 86400 else _SILENCE
