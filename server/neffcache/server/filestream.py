"""A verified blob's file above 16 MiB, sent by the HTTP protocol itself (immediate.py)
with ``sendfile`` and flow control.

Why: streamed the usual way, a large blob passes through Python in 1 MiB reads and
writes, where nginx sends its file with ``sendfile``; on one connection that was
0.83-0.93x nginx's bytes per second (docs/benchmarks.md). Here the file goes from the
page cache to the socket with ``os.sendfile`` while the socket takes it. When the socket
is full, a few of the file's bytes (a probe, 16 KiB) are written through the transport
instead: the transport holds them until the socket takes them, and with its write
buffer's limits at zero it calls ``resume_writing`` the moment they are all gone, which
is when the socket has room again and ``sendfile`` goes on. Bytes sent directly never
overtake bytes the transport holds: the file goes to the socket only while the
transport holds nothing. This is how nginx sends a file (``sendfile`` until the socket
is full, then wait until it is writable), with the transport standing in for the wait.

Over TLS, or with no socket to send to, the file is read and written in 1 MiB chunks
as the usual way writes them, each when uvicorn's flow control has room.

As for a smaller file, the last 64 KiB are read and the file's stamp checked before
they are written: a file that changed while it was sent (or turned out shorter) cuts
the answer off and is forgotten as verified, so its next read hashes it again.

While the file is sent, ``Sending`` stands in for uvicorn's request cycle: a request
pipelined behind it waits in uvicorn's queue, a shutdown ends the connection once the
file is sent, and no head timer runs (connections.py), as for a blob streamed the usual
way. The blob is touched as it goes, so the evictor leaves it alone (blobuse.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Protocol

from neffcache.server.services.blobs import Opened

# The last bytes of a file sent from it: read, and its stamp checked, before they go.
LAST = 64 * 1024
# Written through the transport when the socket is full: it says when there is room.
# Small, as it passes through Python; not below what connections.py holds for a turn.
_PROBE = 16 * 1024
# Without sendfile (TLS), what each write carries, as the usual way's reads.
_CHUNK = 1024 * 1024


class _Flow(Protocol):
    """uvicorn's flow control, as far as it is read here."""

    write_paused: bool


class _Unwaited:
    """The request cycle's event, which nothing waits on for a file being sent."""

    def set(self) -> None:
        pass


class Sending:
    """What stands in for uvicorn's request cycle while a file is sent: uvicorn reads
    ``response_complete`` (a request pipelined behind an incomplete one is queued) and
    sets ``keep_alive`` (False on shutdown), ``disconnected`` and ``message_event``."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.message_event = _Unwaited()


class FileStream:
    """One file being sent on one connection: ``start()`` writes the head and as much
    of the file as the socket takes; the protocol calls ``pump()`` from its
    ``resume_writing`` and ``stop()`` from ``connection_lost``. ``ended()`` is called
    once, when the last byte is written or the answer is cut off (the transport then
    aborted)."""

    def __init__(
        self,
        transport: asyncio.Transport,
        flow: _Flow,
        opened: Opened,
        keep_alive: bool,
        ended: Callable[[FileStream], None],
    ) -> None:
        self.cycle = Sending(keep_alive)
        self._transport, self._flow, self._opened = transport, flow, opened
        self._ended = ended
        self._fd = opened.file.fileno()
        self._size = opened.file.size
        self._sent = 0
        self._done = False
        self._socket = raw_socket(transport)
        self._limits = transport.get_write_buffer_limits()  # (low, high), put back at the end

    def start(self, head: bytes) -> None:
        if self._socket is not None:
            # Told when the transport holds nothing more, not when it holds a little.
            self._transport.set_write_buffer_limits(high=0, low=0)
        self._transport.writelines([head])  # now: the file's bytes follow it
        self.pump()

    def pump(self) -> None:
        """Send what the socket takes now; the rest when the transport has room again."""
        try:
            while not self._done and not self._flow.write_paused:
                if self._transport.is_closing():
                    self.stop()
                elif self._sent < self._size - LAST:
                    self._step(self._size - LAST)
                else:
                    self._last()
        except OSError:  # the peer went away, or the file could not be read
            self._cut_off(changed=False)

    def stop(self) -> None:
        """The connection is gone: the file is closed, nothing more is sent."""
        if not self._done:
            self._finish()

    def _step(self, end: int) -> None:
        """The file's bytes up to ``end``: with ``sendfile`` until the socket is full,
        then a probe written through the transport, which waits for room."""
        if self._socket is not None and self._transport.get_write_buffer_size() == 0:
            self._sent = send_file(self._socket, self._fd, self._sent, end)
            self._opened.touch()
            if self._sent == end:
                return
        size = min(end - self._sent, _PROBE if self._socket is not None else _CHUNK)
        data = os.pread(self._fd, size, self._sent)
        if len(data) != size:
            self._cut_off(changed=True)  # the file is shorter than it was
            return
        self._sent += size
        self._opened.touch()
        self._transport.write(data)

    def _last(self) -> None:
        data = os.pread(self._fd, self._size - self._sent, self._sent)
        if len(data) != self._size - self._sent or not self._opened.unchanged():
            self._cut_off(changed=True)
            return
        self._transport.write(data)
        self._sent = self._size
        self._finish()

    def _cut_off(self, changed: bool) -> None:
        if changed:
            self._opened.changed()  # forgotten as verified, and logged
        self._transport.abort()
        self._finish()

    def _restore(self) -> None:
        if self._socket is not None and not self._transport.is_closing():
            low, high = self._limits
            self._transport.set_write_buffer_limits(high=high, low=low)

    def _finish(self) -> None:
        self._done = True
        self._opened.file.close()
        self._restore()
        self.cycle.response_complete = True
        self._ended(self)


def raw_socket(transport: asyncio.BaseTransport) -> int | None:
    """The descriptor a file may be sent to with ``sendfile``; None over TLS, where the
    socket carries records and the file goes through the transport, or with no socket."""
    if transport.get_extra_info("sslcontext") is not None:
        return None
    socket = transport.get_extra_info("socket")
    return None if socket is None else int(socket.fileno())


def send_file(socket: int, file: int, start: int, end: int) -> int:
    """Bytes ``start`` to ``end`` of ``file`` sent to the non-blocking ``socket``, all
    or as many as it took before it was full (or the file ended); where they stopped."""
    sent = start
    while sent < end:
        try:
            count = os.sendfile(socket, file, sent, end - sent)
        except BlockingIOError:
            break
        if count == 0:
            break
        sent += count
    return sent
