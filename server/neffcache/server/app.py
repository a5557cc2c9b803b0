"""The FastAPI application: ``create_app(settings, blob_store=..., index=..., clock=...)``.

Stores are injected (tests pass in-memory ones) or opened from the settings' URLs, and
the services built on them (``build_services``, which also takes the clock events are
stamped with); the lifespan closes what it opened.
Every ServerError maps to its status in one handler.
"""

from __future__ import annotations

import logging
import re
import time
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
from neffcache.server.auth import ANONYMOUS
from neffcache.server.blobs import BlobStore
from neffcache.server.deps import REQUEST_CALLER
from neffcache.server.errors import BadRequest, ServerError
from neffcache.server.fastpath import FastPath
from neffcache.server.index.primitive_roles import IndexBackend
from neffcache.server.reports.prices import load_prices
from neffcache.server.scrub import Integrity
from neffcache.server.services import Services, build_services
from neffcache.server.settings import ServerSettings

log = logging.getLogger("neffcache.server")


def create_app(
    settings: ServerSettings | None = None,
    *,
    blob_store: BlobStore | None = None,
    index: IndexBackend | None = None,
    clock: Callable[[], float] = time.time,
) -> ServerApp:
    settings = settings or ServerSettings()
    # A bad price_table stops start-up with one line (ConfigError), before any store opens.
    load_prices(settings.price_table)
    services = build_services(settings, blob_store=blob_store, index=index, clock=clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backends: Services = app.state.backends
        integrity: Integrity = app.state.integrity
        backends.maintenance.start()
        integrity.start()
        try:
            yield
        finally:
            # A thread: stopping waits for a pass under way and writes access times.
            await run_in_threadpool(backends.maintenance.stop)
            await run_in_threadpool(integrity.stop)
            backends.close()

    # No /docs or /redoc: FastAPI's viewers load their scripts from a CDN, which the
    # air-gapped clusters this serves cannot reach. /openapi.json stays (protocol.md).
    app = ServerApp(
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
    app.state.backends = services
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
    # After the fast path, whose shapes hold no control character.
    app.add_middleware(PlainPaths)
    app.fast_path = FastPath(app.state.backends, _fast_path_error)
    return app


class ServerApp(FastAPI):
    """The API, whose hottest requests its ``fast_path`` answers first."""

    fast_path: FastPath | None = None

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        # The hottest requests skip the middleware stack, not only the routing
        # (fastpath.py); everything else, lifespan included, goes through it.
        fast = self.fast_path
        if fast is None or not await fast.answered(scope, receive, send):
            await super().__call__(scope, receive, send)

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
