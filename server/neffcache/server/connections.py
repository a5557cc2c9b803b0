"""Connections that never finish a request head are closed, and open connections are
capped: uvicorn does neither.

Why: uvicorn arms its keep-alive timeout only after a response, and any byte cancels
it, so a connection that sends nothing, or half a request head, is kept for ever; and
``limit_concurrency`` answers 503 but still accepts and keeps every socket. Held
connections ran a server out of descriptors (about 20,000 sockets, the limit), and
then legitimate requests failed.

This lives in the HTTP protocol, not in the app: the app sees a connection only once
a request head has arrived, which is exactly what such a client withholds.
``ConnectionLimits.protocol_class()`` subclasses the uvicorn protocol ``http="auto"``
picks (httptools when installed, else h11) with two rules:

- **A head timer.** Armed when a connection opens and when a response ends with the
  request read whole (waiting for the next request on a kept-alive connection is
  waiting for its head, so this replaces uvicorn's keep-alive timeout), cancelled once
  a request head is complete. Bytes that arrive do not extend it: a head sent a byte
  at a time is closed too. No timer runs while a request is served (its body, the
  app's work, a long-poll): a body that trickles is not covered here. An answer
  written whole (up to 16 MiB) ends its request while it is still being sent: when
  the timer runs out with fewer of its bytes unsent than when it started, the peer
  is reading it slowly, and the timer starts again.
- **A cap on open connections.** A connection beyond it closes the one that has
  waited longest for a head (idle or stalled: what an attack holds, and what a client
  loses least by, since it reconnects), so ``/healthz`` still answers while the held
  ones wait for their timer. Only when every connection is serving a request is the
  new one closed at once, without a 503: a 503 would first need the request read,
  which is what the slot is for, and written unasked it is often lost to the reset
  that closing an unread socket sends. The client takes either as a miss.

The cost on the request path is one timer handle and one dict entry per request; no
task. Everything here runs on the event loop's thread.

A third change is for speed: **a response's head and body leave in one write.** uvicorn
writes the status line and headers as soon as the app starts its answer, then the body
in another write: two system calls and two TCP segments for every small answer, and on
loopback or a fast network the kernel's work for each segment (the receiver's side too,
on loopback) costs about as much as the Python that made it. The connection's transport
is wrapped so that a small write is held until the next one, which goes out joined to
it, or until the event loop's next turn, whichever is first; a large write is never
held, so a streamed blob is not buffered here.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import TYPE_CHECKING, ClassVar, cast

if TYPE_CHECKING:
    from neffcache.server.immediate import Answers

# uvicorn's logger: these are the server's events, next to its own "Exceeded
# concurrency limit."
_log = logging.getLogger("uvicorn.error")
_REPORT_EVERY = 60.0


# A write this small waits for the next one (a head for its body): answers of entries,
# errors and health checks leave in one segment. Larger ones go out at once.
_HOLD_BELOW = 16 * 1024


class _JoinedWrites(asyncio.Transport):
    """A transport that holds one small write until the next write (sent joined to it)
    or the event loop's next turn. Everything else is the wrapped transport's; a close
    sends what is held first, an abort drops it, and the write buffer's size counts it
    (uvicorn's flow control reads that)."""

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._inner = inner
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data or self._inner.is_closing():
            # Empty: h11 ends every answer with one; it would only cost a turn. Closing:
            # the peer is gone (a reset), and uvloop raises on a closed transport where
            # uvicorn marks only its latest request, not pipelined ones, disconnected.
            return
        held = self._held
        if held is not None:
            self._held = None
            self._inner.write(held + bytes(data))
        elif len(data) < _HOLD_BELOW and not self._inner.is_closing():
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._inner.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._inner.is_closing():
            self._inner.write(held)

    def writelines(self, list_of_data: object) -> None:
        self._flush()
        self._inner.writelines(list_of_data)  # type: ignore[arg-type]

    def close(self) -> None:
        self._flush()
        self._inner.close()

    def abort(self) -> None:
        self._held = None
        self._inner.abort()

    def write_eof(self) -> None:
        self._flush()
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._inner.get_extra_info(name, default)

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()


def descriptor_budget() -> int | None:
    """How many connections the descriptor limit allows: all but an eighth of the soft
    ``RLIMIT_NOFILE`` (at least 64), which stays for the server's own files and
    sockets (stores, the thread pool's open blobs, S3 and Redis pools). None when
    unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - max(64, soft // 8))


class ConnectionLimits:
    """The head timeout and the cap one server's connections share, and counts of what
    they did. ``max_connections`` is lowered to ``descriptor_budget()`` when that is
    smaller, since descriptors would run out first.

    >>> limits = ConnectionLimits(max_connections=20, header_timeout=0.5)
    >>> uvicorn.run(app, http=limits.protocol_class())  # doctest: +SKIP
    """

    def __init__(self, max_connections: int, header_timeout: float) -> None:
        budget = descriptor_budget()
        if budget is not None and budget < max_connections:
            _log.warning(
                "max_connections %d lowered to %d: the descriptor limit (ulimit -n) leaves no more",
                max_connections,
                budget,
            )
            max_connections = budget
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.open = 0  # connections holding a slot
        self.peak = 0  # the most that ever held one at once
        self.timed_out = 0  # closed by the head timer
        self.evicted = 0  # closed to make room for a new one
        self.refused = 0  # closed on arrival: every slot was serving a request
        # Connections whose head timer runs, the longest waiting first (dicts keep
        # insertion order; each one re-enters at the end when its timer is re-armed).
        self.waiting: dict[_Limited, None] = {}
        self._next_report = 0.0

    def protocol_class(
        self, http: str = "auto", answers: Answers | None = None
    ) -> type[asyncio.Protocol]:
        """uvicorn's ``http`` protocol (``auto``, ``httptools`` or ``h11``) under these
        limits, for ``uvicorn.run(http=...)``; with httptools, the lookups ``answers``
        takes are answered by the protocol itself (immediate.py)."""
        if http == "auto":
            try:
                import httptools  # noqa: F401
            except ImportError:
                http = "h11"
            else:
                http = "httptools"
        if http == "httptools":
            return _httptools_class(self, answers)
        if http == "h11":
            return _h11_class(self)
        raise ValueError(f"no connection limits for uvicorn's http={http!r}")

    def admit(self, connection: _Limited) -> bool:
        """Give a new connection a slot, closing the one waiting longest for a head if
        none is free; False when every slot is serving a request."""
        if self.open >= self.max_connections:
            if not self.waiting:
                self.refused += 1
                self._report()
                return False
            self.evicted += 1
            next(iter(self.waiting)).close_waiting()
            self._report()
        self.open += 1
        self.peak = max(self.peak, self.open)
        return True

    def _report(self) -> None:
        now = time.monotonic()
        if now >= self._next_report:
            self._next_report = now + _REPORT_EVERY
            _log.warning(
                "%d connections open (max_connections): so far %d waiting ones closed "
                "to make room, %d new ones refused, %d closed by the head timeout",
                self.open,
                self.evicted,
                self.refused,
                self.timed_out,
            )


class _Limited(asyncio.Protocol):
    """What both protocol classes add; ``_awaiting_head`` says, per parser, whether the
    connection waits for a request head."""

    limits: ClassVar[ConnectionLimits]
    # Set by uvicorn's protocol classes.
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    timeout_keep_alive_task: asyncio.TimerHandle | None
    ws_protocol_class: type[asyncio.Protocol] | None
    _head_timer: asyncio.TimerHandle | None = None
    _unsent = 0  # bytes of answers not yet sent when the head timer was armed
    _has_slot = False

    def _awaiting_head(self) -> bool:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvicorn's protocols take a stream transport here (uvloop's or asyncio's).
        super().connection_made(_JoinedWrites(cast(asyncio.Transport, transport), self.loop))
        # neffcache serves no WebSocket, and an upgraded connection would leave this
        # accounting (uvicorn hands its transport to another protocol).
        self.ws_protocol_class = None
        if self.limits.admit(self):
            self._has_slot = True
            self._sync_head_timer()
        else:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._sync_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._sync_head_timer()
        if self._head_timer is not None and self.timeout_keep_alive_task is not None:
            # The head timer covers the idle wait; uvicorn's would close it sooner.
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._release()

    def close_waiting(self) -> None:
        """Close this connection, which waits for a head: its time is up, or its slot
        is wanted."""
        self._release()
        if not self.transport.is_closing():
            # Bytes still unsent after a whole wait: the peer does not read either.
            if self.transport.get_write_buffer_size():
                self.transport.abort()
            else:
                self.transport.close()

    def _sync_head_timer(self) -> None:
        if not self._awaiting_head():
            if self._head_timer is not None:
                self._stop_head_timer()
        elif self._head_timer is None and self._has_slot and not self.transport.is_closing():
            self._arm_head_timer()
            self.limits.waiting[self] = None

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_late)
        self._unsent = self.transport.get_write_buffer_size()

    def _head_late(self) -> None:
        self._head_timer = None
        unsent = self.transport.get_write_buffer_size()
        if 0 < unsent < self._unsent and not self.transport.is_closing():
            # The peer is still reading the last answer (a blob up to 16 MiB is one
            # write, its request over once it is buffered): a slow reader, not an idle
            # connection. One that took nothing in a whole wait does not read at all.
            self._arm_head_timer()
            return
        self.limits.timed_out += 1
        self.close_waiting()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.limits.waiting.pop(self, None)

    def _release(self) -> None:
        self._stop_head_timer()
        if self._has_slot:
            self._has_slot = False
            self.limits.open -= 1


def _h11_class(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class LimitedH11(_Limited, H11Protocol):
        def _awaiting_head(self) -> bool:
            # h11 leaves IDLE at a complete head and returns to it only once the
            # request was read whole and answered (start_next_cycle).
            return self.conn.their_state is h11.IDLE

    LimitedH11.limits = limits
    return LimitedH11


def _httptools_class(limits: ConnectionLimits, answers: Answers | None) -> type[asyncio.Protocol]:
    from neffcache.server.immediate import ImmediateAnswers

    class LimitedHttpTools(_Limited, ImmediateAnswers):
        # Whether the latest request was read whole: uvicorn's own flag (more_body)
        # stays set when the answer went out before the body ended.
        _request_read = True

        def _awaiting_head(self) -> bool:
            cycle = self.cycle
            return cycle is None or (cycle.response_complete and self._request_read)

        def on_headers_complete(self) -> None:
            self._request_read = False
            # Now, not after the bytes are parsed: a lookup may be answered before
            # that (immediate.py), and its end must find the timer stopped to re-arm it.
            self._sync_head_timer()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._request_read = True
            super().on_message_complete()

    LimitedHttpTools.limits = limits
    LimitedHttpTools.answers = answers
    return LimitedHttpTools
