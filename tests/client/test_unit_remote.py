"""Unit tests for ``neffcache.client.remote.Remote``: against a real ``neffcache serve``
(misses, round trips), against a scripted in-test HTTP server (wrong bytes, 5xx),
whose request counter shows when the client did not touch the network, and against a
server that takes tokens (refused tokens: 401, 403), whose requests are counted too."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from loopback import free_port
from support.client_units import TokenServer, delta, digest, no_server_down
from support.e2e import Server
from support.http_stubs import ScriptedServer, scripted

from neffcache.client import remote as remote_module
from neffcache.client.config import ClientConfig
from neffcache.client.reasons import Explanation, Prepared
from neffcache.client.remote import Remote
from neffcache.client.stats import STATS

REPO = Path(__file__).resolve().parents[2]
NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]


def config_for(
    server: str, local_dir: Path, *, backoff: float = 60.0, timeout: float = 5.0, **extra: str
) -> ClientConfig:
    env = {
        "NEFFCACHE_URL": f"neffcache+{server}/team-a",
        "NEFFCACHE_LOCAL_DIR": str(local_dir),
        "NEFFCACHE_BACKOFF": str(backoff),
        "NEFFCACHE_TIMEOUT": str(timeout),
        "NEFFCACHE_CONNECT_TIMEOUT": "1",
        **extra,
    }
    config = ClientConfig.from_env(env)
    assert config is not None
    return config


@contextlib.contextmanager
def open_remote(config: ClientConfig) -> Iterator[Remote]:
    remote = Remote(config)
    try:
        yield remote
    finally:
        remote.close()


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    no_server_down(monkeypatch)


# --- a real server --------------------------------------------------------------------


@pytest.fixture
def real_server(server: Server) -> str:
    """The session's ``neffcache serve`` (tests/client/conftest.py)."""
    return server.url


@pytest.mark.e2e
def test_entry_and_alias_misses_are_none(real_server: str, tmp_path: Path) -> None:
    before = STATS.snapshot()
    with open_remote(config_for(real_server, tmp_path)) as remote:
        assert remote.entry("a" * 64) is None
        assert remote.alias("b" * 64) is None
        assert remote.alias("neuronxcc-2.20.9961.0+0acef03a/MODULE_123+abcdef01") is None
        assert remote.available()  # a miss is not trouble
    assert delta(before, "server_errors") == 0


@pytest.mark.e2e
def test_blob_round_trip_and_entry(real_server: str, tmp_path: Path) -> None:
    data = os.urandom(50_000)
    source = tmp_path / "neff"
    source.write_bytes(data)
    key = os.urandom(32).hex()
    with open_remote(config_for(real_server, tmp_path)) as remote:
        assert remote.missing([digest(data)]) == [digest(data)]
        assert remote.put_blob(digest(data), source)
        assert remote.missing([digest(data)]) == []
        manifest = {"key": key, "files": {"model.neff": {"digest": digest(data), "size": 50_000}}}
        response = remote.put_entry(key, manifest)
        assert response is not None
        assert response.status == 201
        found = remote.entry(key)
        assert found is not None
        assert found["files"] == manifest["files"]
        dest = tmp_path / "l1" / "blob"
        assert remote.fetch(digest(data), len(data), dest)
    assert dest.read_bytes() == data
    assert [p.name for p in dest.parent.iterdir()] == ["blob"]


@pytest.mark.e2e
def test_put_blob_of_a_missing_file_is_false(real_server: str, tmp_path: Path) -> None:
    before = STATS.snapshot()
    with open_remote(config_for(real_server, tmp_path)) as remote:
        assert not remote.put_blob("c" * 64, tmp_path / "absent")
        assert remote.available()
    assert delta(before, "local_errors") == 1


@pytest.mark.e2e
def test_fetch_of_an_absent_large_blob_is_false_and_not_trouble(
    real_server: str, tmp_path: Path
) -> None:
    dest = tmp_path / "l1" / "blob"
    with open_remote(config_for(real_server, tmp_path)) as remote:
        assert not remote.fetch("d" * 64, 10_000, dest)
        assert remote.available()
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []


@pytest.mark.e2e
def test_fetch_of_an_absent_small_blob_does_not_mark_the_server_down(
    real_server: str, tmp_path: Path
) -> None:
    with open_remote(config_for(real_server, tmp_path)) as remote:
        assert not remote.fetch("e" * 64, 16, tmp_path / "l1" / "blob")
        assert remote.available()


# --- a scripted server ----------------------------------------------------------------

Route = Callable[[str], tuple[int, bytes]]


def fake_server(route: Route) -> contextlib.AbstractContextManager[ScriptedServer]:
    """A scripted server that answers by path alone."""
    return scripted(lambda _method, path: route(path))


