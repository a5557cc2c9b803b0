"""A scripted server for the bridge's ``Remote``: each request handed to an httpx
handler (``httpx.Request`` in, ``httpx.Response`` out), as ``httpx.MockTransport``
would, through a stand-in for the client's ``http.Connection``. What the real
connection does on the wire is tested in tests/client; here only the answers matter."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import BinaryIO

import httpx

from neffcache.client.bridge.remote import Remote
from neffcache.client.http import BODY_LIMIT, Connection, Response, SinkError

Handler = Callable[[httpx.Request], httpx.Response]
BASE = "http://cache.test"


class Scripted(Connection):
    def __init__(self, handler: Handler) -> None:
        super().__init__(BASE, 1.0, 1.0)
        self.handler = handler

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        body_file: tuple[BinaryIO, int] | None = None,
        sink: Callable[[bytes], None] | None = None,
        timeout: float | None = None,
        wait: float = 0.0,
        limit: int = BODY_LIMIT,
    ) -> Response:
        if body_file is not None:
            body = body_file[0].read(body_file[1])
        request = httpx.Request(method, BASE + path, headers=dict(headers or {}), content=body)
        answer = self.handler(request)
        found = {name.lower(): value for name, value in answer.headers.items()}
        if sink is None or not 200 <= answer.status_code < 300:
            return Response(answer.status_code, found, answer.read())
        for chunk in answer.iter_bytes():  # a generator's chunks as they come
            try:
                sink(chunk)
            except Exception as exc:  # as the real connection reports a sink's failure
                raise SinkError(str(exc)) from exc
        return Response(answer.status_code, found, b"")


def scripted(handler: Handler) -> Remote:
    return Remote(BASE, "team-a", None, connection=Scripted(handler))
