"""Request dependencies: the stores and the caller, from the app's state."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Request
from starlette.concurrency import run_in_threadpool

from neffcache.server.access import AccessLog
from neffcache.server.audit import AuditLog
from neffcache.server.auth import (
    ANONYMOUS,
    Caller,
    TokenPresence,
    authenticate,
    presented_as,
)
from neffcache.server.blobs import BlobStore
from neffcache.server.blobuse import BlobUse
from neffcache.server.errors import Unauthorized
from neffcache.server.eviction.evictor import Evictor
from neffcache.server.eviction.maintenance import Maintenance
from neffcache.server.eviction.usage import UsageMemo
from neffcache.server.index import Index
from neffcache.server.metrics import Metrics, Usage
from neffcache.server.namespaces import Policies
from neffcache.server.recovery.reindex import IndexRecovery
from neffcache.server.settings import ServerSettings
from neffcache.server.verified import VerifiedMemo
from neffcache.server.wakeups import Wakeups

T = TypeVar("T")


@dataclass
class Backends:
    settings: ServerSettings
    blobs: BlobStore
    index: Index
    tokens: TokenPresence
    wakeups: Wakeups = field(default_factory=Wakeups)
    # The clock events are stamped with (tests report several days' events in one run).
    clock: Callable[[], float] = time.time
    verified: VerifiedMemo = field(default_factory=lambda: VerifiedMemo(3600.0))
    access: AccessLog = field(default_factory=AccessLog)
    blob_use: BlobUse = field(init=False)
    # Built from the stores and settings (__post_init__).
    policies: Policies = field(init=False)
    audit: AuditLog = field(init=False)
    evictor: Evictor = field(init=False)
    maintenance: Maintenance = field(init=False)
    metrics: Metrics = field(init=False)
    usage: UsageMemo = field(init=False)  # what each namespace holds, a minute old at most

    def __post_init__(self) -> None:
        self.blob_use = BlobUse(self.settings.blob_grace_seconds)
        self.policies = Policies(self.index, self.settings)
        self.audit = AuditLog(self.index, self.settings.audit_keep)
        self.metrics = Metrics(self._usage)
        self.evictor = Evictor(
            self.index,
            self.blobs,
            self.policies,
            self.audit,
            self.settings,
            self.blob_use,
            metrics=self.metrics,
        )
        self.maintenance = Maintenance(
            self.index,
            self.evictor,
            self.access,
            self.settings,
            IndexRecovery(self.index, self.blobs),
        )
        self.usage = UsageMemo(self.evictor)

    def _usage(self) -> Iterator[Usage]:
        for policy in self.policies.all():
            held = self.usage.usage(policy.namespace)
            yield Usage(policy.namespace, held.entries, held.bytes, policy.quota_bytes)

    @property
    def inline(self) -> bool:
        """Whether store calls may run on the event loop (see the stores' ``local``)."""
        return bool(getattr(self.blobs, "local", False) and getattr(self.index, "local", False))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Call a function that uses the stores: inline for local stores, where a hop
        to the thread pool costs more than the call, else in a worker thread."""
        if self.inline:
            return fn(*args)
        return await run_in_threadpool(fn, *args)


# Both async: a plain ``def`` dependency costs a thread-pool hop on every request.
async def backends(request: Request) -> Backends:
    state: Backends = request.app.state.backends
    return state


async def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    return await authenticate_request(request.app.state.backends, authorization)


# Who the request being answered is, for the line a refusal (401, 403) leaves in the
# server's log (app.error_response): set where every request is authenticated, so a
# refusal raised anywhere later names its caller without each route passing it on.
# Each request runs in a task of its own, with a context of its own.
REQUEST_CALLER: ContextVar[str | None] = ContextVar("neffcache_request_caller", default=None)


async def authenticate_request(backends: Backends, authorization: str | None) -> Caller:
    """The caller behind an ``Authorization`` header (routes and the fast path alike)."""
    try:
        caller = await backends.run(authenticate, backends.index, authorization, backends.tokens)
    except Unauthorized:
        REQUEST_CALLER.set(presented_as(authorization))
        raise
    REQUEST_CALLER.set(caller.name if caller.name == ANONYMOUS else f"token {caller.name}")
    return caller


BackendsDep = Annotated[Backends, Depends(backends)]
CallerDep = Annotated[Caller, Depends(caller)]
