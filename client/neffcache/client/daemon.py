"""The host's hit daemon: a process that has imported the wrapper once and serves the
shim's hits, so that a hit costs a Python start and one round trip on a Unix socket
instead of the wrapper's imports (docs/architecture.md#the-hit-daemon).

It serves hits only. For each request (shimclient.py) a worker takes the caller's
environment, working directory, umask and standard output and error, and runs the
wrapper's lookup (``wrapper.serve_hit``: L1, then the server, by the direct key then
the canonical one). A hit writes ``--output`` and the graph's run-manifest line and
event as the shim would, and is answered with its exit code; anything else (a miss,
a command the wrapper does not serve, any trouble) is declined, having counted and
recorded nothing, and the shim does the whole call in its own process: the lease,
the compile and the publish never run here.

One daemon per user and group set, interpreter and search path, namespaces and
filesystem encoding (``shimclient.named``, after which its socket is named). It is
started, detached, by a shim that found none (``start_for``), holds a lock for its
life so that only one starts, and leaves after ``NEFFCACHE_DAEMON_IDLE`` seconds
without a request (600), or within a second of its own code changing on disk (an
upgrade: ``CodeStamp``). Its workers are forked once, after the imports: a request
needs no fork.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neffcache.client import shimclient
from neffcache.client._log import log

if TYPE_CHECKING:
    from neffcache.client.config import ClientConfig
    from neffcache.client.remote import Remote

IDLE = 600.0
WORKERS = 4
# A daemon started this recently and not answering is still starting, or failed to
# (its log says why): not started again before then, or a daemon that cannot start
# would cost every compile a Python start.
_RESTART_AFTER = 30.0
_MAX_REQUEST = 4 << 20  # an environment and an argv; more is not a shim's request
_READ_TIMEOUT = 10.0  # the shim sends its request at once
_STALE = 3  # a worker's exit status: the code changed, the daemon must go
_PEER = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
# The daemon's own start: the shim's search path first, so that it imports what the
# shim would have imported (shimclient.socket_path names it after that path).
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[3]); "
    "from neffcache.client.daemon import main; main(sys.argv[1], int(sys.argv[2]))"
)


# -- starting one -----------------------------------------------------------------------


def start_for(path: str, search_path: list[str]) -> bool:
    """Start a daemon on socket ``path`` for a shim that found none there, detached,
    unless neffcache is not configured (nothing to serve) or one holds the socket's
    lock (it runs or is starting); True when one was started. The lock is taken here
    and handed to the daemon, so that of many ranks finding none at once one starts
    one."""
    from neffcache.client.config import wants_neffcache

    if not wants_neffcache(os.environ) or not hasattr(socket, "SO_PEERCRED"):
        return False  # SO_PEERCRED: Linux's; elsewhere no daemon can check its callers
    directory = os.path.dirname(path)
    with contextlib.suppress(OSError):  # there already, or cannot be: checked next
        os.mkdir(directory, 0o700)
    if not shimclient.private(directory, os.getuid()):
        return False  # not ours, or not there: a socket in it could be anyone's
    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: a daemon runs, or another rank is starting one
        if 0 <= time.time() - _started_at(fd) < _RESTART_AFTER:
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, repr(time.time()).encode(), 0)
        import subprocess

        env = {k: v for k, v in os.environ.items() if k != "NEFFCACHE_IN_WRAPPER"}
        with open(f"{path}.log", "ab") as out:  # why a daemon did not start, or left
            subprocess.Popen(
                [sys.executable, "-c", _BOOT, path, str(fd), json.dumps(search_path)],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=(fd,),
                start_new_session=True,  # not in the job's process group: its signals are not ours
            )
        return True
    except OSError as exc:
        log.info("neffcache: cannot start the hit daemon: %s", exc)
        return False
    finally:
        os.close(fd)  # the daemon's copy keeps the lock


def _started_at(lock_fd: int) -> float:
    """When a daemon was last started on this socket (the lock file holds it); 0 when
    never, or unreadable."""
    try:
        return float(os.pread(lock_fd, 32, 0) or 0)
    except (OSError, ValueError):
        return 0.0


# -- the daemon -------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    argv: list[str]
    cwd: str
    environ: dict[str, str]
    umask: int
    named: list[str]  # what the socket is named after (shimclient.named): the daemon's own
    pid: int


def parse_request(data: bytes) -> Request | None:
    """The shim's request, or None for anything else (another protocol's, bad types)."""
    import marshal

    try:
        fields = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return None
    if not isinstance(fields, tuple) or len(fields) != 7 or fields[0] != shimclient.PROTOCOL:
        return None
    _, argv, cwd, environ, umask, named, pid = fields
    strings = isinstance(argv, list) and isinstance(named, list)
    strings = strings and all(isinstance(s, str) for s in [*argv, *named])
    mapping = isinstance(environ, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in environ.items()
    )
    numbers = type(umask) is int and 0 <= umask <= 0o777 and type(pid) is int
    if not (strings and mapping and numbers and isinstance(cwd, str) and argv):
        return None
    return Request(argv, cwd, environ, umask, named, pid)


class CodeStamp:
    """The daemon's own code as it was when it started: every module file of the
    packages a hit runs (neffcache's client, keying and protocol, loaded or not: a hit
    imports some on demand) and the interpreter. A changed file (an upgrade, an
    editable install's edit) means the daemon would key or serve as the old code did:
    it must go. Looked at once per ``every`` seconds at most (a hundred-odd ``stat``
    calls)."""

    def __init__(self, paths: list[str], every: float = 1.0) -> None:
        self._seen = {path: _stamp(path) for path in paths}
        self._every = every
        self._next = 0.0

    @classmethod
    def of_packages(cls, packages: list[str]) -> CodeStamp:
        import importlib

        paths = [sys.executable]
        for name in packages:
            for directory in getattr(importlib.import_module(name), "__path__", []):
                for top, _, files in os.walk(directory):
                    paths += [os.path.join(top, f) for f in sorted(files) if f.endswith(".py")]
        return cls(paths)

    def changed(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self._every
        return any(_stamp(path) != seen for path, seen in self._seen.items())


def _stamp(path: str) -> tuple[int, int, int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


# What a hit runs: their files are the daemon's code (CodeStamp).
HIT_PACKAGES = ["neffcache.client", "neffcache.keying", "neffcache.protocol"]


def main(path: str, lock_fd: int) -> None:
    """The daemon: bind ``path`` (holding the lock on ``lock_fd``), fork the workers,
    and leave once they all have."""
    os.set_inheritable(lock_fd, False)
    idle = _setting("NEFFCACHE_DAEMON_IDLE", IDLE)
    count = int(_setting("NEFFCACHE_DAEMON_WORKERS", WORKERS))
    stamp = CodeStamp.of_packages(HIT_PACKAGES)  # before the imports: what they load
    serve_hit = _warm()
    # Bound and listening under another name, then renamed over a dead daemon's
    # socket (the lock says none runs): a caller never meets a socket that refuses.
    building = f"{path}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(building)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(building)
    os.chmod(building, 0o600)
    listener.listen(128)
    bound = os.stat(building).st_ino
    os.replace(building, path)
    workers = set()
    for _ in range(max(1, min(count, 64))):
        pid = os.fork()
        if pid == 0:
            os._exit(_work(listener, serve_hit, stamp, idle))
        workers.add(pid)
    while workers:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        workers.discard(pid)
        if os.waitstatus_to_exitcode(status) == _STALE:
            _stop_listening(path, bound)  # new callers start a daemon of the new code
            for other in workers:
                with contextlib.suppress(OSError):
                    os.kill(other, signal.SIGTERM)  # between requests (_work)
    _stop_listening(path, bound)
    listener.close()  # callers still queued read an end of file: they serve themselves


def _stop_listening(path: str, bound: int) -> None:
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == bound:
            os.unlink(path)


def _setting(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if 0 < value < 86400 else default


def _reap() -> None:
    """Collect the children that sent a hit's events and ended (``_after_hit``), between
    requests: none of a request's own subprocesses is waited for then."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _warm() -> Callable[..., int | None]:
    """Import what a hit uses, once, before the workers fork: every keying module (the
    canonical forms are imported on demand) and the client's hit path."""
    import importlib
    import pkgutil

    import neffcache.keying

    for module in pkgutil.iter_modules(neffcache.keying.__path__, "neffcache.keying."):
        importlib.import_module(module.name)
    hit_path = ("compiler", "inputs", "local", "remote", "resolver", "runlog", "session")
    for name in (*hit_path, "telemetry"):
        importlib.import_module(f"neffcache.client.{name}")
    from neffcache.client.wrapper import serve_hit

    return serve_hit


class _Stopping:
    """SIGTERM (the parent's, on an upgrade) ends a worker between requests, never in
    one: a request cut after its line was written would be recorded twice."""

    def __init__(self) -> None:
        self.asked = False
        self.serving = False
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: object) -> None:
        self.asked = True
        if not self.serving:
            os._exit(0)


