"""A server whose HTTP protocol answers requests itself (server/immediate.py), for the
tests that compare those answers with the app's: uvicorn in a thread with the protocol
``neffcache serve`` runs, on a filesystem store, stocked with an entry, blobs (each
remembered as verified) and read tokens; and requests and answers over raw sockets,
so the bytes compared are the bytes sent."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
from fastapi.testclient import TestClient
from loopback import InThread

from neffcache.server.app import create_app
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.connections import ConnectionLimits
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings
from support.api import ADDRESS, admin_token, digest, make_token, publish, put_blob

WAIT = 20.0  # how long a read waits for the server


class Counting:
    """The app as uvicorn calls it, counting the paths of the requests that reach it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.inner(scope, receive, send)


@dataclass
class Served:
    port: int
    protocol: Any  # the protocol class: its ``answers`` turns immediate answers off
    app: Counting
    limits: ConnectionLimits
    blobs: FsBlobStore
    services: Any
    reader: str = ""  # a read token for team-a
    other: str = ""  # a read token for team-b

    def verified(self, data: bytes) -> None:
        """``data``'s file remembered as verified, as a read two seconds or more after
        its upload leaves it (verified.py does not trust a file changed just before)."""
        stamped = self.blobs.stamp(digest(data))
        assert stamped is not None
        self.services.verified.remember(digest(data), stamped[0], 0.0, time.time())

    def answers_off(self) -> Any:
        answers, self.protocol.answers = self.protocol.answers, None
        return answers

    @contextlib.contextmanager
    def usual_way(self) -> Iterator[None]:
        """The protocol's own answers off meanwhile: every request through the app."""
        kept = self.answers_off()
        try:
            yield
        finally:
            self.protocol.answers = kept


@contextlib.contextmanager
def serving(
    data: Path, blobs: list[bytes], head_timeout: float, accel: str | None = None, **options: Any
) -> Iterator[Served]:
    """The server on ``data``, with ``blobs`` uploaded and verified; ``options``:
    uvicorn's (with ``ssl_certfile``, over TLS)."""
    store = FsBlobStore(data / "blobs")
    settings = ServerSettings(
        data_dir=data, eviction_interval_seconds=0, accel_redirect_prefix=accel
    )
    app = create_app(settings, blob_store=store, index=MemoryIndex())
    limits = ConnectionLimits(100, head_timeout)
    protocol = limits.protocol_class("httptools", answers=app.fast_path)
    counting = Counting(app)
    # The access log off, as `neffcache serve` runs by default: uvicorn writes it from
    # the request cycle, so the protocol answers nothing itself while it is on.
    thread = InThread(counting, access_log=False, http=protocol, **options)
    try:
        with thread as url:
            if "ssl_certfile" in options:
                url = url.replace("http://", "https://")
            port = int(url.rsplit(":", 1)[1])
            served = Served(port, protocol, counting, limits, store, app.state.backends)
            _stock(served, url, blobs)
            yield served
    finally:
        store.close()


def _stock(served: Served, url: str, blobs: list[bytes]) -> None:
    with httpx.Client(base_url=url, trust_env=False, verify=False) as client:
        test_client = cast(TestClient, client)
        admin = admin_token(test_client)
        client.headers.update({"Authorization": f"Bearer {admin}"})
        publish(test_client, neuron_address=ADDRESS)
        for data in blobs:
            assert put_blob(test_client, data) == 201
        served.reader = make_token(test_client, admin, "read", ["team-a"])
        served.other = make_token(test_client, admin, "read", ["team-b"])
    for data in blobs:
        served.verified(data)
    deadline = time.monotonic() + WAIT
    while served.limits.open:  # the stocking client's connection gone from the server too
        assert time.monotonic() < deadline, "the stocking connection stayed open"
        time.sleep(0.01)


def connect(served: Served, window: int | None = None) -> socket.socket:
    """A connection to the server; ``window``: its receive buffer, so that what the
    server sends fills the socket until this side reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if window is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
    sock.settimeout(WAIT)
    sock.connect(("127.0.0.1", served.port))
    return sock


def read_answer(sock: socket.socket, pending: bytearray) -> bytes:
    """One whole answer (Content-Length framed) from ``sock``; what follows it stays in
    ``pending``."""
    while b"\r\n\r\n" not in pending:
        chunk = sock.recv(65536)
        assert chunk, f"closed inside an answer's head: {bytes(pending)!r}"
        pending += chunk
    head, _, _ = bytes(pending).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    size = len(head) + 4 + length
    while len(pending) < size:
        chunk = sock.recv(65536)
        assert chunk, "closed inside an answer's body"
        pending += chunk
    answer = bytes(pending[:size])
    del pending[:size]
    return answer


def get(path: str, *headers: str, version: str = "1.1") -> bytes:
    lines = [f"GET {path} HTTP/{version}", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode("latin-1")


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[2]


def blob(data: bytes) -> str:
    return f"/v1/blobs/{digest(data)}"
