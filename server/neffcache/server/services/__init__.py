"""The server's services, with no HTTP in them: ``build_services(settings)`` opens the
stores and builds every object that works on them, once per process.

The HTTP layer (``api/``, ``app.py``, ``deps.py``, ``fastpath.py``) hands the one
``Services`` to its routes; the background workers (eviction, the scrub), the
``--local`` admin commands and ``fsck`` take the same object without FastAPI. The
service modules here (``leases``, ``publish``, ``blobs``, ``tokens``) take plain
arguments and return plain results: a miss is a return value, a refusal one of
the exceptions of ``errors.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.to_thread

from neffcache.server.access import AccessLog
from neffcache.server.audit import AuditLog
from neffcache.server.auth import TokenPresence, ensure_bootstrap_token
from neffcache.server.blobs import BlobStore, open_blob_store
from neffcache.server.blobs.documents import DocumentStore
from neffcache.server.blobuse import BlobUse
from neffcache.server.eviction.evictor import Evictor
from neffcache.server.eviction.maintenance import Maintenance
from neffcache.server.eviction.usage import UsageMemo
from neffcache.server.index import Index, open_index
from neffcache.server.metrics import Metrics, Usage
from neffcache.server.namespaces import Policies
from neffcache.server.recovery.durable import DurableIndex
from neffcache.server.recovery.reindex import IndexRecovery, check_at_start
from neffcache.server.settings import ServerSettings, redact
from neffcache.server.verified import VerifiedMemo
from neffcache.server.wakeups import Wakeups

__all__ = ["Services", "build_services", "durable"]

log = logging.getLogger("neffcache.server")
T = TypeVar("T")


# Not frozen: tests stamp events with a clock of their own by setting ``clock``.
@dataclass
class Services:
    settings: ServerSettings
    blobs: BlobStore
    index: Index
    tokens: TokenPresence
    wakeups: Wakeups = field(default_factory=Wakeups)
    # The clock events are stamped with (tests report several days' events in one run).
    clock: Callable[[], float] = time.time
    verified: VerifiedMemo = field(default_factory=lambda: VerifiedMemo(3600.0))
    access: AccessLog = field(default_factory=AccessLog)
    # The stores build_services opened, which close() closes; injected ones stay open.
    owned: tuple[Any, ...] = ()
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
        return await in_thread(fn, *args)

    def close(self) -> None:
        for store in self.owned:
            store.close()


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread of the event loop's pool (as Starlette's
    ``run_in_threadpool``): for calls that may block whatever the stores are."""
    return await anyio.to_thread.run_sync(fn, *args)


def build_services(
    settings: ServerSettings,
    *,
    blob_store: BlobStore | None = None,
    index: Index | None = None,
) -> Services:
    """The stores (injected, as tests do, or opened from the settings' URLs, then owned
    and closed by ``Services.close``), the index wrapped with its durable copy, the
    bootstrap admin token ensured, and every service built on them."""
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
    services = Services(
        settings,
        blob_store,
        index,
        TokenPresence(index),
        verified=VerifiedMemo(settings.reverify_seconds),
        owned=tuple(owned),
    )
    services.audit.write(changes)
    return services


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