def _work(
    listener: socket.socket,
    serve_hit: Callable[..., int | None],
    stamp: CodeStamp,
    idle: float,
) -> int:
    """A worker: one request at a time until ``idle`` seconds pass without one; its
    exit status."""
    stopping = _Stopping()
    _not_in_children(listener)
    listener.settimeout(idle)
    remotes: dict[ClientConfig, Remote] = {}  # the server clients, kept with their connections
    while not stopping.asked:
        _reap()
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            return 0
        except OSError:
            return 1
        with conn:
            if stamp.changed():
                return _STALE  # unanswered: the caller serves itself
            stopping.serving = True
            try:
                _answer(conn, lambda argv, wanted: serve_hit(argv, remotes, wanted))
            finally:
                stopping.serving = False
    return 0


def _not_in_children(listener: socket.socket) -> None:
    """Close the listening socket in every child this process forks (the one that
    sends a hit's events): one that outlived the workers would keep the socket
    accepting connections no one answers, and each caller would wait out its silence."""
    os.register_at_fork(after_in_child=listener.close)


def _answer(conn: socket.socket, serve_hit: Callable[..., int | None]) -> None:
    fds: list[int] = []
    served = None
    beat = _Heartbeat(conn)
    try:
        conn.settimeout(_READ_TIMEOUT)
        conn.sendall(shimclient.ALIVE)  # taken: the caller waits while it hears from us
        data = _receive(conn, fds)
        request = None if data is None or len(fds) != 2 else parse_request(data)
        # The same user and groups (the kernel's word), and the same code, files and
        # network (shimclient.named: the socket is named after them). Nothing is
        # written for a caller that hung up (``beat.wanted``): it serves itself.
        if request is not None and _same_caller(conn) and request.named == shimclient.named():
            with beat:
                served = _serve(request, fds, lambda argv: serve_hit(argv, beat.wanted))
        conn.sendall(shimclient.DECLINED if served is None else b"=%03d" % served)
    except OSError:
        return  # the caller went, or timed out: it serves itself
    finally:
        # After the answer, not before it: the beat's thread must wake to end, a
        # switch the caller need not wait for (and none may run when _after_hit forks).
        beat.join()
        for fd in fds:
            os.close(fd)
    if served is not None:
        # The caller exits as it reads the answer: its hang-up first, then the fork
        # that sends the events, so that the fork never delays its exit.
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            conn.recv(1)
        _after_hit()


