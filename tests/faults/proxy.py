"""A loopback TCP proxy that injects network faults between a client and a server
(imported as ``faults.proxy``).

Each accepted connection is paired with a fresh one to the upstream server and served
by one thread that moves bytes both ways (non-blocking sockets and ``select``, so no
thread ever blocks in a socket call that another closes). A ``Fault`` (set on the
proxy, read when a connection is accepted) says what happens on that connection once
``after`` bytes were forwarded in its ``direction`` (``up``: client to server,
``down``: server to client):

- ``pass``: nothing, every byte is forwarded;
- ``drop``: both sockets are closed (an orderly FIN each way);
- ``reset``: both sockets are closed with ``SO_LINGER`` 0, so each peer gets a RST;
- ``stall``: nothing more is forwarded either way and nothing is closed until the proxy
  stops (a peer gone silent, a black-holed route); ``after=0``: accepted, then nothing;

and ``delay`` seconds pass before each chunk read is forwarded (a slow link).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

Direction = Literal["up", "down"]
Action = Literal["pass", "drop", "reset", "stall"]

_DIRECTIONS: tuple[Direction, Direction] = ("up", "down")
_CHUNK = 64 * 1024
_TICK = 0.05  # seconds a link waits in select before looking at the stop flag


@dataclass(frozen=True)
class Fault:
    action: Action = "pass"
    direction: Direction = "up"
    after: int = 0  # bytes forwarded in ``direction`` before the fault strikes
    delay: float = 0.0  # seconds before each forwarded chunk

    def __str__(self) -> str:
        if self.action == "pass":
            return f"pass, delay {self.delay:g} s" if self.delay else "pass"
        return f"{self.action} {self.direction} after {self.after} B"


def _close(sock: socket.socket, reset: bool) -> None:
    with contextlib.suppress(OSError):
        if reset:
            # SO_LINGER on with a zero timeout: close() sends a RST at once.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and its upstream one, served by one thread."""

    def __init__(
        self,
        client: socket.socket,
        upstream: socket.socket,
        fault: Fault,
        totals: dict[Direction, int],
    ) -> None:
        self.totals = totals  # the proxy's, across links (each link adds its own)
        self.ends: dict[Direction, tuple[socket.socket, socket.socket]] = {
            "up": (client, upstream),
            "down": (upstream, client),
        }
        self.fault = fault
        self.sent: dict[Direction, int] = {"up": 0, "down": 0}

    def run(self, stop: threading.Event) -> None:
        client, upstream = self.ends["up"]
        for sock in (client, upstream):
            sock.setblocking(False)
        try:
            self._serve(stop)
        except OSError:
            # A peer reset or vanished: pass it on as a reset.
            for sock in (client, upstream):
                _close(sock, reset=True)

    def _room(self, direction: Direction) -> int | None:
        """Bytes that may still pass ``direction`` before the fault; None: no limit."""
        fault = self.fault
        if fault.action == "pass" or fault.direction != direction:
            return None
        return max(0, fault.after - self.sent[direction])

    def _serve(self, stop: threading.Event) -> None:
        pending: dict[Direction, bytearray] = {"up": bytearray(), "down": bytearray()}
        ended: dict[Direction, bool] = {"up": False, "down": False}
        client, upstream = self.ends["up"]
        while not stop.is_set():
            for direction in _DIRECTIONS:
                if self._room(direction) == 0 and not pending[direction]:
                    self._strike(stop)
                    return
            readers = [
                self.ends[d][0]
                for d in _DIRECTIONS
                if not ended[d] and len(pending[d]) < 4 * _CHUNK
            ]
            writers = [self.ends[d][1] for d in _DIRECTIONS if pending[d]]
            if not readers and not writers:
                break  # both sides ended and everything was passed on
            readable, writable, _ = select.select(readers, writers, [], _TICK)
            for direction in _DIRECTIONS:
                source, sink = self.ends[direction]
                if source in readable:
                    data = source.recv(_CHUNK)
                    if not data:
                        ended[direction] = True
                    elif self.fault.delay and stop.wait(self.fault.delay):
                        break
                    else:
                        pending[direction] += data
                room = self._room(direction)
                if sink in writable or (pending[direction] and room == 0):
                    chunk = pending[direction] if room is None else pending[direction][:room]
                    if chunk:
                        written = sink.send(chunk)
                        del pending[direction][:written]
                        self.sent[direction] += written
                        self.totals[direction] += written
                    if room is not None and self._room(direction) == 0:
                        pending[direction].clear()  # never forwarded: the fault strikes
                if ended[direction] and not pending[direction]:
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)  # pass the half-close on
        for sock in (client, upstream):
            _close(sock, reset=stop.is_set())

    def _strike(self, stop: threading.Event) -> None:
        client, upstream = self.ends["up"]
        action = self.fault.action
        if action == "stall":
            stop.wait()  # silent until the proxy stops, then gone with it
        for sock in (client, upstream):
            _close(sock, reset=action != "drop")


class FaultProxy:
    """``127.0.0.1:<port>`` (``url``) forwarding to ``upstream`` under ``fault``.

    >>> with FaultProxy(("127.0.0.1", 8787)) as proxy:
    ...     proxy.fault = Fault("reset", "down", after=1000)
    ...     # requests to proxy.url now break 1000 bytes into their answers
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.fault = Fault()
        self.connections = 0  # accepted so far
        # Bytes forwarded each way, over every connection (one link adds at a time:
        # a test reads it after the traffic it measures).
        self.forwarded: dict[Direction, int] = {"up": 0, "down": 0}
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._acceptor.start()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _close(client, reset=True)
                continue
            link = _Link(client, upstream, self.fault, self.forwarded)
            thread = threading.Thread(target=link.run, args=(self._stop,), daemon=True)
            with self._lock:
                if self._stop.is_set():
                    _close(client, reset=True)
                    _close(upstream, reset=True)
                    return
                self.connections += 1
                self._threads.append(thread)
            thread.start()

    def close(self) -> None:
        """Stop accepting and reset every connection still open."""
        self._stop.set()
        with contextlib.suppress(OSError):
            # shutdown wakes the thread blocked in accept(); close alone would not.
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(timeout=5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)


@contextlib.contextmanager
def fault_proxy(upstream_url: str) -> Iterator[FaultProxy]:
    """A ``FaultProxy`` in front of ``http://127.0.0.1:<port>``, closed on exit."""
    host, _, port = upstream_url.removeprefix("http://").partition(":")
    proxy = FaultProxy((host, int(port)))
    try:
        yield proxy
    finally:
        proxy.close()
