"""The hit daemon's parts, in process: the shim's thin client (shimclient.py) against
a socket this test answers, the request it sends as the daemon reads it, the checks
the daemon makes before it serves (its caller's uid, its own code), and what
``start_for`` refuses. tests/client/test_e2e_daemon.py runs the whole thing behind
the shim."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from neffcache.client import daemon, shimclient

# -- the name ---------------------------------------------------------------------------


def test_the_socket_is_named_after_the_interpreter_and_its_search_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"NEFFCACHE_DAEMON_DIR": "/run/x"}
    directory, first = shimclient.socket_path(env, 1000)  # type: ignore[arg-type]
    assert directory == "/run/x"
    assert first.startswith("/run/x/hits-")
    assert shimclient.socket_path(env, 1000)[1] == first  # type: ignore[arg-type]
    monkeypatch.setattr(sys, "path", [*sys.path, "/another/venv/site-packages"])
    second = shimclient.socket_path(env, 1000)[1]  # type: ignore[arg-type]
    assert second != first
    monkeypatch.setattr(shimclient, "namespaces", lambda: ["mnt:[9]", "net:[9]"])
    assert shimclient.socket_path(env, 1000)[1] not in (first, second)  # type: ignore[arg-type]


def test_the_socket_directory_is_per_user_under_the_runtime_directory() -> None:
    assert shimclient.socket_path({"XDG_RUNTIME_DIR": "/run/user/7"}, 7)[0] == (  # type: ignore[arg-type]
        "/run/user/7/neffcache-7"
    )
    assert shimclient.socket_path({}, 7)[0] == "/tmp/neffcache-7"  # type: ignore[arg-type]


def test_only_a_directory_of_the_users_own_is_private(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    mine.chmod(0o700)
    assert shimclient.private(str(mine), os.getuid()) is True
    mine.chmod(0o770)
    assert shimclient.private(str(mine), os.getuid()) is False
    mine.chmod(0o700)
    assert shimclient.private(str(mine), os.getuid() + 1) is False
    assert shimclient.private(str(tmp_path / "absent"), os.getuid()) is None


# -- the thin client against a socket this test answers ---------------------------------


@pytest.fixture
def sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private socket directory (short: a socket's name is at most 107 bytes), set
    as NEFFCACHE_DAEMON_DIR."""
    directory = Path(tempfile.mkdtemp(prefix="nd-", dir="/tmp"))
    monkeypatch.setenv("NEFFCACHE_DAEMON_DIR", str(directory))
    monkeypatch.delenv("NEFFCACHE_DAEMON", raising=False)
    monkeypatch.delenv("NEFFCACHE_IN_WRAPPER", raising=False)
    yield directory
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()


def the_path() -> str:
    return shimclient.socket_path(os.environ, os.getuid())[1]


@contextlib.contextmanager
def answering(reply: Callable[[socket.socket], None]) -> Iterator[list[object]]:
    """A one-connection daemon on the shim's socket that reads the request whole (its
    bytes and descriptors, kept in the list yielded) and then calls ``reply``."""
    got: list[object] = []
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(the_path())
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            fds: list[int] = []
            data = daemon._receive(conn, fds)
            got.extend([data, fds])
            reply(conn)
            for fd in fds:
                os.close(fd)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        thread.join(10)
        listener.close()


def test_a_served_call_returns_the_daemons_exit_code(sockets: Path) -> None:
    with answering(lambda conn: conn.sendall(b"=000")) as got:
        assert shimclient.ask(["neuronx-cc", "compile", "x.pb"]) == (0, None)
    data, fds = got
    assert isinstance(data, bytes)
    assert isinstance(fds, list)
    assert len(fds) == 2
    request = daemon.parse_request(data)
    assert request is not None
    assert request.argv == ["neuronx-cc", "compile", "x.pb"]
    assert request.cwd == os.getcwd()
    assert request.named == shimclient.named()
    assert request.named[-len(sys.path) :] == sys.path
    assert request.environ["NEFFCACHE_DAEMON_DIR"] == str(sockets)
    assert shimclient.namespaces()[0] in request.named
    assert all(n.startswith(("mnt:[", "net:[")) for n in shimclient.namespaces())
    assert request.pid == os.getpid()


@pytest.mark.parametrize(
    "reply",
    [b"-", b"", b"=1", b"?000", b"=abc"],
    ids=["declined", "closed", "short", "unknown", "not-a-number"],
)
def test_anything_but_a_served_answer_is_served_by_the_shim_itself(
    sockets: Path, reply: bytes
) -> None:
    with answering(lambda conn: conn.sendall(reply)):
        assert shimclient.ask(["neuronx-cc", "compile", "x.pb"]) == (None, None)