def _same_caller(conn: socket.socket) -> bool:
    """Whether the connected process has this daemon's uid, gid and groups, as the
    kernel says (``SO_PEERCRED``, and the caller's ``/proc`` status)."""
    pid, uid, gid = _PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))
    if uid != os.getuid() or gid != os.getegid():
        return False
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            line = next((s for s in f if s.startswith("Groups:")), "Groups:")
    except OSError:
        return False
    return sorted(int(g) for g in line.split()[1:]) == sorted(os.getgroups())


class _Heartbeat:
    """While a request is served (``with``): a byte every second to the caller (it
    waits as long as it hears from us, and gives up on silence), and whether it still
    waits (``wanted``: it has not hung up). ``join`` once the answer is sent."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="neffcache-beat", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # no beat after this: the answer follows
            self._stop.set()

    def join(self) -> None:
        """Wait for the beat's thread to end, if it started."""
        if self._thread.ident is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self._stop.is_set():
                    return
                with contextlib.suppress(OSError):
                    self._conn.sendall(shimclient.ALIVE)

    def wanted(self) -> bool:
        """Whether the caller still waits: it has not closed its end."""
        import select

        poller = select.poll()
        poller.register(self._conn, select.POLLHUP | select.POLLERR)
        return not poller.poll(0)


def _receive(conn: socket.socket, fds: list[int]) -> bytes | None:
    """The request's bytes (None past the bound); the descriptors sent with them are
    added to ``fds`` at once, so that the caller's ``finally`` closes them whatever
    happens next (a caller's streams held open would keep its reader waiting)."""
    data, received, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    fds.extend(received)
    parts = [data]
    size = len(data)
    while data:
        data = conn.recv(1 << 16)
        parts.append(data)
        size += len(data)
        if size > _MAX_REQUEST:
            return None
    return b"".join(parts)


def _serve(
    request: Request, fds: list[int], serve_hit: Callable[[list[str]], int | None]
) -> int | None:
    """Run the wrapper's lookup as the caller: its environment, directory, umask and
    streams; the exit code of a hit, else None."""
    _fresh()
    saved = os.dup(1), os.dup(2)
    umask = os.umask(request.umask)
    try:
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.environ)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        return serve_hit(request.argv)
    except Exception:  # the daemon's bug: the caller serves itself
        log.exception("neffcache: the hit daemon failed a request")
        return None
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        os.umask(umask)
        with contextlib.suppress(OSError):
            os.chdir("/")


def _fresh() -> None:
    """Each request starts as a new shim process would: no counters, no queued events,
    the installed frameworks read again, no L1 declared read-only by an earlier caller.
    What was learnt of the server (down, or refusing a token) is kept, as a hook's
    process keeps it across graphs and the shims of a host share it."""
    from neffcache.client import keys, l1access, telemetry
    from neffcache.client.stats import STATS

    STATS.reset()
    telemetry.forget_sender()
    keys.forget_frameworks()
    l1access.forget_declared()


def _after_hit() -> None:
    """The hit's events, sent from a forked child as the shim sends them at its exit:
    the next request does not wait for the server."""
    from neffcache.client import telemetry

    try:
        telemetry.finish(detach=True)
    except Exception:
        log.exception("neffcache: could not send telemetry")
