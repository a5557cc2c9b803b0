"""A byte-counting TCP relay on 127.0.0.1, put between the fleet and a networked cache
(the neffcache server, moto's S3), so "bytes moved" is every byte that crossed the
network in either direction, HTTP headers and all: lookups, lease long-polls,
telemetry and uploads as well as the NEFFs.

    with Relay(upstream_port) as relay:
        ... clients use relay.url ...
        before = relay.snapshot()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from types import TracebackType

CHUNK = 256 * 1024


@dataclass(frozen=True)
class Moved:
    """Bytes relayed so far: ``up`` towards the cache, ``down`` from it."""

    up: int = 0
    down: int = 0

    def __sub__(self, other: Moved) -> Moved:
        return Moved(self.up - other.up, self.down - other.down)

    @property
    def total(self) -> int:
        return self.up + self.down


class Relay:
    """Accepts on a free loopback port and relays each connection to ``upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._counts = {"up": 0, "down": 0}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fleet-relay")
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def snapshot(self) -> Moved:
        return Moved(self._counts["up"], self._counts["down"])

    def __enter__(self) -> Relay:
        self._thread.start()
        if not self._ready.wait(10) or not self.port:
            raise RuntimeError("the relay did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, up_writer, "up"),
            self._pipe(up_reader, writer, "down"),
            return_exceptions=True,
        )

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, direction: str
    ) -> None:
        try:
            while data := await source.read(CHUNK):
                self._counts[direction] += len(data)
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # HTTP needs no half-close: when one side is done, the connection is.
            sink.close()
