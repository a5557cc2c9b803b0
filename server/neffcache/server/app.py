"""The FastAPI application: ``create_app(settings, blobs=..., index=...)``.

Stores are injected (tests pass in-memory ones) or opened from the settings' URLs; the
lifespan closes what it opened. Every ServerError maps to its status in one handler.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
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
)
from neffcache.server.auth import TokenPresence, ensure_bootstrap_token
from neffcache.server.blobs import BlobStore, open_blob_store
from neffcache.server.deps import Backends
from neffcache.server.errors import ServerError
from neffcache.server.fastpath import FastPath
from neffcache.server.index import Index, open_index
from neffcache.server.reports.prices import load_prices
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
    changes = []
    if settings.bootstrap_admin_token is not None:
        changes = ensure_bootstrap_token(index, settings.bootstrap_admin_token.get_secret_value())
    log.info(
        "blobs %s, index %s",
        redact(settings.blob_store_url()),
        redact(settings.index_store_url()),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backends: Backends = app.state.backends
        backends.maintenance.start()
        try:
            yield
        finally:
            # A thread: stopping waits for a pass under way and writes access times.
            await run_in_threadpool(backends.maintenance.stop)
            for store in owned:
                store.close()

    # No /docs or /redoc: FastAPI's viewers load their scripts from a CDN, which the
    # air-gapped clusters this serves cannot reach. /openapi.json stays (protocol.md).
    app = FastAPI(
        title="neffcache",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.backends = Backends(
        settings,
        blob_store,
        index,
        TokenPresence(index),
        verified=VerifiedMemo(settings.reverify_seconds),
    )
    app.state.backends.audit.write(changes)
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
        dashboard,
    ):
        app.include_router(module.router)
    app.add_exception_handler(ServerError, _server_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(FastPath, backends=app.state.backends, on_error=error_response)
    return app


def error_response(exc: ServerError, path: str) -> JSONResponse:
    """The JSON body and status of a ServerError, for the app and the fast path."""
    body: dict[str, Any] = {"detail": str(exc)}
    missing = getattr(exc, "missing", None)
    if missing is not None:
        body["missing"] = missing
    if exc.status >= 500:
        log.error("%s: %s", path, exc)
    return JSONResponse(body, status_code=exc.status)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServerError)
    return error_response(exc, request.url.path)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )
    return JSONResponse({"detail": f"bad request: {problems}"}, status_code=400)
