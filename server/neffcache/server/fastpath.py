"""The two hottest requests, answered before FastAPI's routing and dependency injection.

``GET /v1/blobs/{digest}`` and ``GET /v1/ns/{namespace}/entries/{key}`` are what every
cache hit costs; FastAPI's per-request machinery (routing through every route, building
dependencies) costs more than the work itself. This middleware matches those two
shapes exactly and calls the same functions the routes call (``api.blobs``,
``api.entries``), with the same checks; anything else, including a malformed path,
goes on to FastAPI, whose routes also document these two in the OpenAPI schema.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from neffcache.server.api.blobs import _blob_response
from neffcache.server.api.entries import _entry_response
from neffcache.server.auth import authenticate
from neffcache.server.deps import Backends
from neffcache.server.errors import ServerError
from neffcache.server.manifest import HEX64, NAMESPACE

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_BLOB = re.compile(f"/v1/blobs/({HEX64})")
_ENTRY = re.compile(f"/v1/ns/({NAMESPACE})/entries/({HEX64})")


class FastPath:
    def __init__(
        self,
        app: ASGIApp,
        backends: Backends,
        on_error: Callable[[ServerError, str], Response],
    ) -> None:
        self.app = app
        self.backends = backends
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            return await self.app(scope, receive, send)
        path = scope["path"]
        blob = _BLOB.fullmatch(path)
        entry = None if blob else _ENTRY.fullmatch(path)
        if blob is None and entry is None:
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of repeated headers, as Starlette
        try:
            response = await self._answer(headers, blob, entry)
        except ServerError as exc:
            response = self.on_error(exc, path)
        await response(scope, receive, send)

    async def _answer(
        self,
        headers: dict[bytes, bytes],
        blob: re.Match[str] | None,
        entry: re.Match[str] | None,
    ) -> Response:
        backends = self.backends
        authorization = headers.get(b"authorization")
        caller = await backends.run(
            authenticate,
            backends.index,
            authorization.decode("latin-1") if authorization else None,
            backends.tokens,
        )
        if blob is not None:
            caller.require("read")
            range_header = headers.get(b"range")
            # A range hashes the whole blob first: too long for the event loop.
            run = run_in_threadpool if range_header else backends.run
            return await run(
                _blob_response,
                backends,
                blob[1],
                range_header.decode("latin-1") if range_header else None,
            )
        assert entry is not None
        caller.require("read", entry[1])
        return await backends.run(_entry_response, backends, entry[1], entry[2])