def test_fetch_verifies_the_digest(tmp_path: Path) -> None:
    served = os.urandom(4096)
    wanted = digest(b"the bytes the manifest promised")
    dest = tmp_path / "l1" / "blobs" / wanted[:2] / wanted
    before = STATS.snapshot()
    with (
        fake_server(lambda path: (200, served)) as server,
        open_remote(config_for(server.url, tmp_path)) as remote,
    ):
        assert not remote.fetch(wanted, len(served), dest)
        # Whole and wrong: reported, for the server to verify its copy again.
        assert server.paths == [f"/v1/blobs/{wanted}", f"/v1/blobs/{wanted}/mismatch"]
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # no temporary file left behind
    assert delta(before, "bad_downloads") == 1


def test_fetch_of_a_longer_blob_stops_and_leaves_nothing(tmp_path: Path) -> None:
    served = os.urandom(4096)
    dest = tmp_path / "l1" / "blob"
    with (
        fake_server(lambda path: (200, served)) as server,
        open_remote(config_for(server.url, tmp_path)) as remote,
    ):
        assert not remote.fetch(digest(served), 100, dest)
    assert list(dest.parent.iterdir()) == []


def test_fetch_of_a_shorter_blob_is_false(tmp_path: Path) -> None:
    served = os.urandom(100)
    dest = tmp_path / "l1" / "blob"
    with (
        fake_server(lambda path: (200, served)) as server,
        open_remote(config_for(server.url, tmp_path)) as remote,
    ):
        assert not remote.fetch(digest(served), 4096, dest)
    assert list(dest.parent.iterdir()) == []


def test_fetch_of_the_right_bytes(tmp_path: Path) -> None:
    served = os.urandom(4096)
    dest = tmp_path / "l1" / "blob"
    with (
        fake_server(lambda path: (200, served)) as server,
        open_remote(config_for(server.url, tmp_path)) as remote,
    ):
        assert remote.fetch(digest(served), len(served), dest)
    assert dest.read_bytes() == served


def test_fetch_into_an_unwritable_l1_is_false(tmp_path: Path) -> None:
    served = os.urandom(100)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    before = STATS.snapshot()
    with (
        fake_server(lambda path: (200, served)) as server,
        open_remote(config_for(server.url, tmp_path)) as remote,
    ):
        assert not remote.fetch(digest(served), len(served), blocker / "blobs" / "x")
    assert delta(before, "local_errors") == 1


