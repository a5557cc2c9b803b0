"""Connections that never finish a request head are closed, and open connections are
capped (connections.py): against `neffcache serve` configured through its settings, and
against uvicorn in a thread with each of its HTTP parsers, where the counts of the cap
can be read.

The tests wait for what the server does (a close, an answer) up to a generous
deadline; none of them times it.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import blake3
import httpx
import pytest
import uvicorn
from loopback import InThread
from support.served import Server
from uvicorn.server import ServerState

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.connections import ConnectionLimits
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

HEAD_TIMEOUT = 1.0  # a test sends each head at once; a stall this long is not expected
CAP = 20
HELD = 2 * CAP  # sockets a test holds open: bounded, and twice the cap
WAIT = 20.0  # how long a test waits for the server to close or answer
# ``serve`` is a `neffcache serve` process (end to end); the others, uvicorn in a thread.
KINDS = [pytest.param("serve", marks=pytest.mark.e2e), "httptools", "h11"]


class Target(NamedTuple):
    port: int
    url: str
    limits: ConnectionLimits | None  # None for `neffcache serve`, a process of its own


@contextlib.contextmanager
def running(kind: str, data_dir: Path, head_timeout: float) -> Iterator[Target]:
    if kind == "serve":
        env = {
            "NEFFCACHE_HEADER_TIMEOUT_SECONDS": str(head_timeout),
            "NEFFCACHE_MAX_CONNECTIONS": str(CAP),
        }
        process = Server(data_dir, env)
        process.start()
        try:
            yield Target(process.port, process.url, None)
        finally:
            process.kill()
        return
    limits = ConnectionLimits(CAP, head_timeout)
    blobs, index = MemoryBlobStore(), MemoryIndex()
    app = create_app(ServerSettings(data_dir=data_dir), blob_store=blobs, index=index)
    thread = InThread(app)
    thread.server.config.http = limits.protocol_class(kind)  # read when the server starts
    try:
        with thread as url:
            yield Target(int(url.rsplit(":", 1)[1]), url, limits)
    finally:
        blobs.close()
        index.close()


@pytest.fixture(scope="module", params=KINDS)
def quick(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    """A server with a short head timeout."""
    with running(request.param, tmp_path_factory.mktemp("quick"), HEAD_TIMEOUT) as target:
        yield target


@pytest.fixture(params=KINDS)
def capped(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """A server whose head timeout outlasts the test: only the cap closes anything."""
    with running(request.param, tmp_path, 600.0) as target:
        yield target


def connect(target: Target) -> socket.socket:
    return socket.create_connection(("127.0.0.1", target.port), timeout=WAIT)


def until_closed(sock: socket.socket) -> bytes:
    """What the server sent before it closed the connection (fails if it keeps it open
    for WAIT seconds)."""
    received = b""
    deadline = time.monotonic() + WAIT
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"the server kept the connection open for {WAIT} s")
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def response(sock: socket.socket) -> tuple[int, bytes]:
    """One response's status and body (Content-Length framed, as the app answers)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed inside a response head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(fields["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "closed inside a response body"
        body += chunk
    return int(lines[0].split(" ")[1]), body


