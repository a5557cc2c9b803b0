"""The hottest requests, answered before FastAPI's middleware, routing and
dependency injection.

``GET /v1/blobs/{digest}``, ``GET /v1/ns/{namespace}/entries/{key}`` and ``GET
/v1/ns/{namespace}/aliases/{alias}`` (the client's first lookup, by direct key) are
what every cache hit costs; FastAPI's per-request machinery (its middleware stack,
routing through every route, building dependencies) costs more than the work itself: a
profile of entry
lookups on one core spent more of it in Starlette and FastAPI's wrappers than in the
index. The app (``app.ServerApp``) hands every HTTP request here first; this matches those
shapes exactly and calls the same functions the routes call (``answer_blob``,
``answer_entry``, ``answer_alias``, ``authenticate_request``), so the checks are the
routes' own.
On local stores (``Services.inline``) the lookups are answered sooner still, by
``immediate``: the HTTP protocol calls it once a request has arrived, before any ASGI
task or message exists (immediate.py).
Anything else, including a malformed path, goes on to FastAPI, whose routes also
document these in the OpenAPI schema. An exception other than the server's own
errors reaches uvicorn, which answers 500 and logs it, as Starlette's outermost
middleware would have.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from starlette.responses import Response

from neffcache.protocol import HEX64, NAMESPACE, inline
from neffcache.server.api.blobs import ACCEL_HEADER, accel_answer, answer_blob, file_answer
from neffcache.server.api.entries import alias_answer, answer_alias, answer_entry, entry_answer
from neffcache.server.deps import authenticate_request, identify
from neffcache.server.errors import ServerError
from neffcache.server.services import Services

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_BLOB = re.compile(f"/v1/blobs/({HEX64})")
_ENTRY = re.compile(f"/v1/ns/({NAMESPACE})/entries/({HEX64})")
# No control character: such a path is the app's 400 (app.PlainPaths), said its way.
_ALIAS = re.compile(rf"/v1/ns/({NAMESPACE})/aliases/([^\x00-\x1f\x7f]+)")
_ACCEL = ACCEL_HEADER.encode()
_INLINE = inline.HEADER.lower().encode()


class FastPath:
    def __init__(
        self, backends: Services, on_error: Callable[[ServerError, str], Response]
    ) -> None:
        self.backends = backends
        self.on_error = on_error

    async def answered(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request if it is one of those shapes; False to leave it to
        FastAPI."""
        if scope["type"] != "http" or scope["method"] != "GET":
            return False
        path = scope["path"]
        shape = _shape(path)
        if shape is None:
            return False
        try:
            response = await self._answer(_first(scope["headers"]), *shape)
        except ServerError as exc:
            response = self.on_error(exc, path)
        await response(scope, receive, send)
        return True

    async def _answer(
        self, headers: dict[bytes, bytes], blob: _Match, entry: _Match, alias: _Match
    ) -> Response:
        caller = await authenticate_request(self.backends, _text(headers.get(b"authorization")))
        if blob is not None:
            range_header = _text(headers.get(b"range"))
            return await answer_blob(
                self.backends, caller, blob[1], range_header, _ACCEL in headers
            )
        ask = _text(headers.get(_INLINE))
        if entry is not None:
            return await answer_entry(self.backends, caller, entry[1], entry[2], ask)
        assert alias is not None
        return await answer_alias(self.backends, caller, alias[1], alias[2], ask)

    def takes(self, path: str) -> bool:
        """Whether ``immediate`` may answer a GET of ``path``: an entry or alias lookup,
        or a blob, on stores called inline (a lookup on Redis or S3 awaits a worker
        thread)."""
        return self.backends.inline and _shape(path) is not None

    def immediate(self, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Response | None:
        """The answer to a GET of ``path`` that ``takes`` took, made in the calling
        thread by the functions ``answered`` awaits; None when it is not one. A
        ServerError is its answer, as in ``answered``; any other exception is the
        caller's."""
        shape = _shape(path)
        if shape is None:
            return None
        blob, entry, alias = shape
        first = _first(headers)
        accel = _ACCEL in first
        if blob is not None and not accel and b"range" in first:
            return None  # a range is hashed first, in a worker thread
        authorization, asked = _text(first.get(b"authorization")), _text(first.get(_INLINE))
        try:
            caller = identify(self.backends, authorization)
            if blob is not None and accel:
                return accel_answer(self.backends, caller, blob[1])
            if blob is not None:
                return file_answer(self.backends, caller, blob[1])
            if entry is not None:
                return entry_answer(self.backends, caller, entry[1], entry[2], asked)
            assert alias is not None
            return alias_answer(self.backends, caller, alias[1], alias[2], asked)
        except ServerError as exc:
            return self.on_error(exc, path)


_Match = re.Match[str] | None


def _shape(path: str) -> tuple[_Match, _Match, _Match] | None:
    """The path's match as a blob, an entry or an alias (one of the three), or None
    when it is none of them."""
    blob = _BLOB.fullmatch(path)
    entry = None if blob else _ENTRY.fullmatch(path)
    alias = None if blob or entry else _ALIAS.fullmatch(path)
    return None if blob is None and entry is None and alias is None else (blob, entry, alias)


def _first(headers: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """Each header's first value, as Starlette reads repeated headers."""
    first: dict[bytes, bytes] = {}
    for name, value in headers:
        first.setdefault(name, value)
    return first


def _text(value: bytes | None) -> str | None:
    """A header's value as text; None for one absent or empty, as if not sent."""
    return value.decode("latin-1") if value else None