def test_a_garbled_answer_is_none_not_an_exception(tmp_path: Path) -> None:
    def handler(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n{}")
        conn.close()

    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=lambda: handler(listener.accept()[0]), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with open_remote(config_for(url, tmp_path)) as remote:
            assert remote.entry("a" * 64) is None
            assert not remote.available()
    finally:
        listener.close()


def test_a_5xx_marks_the_server_down_for_the_backoff(tmp_path: Path) -> None:
    before = STATS.snapshot()
    backoff = 0.6
    with (
        fake_server(lambda path: (503, b'{"detail": "busy"}')) as server,
        open_remote(config_for(server.url, tmp_path, backoff=backoff)) as remote,
    ):
        marked = time.monotonic()
        assert remote.entry("a" * 64) is None
        assert server.hits == 1
        assert not remote.available()
        # Down: every call answers at once, without the network.
        assert remote.entry("a" * 64) is None
        assert remote.alias("b" * 64) is None
        assert remote.missing(["c" * 64]) is None
        assert not remote.fetch("c" * 64, 10, tmp_path / "blob")
        assert not remote.put_failure("a" * 64, {"compiler_version": "x"})
        assert server.hits == 1
        assert delta(before, "server_errors") == 1
        assert delta(before, "server_skipped") == 5
        # Another Remote for the same server in this process sees it down too.
        with open_remote(config_for(server.url, tmp_path, backoff=backoff)) as other:
            assert other.entry("a" * 64) is None
        assert server.hits == 1
        time.sleep(max(0.0, marked + backoff + 0.05 - time.monotonic()))
        assert remote.available()
        assert remote.entry("a" * 64) is None
        assert server.hits == 2  # the back-off expired: asked again


def test_a_refused_connection_marks_the_server_down(tmp_path: Path) -> None:
    before = STATS.snapshot()
    url = f"http://127.0.0.1:{free_port()}"
    # Timeouts of a minute: waiting one out would take that long, a refusal a
    # millisecond (the bound below is only far from both).
    slow = config_for(url, tmp_path, timeout=60.0, NEFFCACHE_CONNECT_TIMEOUT="60")
    with open_remote(slow) as remote:
        start = time.monotonic()
        assert remote.entry("a" * 64) is None
        assert time.monotonic() - start < 30
        assert not remote.available()
    assert delta(before, "server_errors") == 1


def test_an_answer_that_is_not_json_marks_the_server_down(tmp_path: Path) -> None:
    with (
        fake_server(lambda path: (200, b"<html>proxy login</html>")) as server,
        open_remote(config_for(server.url, tmp_path)) as remote,
    ):
        assert remote.entry("a" * 64) is None
        assert not remote.available()


def test_a_json_answer_that_is_not_an_object_is_a_miss(tmp_path: Path) -> None:
    with (
        fake_server(lambda path: (200, b"[1, 2]")) as server,
        open_remote(config_for(server.url, tmp_path)) as remote,
    ):
        assert remote.entry("a" * 64) is None
        assert remote.available()


# --- a server that refuses the token (tests/client/conftest.py's token_server) ---------


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _lapse(tmp_path: Path) -> None:
    """The back-off runs out, here and in L1 (without waiting for it)."""
    remote_module._down_until.clear()
    shutil.rmtree(tmp_path / ".neffcache" / "down", ignore_errors=True)


def test_a_read_only_token_reads_on_and_says_once_that_it_does_not_publish(
    token_server: TokenServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_for(token_server.url, tmp_path, NEFFCACHE_TOKEN=token_server.tokens["read"])
    seen = token_server.requests
    before = STATS.snapshot()
    with open_remote(config) as remote:
        assert remote.lease("a" * 64, 0.0, "h") is None  # 403: leases need write scope
        asked = len(seen)
        # Writes are skipped now, without a request: a publish, a failure report, a lease.
        assert remote.missing(["b" * 64]) is None
        assert remote.put_entry("a" * 64, {"key": "a" * 64}) is None
        assert not remote.put_failure("a" * 64, {"compiler_version": "x"})
        assert remote.lease("c" * 64, 0.0, "h") is None
        assert len(seen) == asked
        # Reads go on.
        assert remote.available()
        assert remote.entry("a" * 64) is None
        assert len(seen) == asked + 1
        # Once per process: a back-off later, refused again, not said again.
        _lapse(tmp_path)
        assert remote.lease("d" * 64, 0.0, "h") is None
        assert len(seen) == asked + 2
    assert _said(caplog) == [
        "neffcache: this token is read-only (namespace team-a): compiles are not published "
        "(HTTP 403: this needs a write token; yours is read); a token with write scope on "
        "team-a publishes them"
    ]
    assert delta(before, "auth_errors") == 2
    assert delta(before, "writes_skipped") == 4


@pytest.mark.parametrize(
    ("token", "code", "words"),
    [
        ("other", "forbidden", "the token may not read namespace team-a on"),
        ("unknown", "unauthorized", "does not know NEFFCACHE_TOKEN"),
        (None, "unauthorized", "needs a token to read namespace team-a"),
    ],
)
def test_a_refused_token_backs_off_is_said_once_and_is_the_miss_reason(
    token_server: TokenServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    token: str | None,
    code: str,
    words: str,
) -> None:
    extra = {"NEFFCACHE_TOKEN": token_server.tokens[token]} if token else {}
    config = config_for(token_server.url, tmp_path, **extra)
    seen = token_server.requests
    start = len(seen)
    with open_remote(config) as remote:
        assert remote.alias("a" * 64) is None
        assert not remote.available()
        assert remote.refusal() == code
        # Skipped like a server that is down: lookups, downloads, explanations.
        assert remote.entry("a" * 64) is None
        assert not remote.fetch("c" * 64, 10, tmp_path / "blob")
        explained = Explanation(remote, lambda: Prepared("a" * 64, None, {}))
        assert explained.result(wait=30) == (code, None)
        assert len(seen) == start + 1
    # The shim's next process has only L1's mark, which says why.
    remote_module._down_until.clear()
    remote_module._refusals.clear()
    with open_remote(config) as later:
        assert later.refusal() == code
        assert later.entry("a" * 64) is None
        # Once per process: a back-off later, refused again, not said again.
        _lapse(tmp_path)
        assert later.entry("a" * 64) is None
    assert len(seen) == start + 2
    (line,) = _said(caplog)
    assert line.startswith("neffcache: "), line
    assert words in line
    assert "team-a" in line
    assert f"HTTP {403 if code == 'forbidden' else 401}: " in line
    assert "skipped for 60 s at a time" in line


def test_token_and_paths(tmp_path: Path) -> None:
    with fake_server(lambda path: (404, b"{}")) as server:
        config = config_for(server.url, tmp_path, NEFFCACHE_TOKEN="s3cret")
        with open_remote(config) as remote:
            assert remote.entry("a" * 64) is None
            assert remote.alias("neuronxcc-2.20.9961.0+0acef03a/MODULE_1+abcdef01") is None
    assert server.auth == ["Bearer s3cret", "Bearer s3cret"]
    assert server.paths == [
        f"/v1/ns/team-a/entries/{'a' * 64}",
        "/v1/ns/team-a/aliases/neuronxcc-2.20.9961.0%2B0acef03a/MODULE_1%2Babcdef01",
    ]


def test_missing_tolerates_a_malformed_answer(tmp_path: Path) -> None:
    answers = iter([(200, json.dumps({"missing": ["a" * 64, 5]}).encode()), (200, b"{}")])
    with (
        fake_server(lambda path: next(answers)) as server,
        open_remote(config_for(server.url, tmp_path)) as remote,
    ):
        assert remote.missing(["a" * 64]) == ["a" * 64]
        assert remote.missing(["a" * 64]) is None
        assert remote.available()
