"""Request dependencies: the stores and the caller, from the app's state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from neffcache.server.auth import Caller, authenticate
from neffcache.server.blobs import BlobStore
from neffcache.server.index import Index
from neffcache.server.settings import ServerSettings


@dataclass
class Backends:
    settings: ServerSettings
    blobs: BlobStore
    index: Index


def backends(request: Request) -> Backends:
    state: Backends = request.app.state.backends
    return state


def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    return authenticate(backends(request).index, authorization)


BackendsDep = Annotated[Backends, Depends(backends)]
CallerDep = Annotated[Caller, Depends(caller)]
