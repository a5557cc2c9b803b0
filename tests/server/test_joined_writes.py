"""The connection's transport sends a small answer's head and body in one write, holds
nothing large, and loses nothing held: a close sends it, the loop's next turn sends a
lone head, flow control counts it. Then uvicorn's own protocols (httptools and h11) under
the connection limits: each small answer on a kept-alive connection is one write."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from neffcache.server.connections import _HOLD_BELOW, ConnectionLimits, _JoinedWrites


class Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 8787) if name in ("sockname", "peername") else default


async def joined(*steps: str) -> tuple[Recorder, _JoinedWrites]:
    inner = Recorder()
    outer = _JoinedWrites(inner, asyncio.get_running_loop())
    for step in steps:
        if step == "turn":
            await asyncio.sleep(0)
        elif step == "close":
            outer.close()
        elif step == "abort":
            outer.abort()
        else:
            outer.write(step.encode())
    return inner, outer


def run(*steps: str) -> Recorder:
    return asyncio.run(joined(*steps))[0]


def test_a_head_and_its_body_leave_in_one_write() -> None:
    assert run("HEAD", "BODY").writes == [b"HEADBODY"]


def test_a_lone_head_leaves_on_the_loops_next_turn() -> None:
    assert run("HEAD", "turn").writes == [b"HEAD"]
    assert run("HEAD", "turn", "BODY", "turn").writes == [b"HEAD", b"BODY"]


def test_a_large_write_is_never_held() -> None:
    big = "x" * _HOLD_BELOW
    assert run(big).writes == [big.encode()]
    assert run("HEAD", big).writes == [b"HEAD" + big.encode()]


def test_close_sends_what_is_held_and_abort_drops_it() -> None:
    closed = run("HEAD", "close")
    assert closed.writes == [b"HEAD"]
    assert closed.closed
    aborted = run("HEAD", "abort", "turn")
    assert aborted.writes == []
    assert aborted.aborted


def test_the_write_buffer_counts_what_is_held() -> None:
    async def held_size() -> int:
        _, outer = await joined("HEAD")
        return outer.get_write_buffer_size()

    assert asyncio.run(held_size()) == 4


async def tiny_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


async def served(kind: str, requests: int) -> list[bytes]:
    """What uvicorn's protocol under the connection limits wrote to its transport for
    ``requests`` kept-alive requests, each answered before the next is sent."""
    config = uvicorn.Config(tiny_app, log_level="warning", lifespan="off")
    config.load()
    limits = ConnectionLimits(max_connections=8, header_timeout=30)
    protocol = limits.protocol_class(kind)(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}
    )
    transport = Recorder()
    protocol.connection_made(transport)
    for n in range(requests):
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(100):  # the answer's task, then the held write's turn
            if len(transport.writes) > n:
                break
            await asyncio.sleep(0)
    await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport.writes


@pytest.mark.parametrize("kind", ["httptools", "h11"])
def test_uvicorns_protocol_writes_each_small_answer_once(kind: str) -> None:
    writes = asyncio.run(served(kind, 3))
    assert len(writes) == 3, writes
    for write in writes:
        assert write.startswith(b"HTTP/1.1 200 OK\r\n")
        assert write.endswith(b"\r\n\r\nok")