def request(path: str, method: str = "GET", *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", *headers, "", ""]
    return "\r\n".join(lines).encode()


def closed(sock: socket.socket) -> bool:
    """Whether the server has closed this non-blocking socket (it sends nothing else)."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_a_silent_connection_is_closed(quick: Target) -> None:
    with connect(quick) as sock:
        assert until_closed(sock) == b""


def test_a_half_sent_head_is_closed(quick: Target) -> None:
    with connect(quick) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
        assert until_closed(sock) == b""


def test_a_head_sent_a_byte_at_a_time_is_closed(quick: Target) -> None:
    # Bytes that keep coming do not extend the wait: the head must be complete in time.
    with connect(quick) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        deadline = time.monotonic() + WAIT
        while not select.select([sock], [], [], 0.1)[0]:
            assert time.monotonic() < deadline, f"still open after {WAIT} s of trickling"
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"a")
        assert until_closed(sock) == b""


def test_a_kept_alive_connection_is_served_then_closed_when_a_head_stalls(
    quick: Target,
) -> None:
    body = b"a body that arrives well after the head timeout"
    digest = blake3.blake3(body).hexdigest()
    with connect(quick) as sock:
        sock.sendall(request(f"/v1/blobs/{digest}", "PUT", f"Content-Length: {len(body)}"))
        # Once its head is in, a request has all the time it needs: a head timer left
        # running would have closed the connection after one head timeout.
        time.sleep(3 * HEAD_TIMEOUT)
        sock.sendall(body)
        assert response(sock)[0] in (200, 201)
        sock.sendall(request("/healthz"))
        assert response(sock) == (200, b'{"status":"ok"}')
        # Half of the next head: uvicorn's keep-alive timer stops at its first byte.
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert until_closed(sock) == b""
    with connect(quick) as idle:
        idle.sendall(request("/healthz"))
        assert response(idle)[0] == 200
        assert until_closed(idle) == b""


def test_healthz_answers_while_twice_the_cap_of_idle_sockets_are_held(capped: Target) -> None:
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(connect(capped)) for _ in range(HELD)]
        answer = httpx.get(f"{capped.url}/healthz", timeout=WAIT, trust_env=False)
        assert answer.status_code == 200
        # The head timer cannot have closed them (it runs for 600 s): each connection
        # beyond the cap, /healthz's too, closed one that waited for a head.
        for sock in held:
            sock.setblocking(False)
        beyond = HELD - CAP + 1
        deadline = time.monotonic() + WAIT
        while sum(closed(sock) for sock in held) < beyond:
            assert time.monotonic() < deadline, f"fewer than {beyond} held sockets closed"
            time.sleep(0.05)
        if capped.limits is not None:
            assert capped.limits.peak == CAP
            assert capped.limits.evicted >= beyond
            assert capped.limits.refused == 0
            assert capped.limits.timed_out == 0


def test_a_connection_beyond_the_cap_is_closed_when_every_one_is_serving(
    capped: Target,
) -> None:
    # A request whose body has not come is being served, so it is not closed to make
    # room; the 100 Continue says its head is in and the app reads its body.
    upload = request(f"/v1/blobs/{'0' * 64}", "PUT", "Content-Length: 10", "Expect: 100-continue")
    with contextlib.ExitStack() as stack:
        for _ in range(CAP):
            busy = stack.enter_context(connect(capped))
            busy.sendall(upload)
            assert busy.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        with connect(capped) as extra:
            extra.sendall(request("/healthz", "GET", "Connection: close"))
            assert until_closed(extra) == b""
        if capped.limits is not None:
            assert capped.limits.peak == CAP
            assert capped.limits.refused == 1


def test_the_cap_leaves_an_eighth_of_the_descriptor_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limit = [1024]
    monkeypatch.setattr(resource, "getrlimit", lambda _: (limit[0], resource.RLIM_INFINITY))
    assert ConnectionLimits(4096, 10).max_connections == 1024 - 128
    assert ConnectionLimits(100, 10).max_connections == 100
    limit[0] = 256
    assert ConnectionLimits(4096, 10).max_connections == 256 - 64
    limit[0] = resource.RLIM_INFINITY
    assert ConnectionLimits(4096, 10).max_connections == 4096


# --- a slow reader of the last answer --------------------------------------------------


class Unsent(asyncio.Transport):
    """A transport whose unsent bytes the test sets; it records a close or an abort."""

    def __init__(self) -> None:
        super().__init__()
        self.unsent = 0
        self.ended: str | None = None

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def is_closing(self) -> bool:
        return self.ended is not None

    def close(self) -> None:
        self.ended = "closed"

    def abort(self) -> None:
        self.ended = "aborted"

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def test_the_head_timer_waits_again_for_a_peer_still_reading_the_last_answer() -> None:
    """An answer written whole (a blob up to 16 MiB) ends its request while it is still
    being sent; the head timer then runs. When it runs out with fewer bytes unsent than
    when it started, the peer is reading: it starts again. When nothing was taken in a
    whole wait, the connection is closed. The timer's end is called here directly."""

    async def run() -> None:
        limits = ConnectionLimits(CAP, HEAD_TIMEOUT)
        protocol_class = limits.protocol_class("httptools")
        config = uvicorn.Config(app=None, log_config=None, access_log=False)
        config.load()
        protocol: Any = protocol_class(  # type: ignore[call-arg]
            config=config, server_state=ServerState(), app_state={}
        )
        transport = Unsent()
        transport.unsent = 12 << 20  # the answer's bytes still buffered as the timer starts
        protocol.connection_made(transport)
        assert protocol._head_timer is not None
        transport.unsent = 5 << 20  # the peer took some
        protocol._head_late()
        assert transport.ended is None
        assert protocol._head_timer is not None, "started again"
        assert limits.timed_out == 0
        protocol._head_late()  # nothing taken since
        assert transport.ended == "aborted"
        assert limits.timed_out == 1

    asyncio.run(run())
