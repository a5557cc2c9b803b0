"""The FastAPI application: ``create_app(settings, blobs=..., index=...)``.

Stores are injected (tests pass in-memory ones) or opened from the settings' URLs; the
lifespan closes what it opened. Every ServerError maps to its status in one handler.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from neffcache.server import __version__
from neffcache.server.api import (
    admin,
    blobs,
    dashboard,
    entries,
    events,
    eviction,
    explain,
    failures,
    health,
    leases,
    namespaces,
    reports,
    status,
)
from neffcache.server.api.answers import errors
from neffcache.server.auth import ANONYMOUS, TokenPresence, ensure_bootstrap_token
from neffcache.server.blobs import BlobStore, open_blob_store
from neffcache.server.blobs.documents import DocumentStore
from neffcache.server.deps import REQUEST_CALLER, Backends
from neffcache.server.errors import BadRequest, ServerError
from neffcache.server.fastpath import FastPath
from neffcache.server.index import Index, open_index
from neffcache.server.recovery.durable import DurableIndex, check_at_start
from neffcache.server.reports.prices import load_prices
from neffcache.server.scrub import Integrity
from neffcache.server.settings import ServerSettings, redact
from neffcache.server.verified import VerifiedMemo

log = logging.getLogger("neffcache.server")


def create_app(
    settings: ServerSettings | None = None,
    *,
    blob_store: BlobStore | None = None,
    index: Index | None = None,
) -> FastAPI:
    settings = settings or ServerSettings()
    # A bad price_table stops start-up with one line (ConfigError), before any store opens.
    load_prices(settings.price_table)
    owned: list[Any] = []
    if blob_store is None:
        blob_store = open_blob_store(settings.blob_store_url())
        owned.append(blob_store)
    if index is None:
        index = open_index(settings.index_store_url())
        owned.append(index)
    index = durable(index, blob_store)
    changes = []
    if settings.bootstrap_admin_token is not None:
        changes = ensure_bootstrap_token(index, settings.bootstrap_admin_token.get_secret_value())
    # Debug: `neffcache serve` prints where its data is in its start-up banner (banner.py).
    log.debug(
        "blobs %s, index %s",
        redact(settings.blob_store_url()),
        redact(settings.index_store_url()),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backends: Backends = app.state.backends
        integrity: Integrity = app.state.integrity
        backends.maintenance.start()
        integrity.start()
        try:
            yield
        finally:
            # A thread: stopping waits for a pass under way and writes access times.
            await run_in_threadpool(backends.maintenance.stop)
            await run_in_threadpool(integrity.stop)
            for store in owned:
                store.close()

    # No /docs or /redoc: FastAPI's viewers load their scripts from a CDN, which the
    # air-gapped clusters this serves cannot reach. /openapi.json stays (protocol.md).
    app = _App(
        title="neffcache",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # A path with a trailing slash too many is a 404, never Starlette's 307, whose
        # Location is built from the request's Host header: a redirect anyone who can
        # send a Host header would choose. No route of this API ends with a slash.
        redirect_slashes=False,
    )
    app.state.backends = Backends(
        settings,
        blob_store,
        index,
        TokenPresence(index),
        verified=VerifiedMemo(settings.reverify_seconds),
    )
    app.state.backends.audit.write(changes)
    app.state.integrity = Integrity.of(app.state.backends)
    for module in (
        health,
        blobs,
        entries,
        failures,
        leases,
        admin,
        namespaces,
        eviction,
        events,
        reports,
        explain,
        status,
        dashboard,
    ):
        app.include_router(module.router)
    app.add_exception_handler(ServerError, _server_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    # Inside the fast path, whose two shapes hold no control character.
    app.add_middleware(PlainPaths)
    app.add_middleware(FastPath, backends=app.state.backends, on_error=_fast_path_error)
    return app


def durable(index: Index, blob_store: BlobStore, *, at_start: bool = True) -> Index:
    """The index with its durable copy kept in the blob store's documents (recovery/);
    ``at_start``, also marked complete when it is (``check_at_start``). A store
    without documents (a test's stand-in) leaves the index as it is: there is nothing
    to rebuild it from."""
    if not isinstance(blob_store, DocumentStore):
        log.warning("the blob store keeps no documents: a lost index cannot be rebuilt")
        return index
    if at_start:
        check_at_start(index, blob_store, blob_store)
    return DurableIndex(index, blob_store, blob_store)


class _App(FastAPI):
    def openapi(self) -> dict[str, Any]:
        """The schema as FastAPI makes it, except that request validation errors are
        400 with a ``detail`` string (``_validation_error``), never FastAPI's 422."""
        if self.openapi_schema is None:
            schema = super().openapi()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    responses = operation.get("responses", {})
                    if responses.pop("422", None) is not None and "400" not in responses:
                        responses.update({str(k): v for k, v in errors(400).items()})
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            self.openapi_schema = schema
        return self.openapi_schema


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class PlainPaths:
    """``400`` for an API path (``/v1/``) with a control character (percent-encoded,
    as ``%0A``): no name the API takes has one, and Starlette would not route one to a
    ``{name:path}`` route ("." stops at a newline), answering ``404`` as if the route
    did not exist, or route ``KEY%0A`` as ``KEY`` (``$`` matches before a last newline).
    Other paths (the dashboard's assets) name files, and an odd one is a plain 404."""

    def __init__(self, app: Callable[[_Scope, _Receive, _Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.startswith("/v1/") and _CONTROL.search(path):
            problem = BadRequest(
                "the path holds a control character; no name the API takes has one"
            )
            await error_response(problem, "")(scope, receive, send)
            return
        await self.app(scope, receive, send)


def error_response(exc: ServerError, path: str, method: str = "") -> JSONResponse:
    """The JSON body and status of a ServerError, for the app and the fast path;
    ``method`` and ``path`` name the request in the server's log."""
    body: dict[str, Any] = {"detail": str(exc)}
    missing = getattr(exc, "missing", None)
    if missing is not None:
        body["missing"] = missing
    if exc.status >= 500:
        log.error("%s: %s", path, exc)
    elif exc.status in (401, 403):
        _refused(exc, method, path)
    return JSONResponse(body, status_code=exc.status)


def _refused(exc: ServerError, method: str, path: str) -> None:
    # Info, not a warning: refusing is the server doing its job. But a client that
    # misses for want of a token is what an operator asks about, and the access log is
    # off by default. The caller as authentication saw it, never a secret.
    who = REQUEST_CALLER.get() or ANONYMOUS
    path = _CONTROL.sub("?", path)  # one line, whatever the path held
    log.info("refused %s %s (%d, %s): %s", method, path, exc.status, who, exc)


def _fast_path_error(exc: ServerError, path: str) -> JSONResponse:
    return error_response(exc, path, "GET")  # the fast path answers GETs only


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServerError)
    return error_response(exc, request.url.path, request.method)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )
    return JSONResponse({"detail": f"bad request: {problems}"}, status_code=400)