def test_no_daemon_asks_for_one_to_be_started(sockets: Path) -> None:
    assert shimclient.ask(["neuronx-cc"]) == (None, the_path())
    Path(the_path()).touch()  # a dead daemon's socket: refused
    assert shimclient.ask(["neuronx-cc"]) == (None, the_path())


def test_a_missing_directory_asks_for_one_to_be_started(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEFFCACHE_DAEMON_DIR", str(sockets / "later"))
    assert shimclient.ask(["neuronx-cc"]) == (None, the_path())


@pytest.mark.parametrize(
    "setting",
    [
        {"NEFFCACHE_DAEMON": "0"},
        {"NEFFCACHE_DAEMON": "off"},
        {"NEFFCACHE_IN_WRAPPER": "1"},
        {"NEFFCACHE_DAEMON_DIR": "/tmp/" + "d" * 120},
    ],
    ids=["off", "off-word", "the-wrappers-compiler", "too-long-for-a-socket"],
)
def test_no_daemon_asked_nor_started(
    sockets: Path, monkeypatch: pytest.MonkeyPatch, setting: dict[str, str]
) -> None:
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert shimclient.ask(["neuronx-cc"]) == (None, None)


def test_a_directory_others_can_write_is_neither_used_nor_started_in(sockets: Path) -> None:
    sockets.chmod(0o755)
    assert shimclient.ask(["neuronx-cc"]) == (None, None)


# -- the daemon's side ------------------------------------------------------------------


def good_request(**change: object) -> tuple[object, ...]:
    fields: dict[str, object] = {
        "protocol": shimclient.PROTOCOL,
        "argv": ["neuronx-cc"],
        "cwd": "/",
        "environ": {"A": "b"},
        "umask": 0o022,
        "named": ["/usr/bin/python3", "mnt:[1]"],
        "pid": 7,
    }
    fields.update(change)
    return tuple(fields.values())


def test_a_request_parses() -> None:
    import marshal

    request = daemon.parse_request(marshal.dumps(good_request()))
    assert request == daemon.Request(
        ["neuronx-cc"], "/", {"A": "b"}, 0o022, ["/usr/bin/python3", "mnt:[1]"], 7
    )


@pytest.mark.parametrize(
    "fields",
    [
        good_request(protocol=shimclient.PROTOCOL + 1),
        good_request(argv=[]),
        good_request(argv=["neuronx-cc", 3]),
        good_request(environ={"A": 1}),
        good_request(umask=0o1000),
        good_request(umask=True),
        good_request(named="/x"),
        good_request(named=[b"/x"]),
        good_request(cwd=None),
        good_request()[:6],
    ],
    ids=[
        "protocol",
        "no-argv",
        "argv-type",
        "environ-type",
        "umask-range",
        "umask-bool",
        "named-type",
        "named-bytes",
        "cwd-type",
        "short",
    ],
)
def test_anything_else_is_declined(fields: tuple[object, ...]) -> None:
    import marshal

    assert daemon.parse_request(marshal.dumps(fields)) is None


def test_bytes_that_are_not_a_request_are_declined() -> None:
    assert daemon.parse_request(b"\x00not marshal") is None
    assert daemon.parse_request(b"") is None


def test_a_changed_file_of_its_own_code_is_seen(tmp_path: Path) -> None:
    code = tmp_path / "module.py"
    code.write_text("one")
    stamp = daemon.CodeStamp([str(code)], every=0)
    assert not stamp.changed()
    code.write_text("two")  # another size
    assert stamp.changed()
    code.unlink()
    assert stamp.changed()


def test_the_code_is_looked_at_once_a_second_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "module.py"
    code.write_text("one")
    now = [100.0]
    monkeypatch.setattr(daemon.time, "monotonic", lambda: now[0])
    stamp = daemon.CodeStamp([str(code)], every=1.0)
    assert not stamp.changed()
    code.write_text("two")
    assert not stamp.changed()  # looked at 0 s ago
    now[0] += 1.0
    assert stamp.changed()


def test_the_code_is_every_module_a_hit_may_run_loaded_or_not() -> None:
    import neffcache.client.wrapper
    import neffcache.keying

    stamp = daemon.CodeStamp.of_packages(daemon.HIT_PACKAGES)
    keying = Path(neffcache.keying.__file__).parent
    expected = {sys.executable, neffcache.client.wrapper.__file__, str(keying / "_canonical.py")}
    assert expected <= set(stamp._seen)
    assert str(Path(neffcache.client.wrapper.__file__).parent / "compiler.py") in stamp._seen
    assert not stamp.changed()


def a_request() -> bytes:
    import marshal

    request = (shimclient.PROTOCOL, ["neuronx-cc"], "/", {}, 0o022, shimclient.named(), 1)
    return marshal.dumps(request)


@pytest.mark.parametrize("other", ["getuid", "getegid"], ids=["user", "group"])
def test_another_users_or_groups_process_is_never_served(
    monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    called: list[object] = []
    real = getattr(os, other)
    monkeypatch.setattr(daemon.os, other, lambda: real() + 1)
    with left, right:
        socket.send_fds(right, [a_request()], [1, 2])
        right.shutdown(socket.SHUT_WR)
        daemon._answer(left, lambda argv, wanted: called.append(argv) or 0)
        left.shutdown(socket.SHUT_WR)
        assert right.recv(16) == b".-", "another user's or group's call was not declined"
    assert called == []


def test_the_same_users_request_is_served_and_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    monkeypatch.setattr(daemon, "_serve", lambda request, fds, hit: hit(request.argv))
    monkeypatch.setattr(daemon, "_after_hit", lambda: None)
    with left, right:
        socket.send_fds(right, [a_request()], [1, 2])
        right.shutdown(socket.SHUT_WR)
        daemon._answer(left, lambda argv, wanted: 0 if wanted() else None)
        left.shutdown(socket.SHUT_WR)
        assert right.recv(16) == b".=000"


def test_a_request_cut_short_closes_the_callers_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The descriptors came, the rest of the request never does: they are closed, or
    the caller's reader would wait for an end of file as long as the worker lives."""
    monkeypatch.setattr(daemon, "_READ_TIMEOUT", 0.05)
    left, right = socket.socketpair(socket.AF_UNIX)
    out_r, out_w = os.pipe()
    with left, right:
        socket.send_fds(right, [b"part of a request"], [out_w])  # no end: never shut
        os.close(out_w)
        daemon._answer(left, lambda argv, wanted: 0)
    os.set_blocking(out_r, False)
    try:
        assert os.read(out_r, 1) == b"", "the caller's stream is still held open"
    finally:
        os.close(out_r)


def test_a_served_request_writes_to_the_callers_streams_and_restores_its_own(
    tmp_path: Path,
) -> None:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    before = os.fstat(2).st_ino, os.getcwd()

    def serve_hit(argv: list[str]) -> int | None:
        # At the descriptor: pytest's capture stands in for this process's sys.stderr.
        os.write(2, f"said in {os.getcwd()} with {os.environ['ONLY']}\n".encode())
        return 0

    request = daemon.Request(["neuronx-cc"], str(tmp_path), {"ONLY": "this"}, 0o027, [], 1)
    saved = dict(os.environ)
    try:
        assert daemon._serve(request, [out_w, err_w], serve_hit) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(before[1])
    os.close(out_w)
    os.close(err_w)
    with os.fdopen(err_r) as err, os.fdopen(out_r) as out:
        assert err.read() == f"said in {tmp_path} with this\n"
        assert out.read() == ""
    assert os.fstat(2).st_ino == before[0], "the daemon's own stderr was not restored"


def test_a_failing_request_is_declined() -> None:
    def broken(argv: list[str]) -> int | None:
        raise RuntimeError("the daemon's bug")

    request = daemon.Request(["neuronx-cc"], "/", dict(os.environ), 0o022, [], 1)
    saved, cwd = dict(os.environ), os.getcwd()
    r, w = os.pipe()
    try:
        assert daemon._serve(request, [w, w], broken) is None
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(cwd)
        os.close(w)
        os.close(r)


# -- starting one ------------------------------------------------------------------------


def test_nothing_is_started_without_a_neffcache_url(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NEFFCACHE_URL", "NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert daemon.start_for(the_path(), sys.path) is False
    assert list(sockets.iterdir()) == []


def test_nothing_is_started_while_the_lock_is_held_or_soon_after_a_start(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEFFCACHE_URL", "neffcache+http://127.0.0.1:9/ns")
    started: list[object] = []
    monkeypatch.setattr("subprocess.Popen", lambda *a, **k: started.append(a))
    lock = os.open(f"{the_path()}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert daemon.start_for(the_path(), sys.path) is False  # a daemon holds it
        fcntl.flock(lock, fcntl.LOCK_UN)
        assert daemon.start_for(the_path(), sys.path) is True
        assert daemon.start_for(the_path(), sys.path) is False  # started moments ago
    finally:
        os.close(lock)
    assert len(started) == 1


def test_a_child_a_worker_forks_does_not_hold_its_listening_socket() -> None:
    # The child that sends a hit's events may outlive the workers: holding the socket,
    # it would keep it accepting connections that no one answers.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    kept = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    read, write = os.pipe()
    try:
        daemon._not_in_children(listener)
        pid = os.fork()
        if pid == 0:  # the child: say which of the two it still holds, and leave
            os.write(write, b"%d %d" % (listener.fileno(), kept.fileno()))
            os._exit(0)
        os.waitpid(pid, 0)
        closed, open_ = (int(n) for n in os.read(read, 64).split())
    finally:
        for fd in (read, write):
            os.close(fd)
        listener.close()
        kept.close()
    assert closed == -1
    assert open_ >= 0
