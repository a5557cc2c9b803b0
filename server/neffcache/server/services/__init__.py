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
from neffcache.server.index.primitive_roles import IndexBackend
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


@dataclass(frozen=True, eq=False)
class Services:
    """The stores and every service built on them (``__post_init__``), once per
    process: ``build_services`` for a server or the ``--local`` commands; tests with
    stores in hand may build one directly. Frozen: what a test varies (the stores, the
    clock) it passes in."""

    settings: ServerSettings
    blobs: BlobStore
    index: Index
    tokens: TokenPresence
    # The clock events are stamped with and a status's window ends at (tests report
    # several days' events in one run through a clock of their own).
    clock: Callable[[], float] = time.time
    wakeups: Wakeups = field(default_factory=Wakeups)
    verified: VerifiedMemo = field(default_factory=lambda: VerifiedMemo(3600.0))
    access: AccessLog = field(default_factory=AccessLog)
    # The stores build_services opened, which close() closes; injected ones stay open.
    owned: tuple[Any, ...] = ()
    # Built from the stores and settings (__post_init__).
    blob_use: BlobUse = field(init=False)
    policies: Policies = field(init=False)
    audit: AuditLog = field(init=False)
    metrics: Metrics = field(init=False)
    evictor: Evictor = field(init=False)
    maintenance: Maintenance = field(init=False)
    usage: UsageMemo = field(init=False)  # what each namespace holds, a minute old at most

    def __post_init__(self) -> None:
        def built(name: str, part: T) -> T:
            object.__setattr__(self, name, part)  # once, here: the instance is frozen
            return part

        settings, index, blobs = self.settings, self.index, self.blobs
        blob_use = built("blob_use", BlobUse(settings.blob_grace_seconds))
        policies = built("policies", Policies(index, settings))
        audit = built("audit", AuditLog(index, settings.audit_keep))
        # Before the evictor, which counts into them; their gauges read ``usage``, built
        # last, only when scraped.
        metrics = built("metrics", Metrics(self._usage))
        evictor = built(
            "evictor",
            Evictor(index, blobs, policies, audit, settings, blob_use, metrics=metrics),
        )
        recovery = IndexRecovery(index, blobs)
        built("maintenance", Maintenance(index, evictor, self.access, settings, recovery))
        built("usage", UsageMemo(evictor))

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
    index: IndexBackend | None = None,
    clock: Callable[[], float] = time.time,
    starting: bool = True,
) -> Services:
    """The stores (injected, as tests do, or opened from the settings' URLs, then owned
    and closed by ``Services.close``), the index wrapped with its durable copy, and
    every service built on them. ``starting``: for a server starting, the index is
    marked complete when it is (``durable``) and the bootstrap admin token ensured;
    the ``--local`` commands, on a stopped server's stores, pass False. ``clock``
    stamps events (``Services.clock``)."""
    owned: list[Any] = []
    if blob_store is None:
        blob_store = open_blob_store(settings.blob_store_url())
        owned.append(blob_store)
    if index is None:
        index = open_index(settings.index_store_url())
        owned.append(index)
    wrapped = durable(index, blob_store, at_start=starting)
    changes = []
    if starting and settings.bootstrap_admin_token is not None:
        changes = ensure_bootstrap_token(wrapped, settings.bootstrap_admin_token.get_secret_value())
    # Debug: `neffcache serve` prints where its data is in its start-up banner (banner.py).
    log.debug(
        "blobs %s, index %s",
        redact(settings.blob_store_url()),
        redact(settings.index_store_url()),
    )
    services = Services(
        settings,
        blob_store,
        wrapped,
        TokenPresence(wrapped),
        clock=clock,
        verified=VerifiedMemo(settings.reverify_seconds),
        owned=tuple(owned),
    )
    services.audit.write(changes)
    return services


def durable(index: IndexBackend, blob_store: BlobStore, *, at_start: bool = True) -> Index:
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
