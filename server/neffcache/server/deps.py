"""Request dependencies: the app's ``Services`` and the caller, for the routes.

The HTTP layer's thin adapter: the services themselves (services/) know nothing of
FastAPI. ``Backends`` is the routes' name for ``Services``.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Annotated

from fastapi import Depends, Header, Request

from neffcache.server.auth import ANONYMOUS, Caller, authenticate, presented_as
from neffcache.server.errors import Unauthorized
from neffcache.server.services import Services

Backends = Services


# Both async: a plain ``def`` dependency costs a thread-pool hop on every request.
async def backends(request: Request) -> Services:
    state: Services = request.app.state.backends
    return state


async def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    return await authenticate_request(request.app.state.backends, authorization)


# Who the request being answered is, for the line a refusal (401, 403) leaves in the
# server's log (app.error_response): set where every request is authenticated, so a
# refusal raised anywhere later names its caller without each route passing it on.
# Each request runs in a task of its own, with a context of its own.
REQUEST_CALLER: ContextVar[str | None] = ContextVar("neffcache_request_caller", default=None)


async def authenticate_request(backends: Services, authorization: str | None) -> Caller:
    """The caller behind an ``Authorization`` header (routes and the fast path alike)."""
    try:
        caller = await backends.run(authenticate, backends.index, authorization, backends.tokens)
    except Unauthorized:
        REQUEST_CALLER.set(presented_as(authorization))
        raise
    return _noted(caller)


def identify(backends: Services, authorization: str | None) -> Caller:
    """``authenticate_request`` in the calling thread (it may block on the index): for
    the protocol's immediate answers (immediate.py), on local stores."""
    try:
        caller = authenticate(backends.index, authorization, backends.tokens)
    except Unauthorized:
        REQUEST_CALLER.set(presented_as(authorization))
        raise
    return _noted(caller)


def _noted(caller: Caller) -> Caller:
    REQUEST_CALLER.set(caller.name if caller.name == ANONYMOUS else f"token {caller.name}")
    return caller


BackendsDep = Annotated[Services, Depends(backends)]
CallerDep = Annotated[Caller, Depends(caller)]
