"""A large file sent by the HTTP protocol itself (server/filestream.py), on a real event
loop's transport over a socket pair (asyncio's and uvloop's): it arrives whole and in
order after its head through a socket that fills again and again, mostly by
``sendfile``, with the transport's limits put back; a file changed or shortened while it
is sent cuts the connection off and is forgotten as verified; a connection lost midway
closes the file; without a socket (TLS) the file goes through the transport."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from neffcache.server.blobs.fs import OpenBlob
from neffcache.server.filestream import FileStream
from neffcache.server.services.blobs import Opened

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: ...\r\n\r\n"
PROBE = 16 * 1024  # filestream.py's probe
DATA = bytes(range(241)) * (3 * 1024 * 1024 // 241)  # 3 MiB through a 64 KiB socket


def run(loop_kind: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Record:
    """What the stream told its file and its protocol."""

    def __init__(self, unchanged: bool = True) -> None:
        self.is_unchanged = unchanged
        self.changed = 0
        self.touched = 0
        self.ended: list[FileStream] = []
        self.file: OpenBlob | None = None

    def opened(self, path: Path) -> Opened:
        self.file = OpenBlob(path.open("rb"))
        return Opened(
            self.file,
            unchanged=lambda: self.is_unchanged,
            changed=self._changed,
            forget=self._changed,
            touch=self._touch,
        )

    def _changed(self) -> None:
        self.changed += 1

    def _touch(self) -> None:
        self.touched += 1

    def file_closed(self) -> bool:
        assert self.file is not None
        try:
            self.file.fileno()
        except ValueError:
            return True
        return False


class Flow:
    write_paused = False


class Carrier(asyncio.Protocol):
    """The protocol's part (immediate.py): the flow control uvicorn keeps, the stream
    pumped on ``resume_writing`` and stopped when the connection is lost."""

    def __init__(self) -> None:
        self.flow = Flow()
        self.stream: FileStream | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self.flow.write_paused = True

    def resume_writing(self) -> None:
        self.flow.write_paused = False
        if self.stream is not None:
            self.stream.pump()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.stop()
        if not self.lost.done():
            self.lost.set_result(None)


class Counted:
    """The transport, counting the bytes written through it; ``socketless``: it has no
    socket to give, as over TLS."""

    def __init__(self, inner: asyncio.Transport, socketless: bool = False) -> None:
        self._inner, self._socketless = inner, socketless
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self._inner.write(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.written += sum(map(len, parts))
        self._inner.writelines(parts)

    def get_extra_info(self, name: str, default: object = None) -> object:
        if self._socketless and name == "socket":
            return None
        return self._inner.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def connected(
    socketless: bool = False,
) -> tuple[Carrier, Counted, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, carrier = await loop.create_connection(Carrier, sock=ours)
    return carrier, Counted(transport, socketless), theirs


def start(
    carrier: Carrier,
    transport: Counted,
    record: Record,
    path: Path,
    meanwhile: Callable[[], object] = lambda: None,
) -> FileStream:
    """The file at ``path`` sent; ``meanwhile`` runs once it is open, before it is sent."""
    stream = FileStream(
        transport,  # type: ignore[arg-type]
        carrier.flow,
        record.opened(path),
        keep_alive=True,
        ended=record.ended.append,
    )
    meanwhile()
    carrier.stream = stream
    stream.start(HEAD)
    return stream


async def receive(theirs: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes, or fewer if the connection ends first."""
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < size:
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(theirs, 256 * 1024), 20)
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    return bytes(got)


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    path = tmp_path / "blob"
    path.write_bytes(DATA)
    return path


def test_the_file_arrives_whole_after_its_head_mostly_by_sendfile(
    loop_kind: str, stored: Path
) -> None:
    record = Record()

    async def main() -> None:
        carrier, transport, theirs = await connected()
        limits = transport.get_write_buffer_limits()
        stream = start(carrier, transport, record, stored)
        got = await receive(theirs, len(HEAD) + len(DATA))
        assert got == HEAD + DATA
        assert record.ended == [stream]
        assert stream.cycle.response_complete
        assert transport.get_write_buffer_limits() == limits, "the limits put back"
        # The socket filled many times; each time, only a probe went through Python.
        assert transport.written - len(HEAD) < len(DATA) // 4
        theirs.close()
        transport.close()

    run(loop_kind, main)
    assert record.changed == 0
    assert record.touched > 1
    assert record.file_closed()


def test_without_a_socket_the_file_goes_through_the_transport(loop_kind: str, stored: Path) -> None:
    record = Record()

    async def main() -> None:
        carrier, transport, theirs = await connected(socketless=True)
        start(carrier, transport, record, stored)
        assert await receive(theirs, len(HEAD) + len(DATA)) == HEAD + DATA
        assert transport.written == len(HEAD) + len(DATA)
        assert len(record.ended) == 1
        theirs.close()
        transport.close()

    run(loop_kind, main)
    assert record.file_closed()


def test_a_file_changed_while_it_is_sent_is_cut_off_and_forgotten(
    loop_kind: str, stored: Path
) -> None:
    record = Record(unchanged=False)

    async def main() -> None:
        carrier, transport, theirs = await connected()
        start(carrier, transport, record, stored)
        got = await receive(theirs, len(HEAD) + len(DATA))
        assert HEAD + DATA[: len(got) - len(HEAD)] == got, "what arrived is the file's start"
        assert len(got) < len(HEAD) + len(DATA), "its last bytes never sent"
        await asyncio.wait_for(carrier.lost, 20)
        theirs.close()

    run(loop_kind, main)
    assert record.changed == 1
    assert len(record.ended) == 1
    assert record.file_closed()


def test_a_file_shortened_while_it_is_sent_is_cut_off_and_forgotten(
    loop_kind: str, stored: Path
) -> None:
    record = Record()

    async def main() -> None:
        carrier, transport, theirs = await connected()
        # Shortened after it was opened at its full size.
        start(carrier, transport, record, stored, lambda: os.truncate(stored, len(DATA) // 2))
        got = await receive(theirs, len(HEAD) + len(DATA))
        assert len(got) <= len(HEAD) + len(DATA) // 2
        await asyncio.wait_for(carrier.lost, 20)
        theirs.close()

    run(loop_kind, main)
    # Stopped where the file ended, not walked through its missing half probe by probe.
    assert record.touched < len(DATA) // 2 // PROBE
    assert record.changed == 1
    assert len(record.ended) == 1
    assert record.file_closed()


def test_a_connection_lost_midway_closes_the_file(loop_kind: str, stored: Path) -> None:
    record = Record()

    async def main() -> None:
        carrier, transport, theirs = await connected()
        stream = start(carrier, transport, record, stored)
        assert len(await receive(theirs, 256 * 1024)) >= 256 * 1024
        assert not record.ended, "the socket filled: the file is still being sent"
        theirs.close()  # the peer goes away with most of the file unsent
        await asyncio.wait_for(carrier.lost, 20)
        assert record.ended == [stream]
        stream.pump()  # a late call does nothing
        assert record.ended == [stream]

    run(loop_kind, main)
    assert record.changed == 0, "a lost peer is not a changed file"
    assert record.file_closed()
