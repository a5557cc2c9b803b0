"""The publish rules: who may write a namespace (its trusted-writers rule), how large
an entry it takes, and that every blob a manifest names is there and stays there.

``publish`` and ``add_alias`` block on the stores (a write may wait for another
process's lock): from the event loop, call them in a worker thread. A refusal is one
of ``errors.py``'s; ``add_alias`` answers an absent entry with None.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from time import monotonic, sleep

from neffcache.server.auth import Caller
from neffcache.server.errors import BadRequest, Forbidden, ServerError, StoreError, TooLarge
from neffcache.server.eviction.evictor import condemned
from neffcache.server.index import Entry, PutResult
from neffcache.server.manifest import FileRef
from neffcache.server.namespaces import NamespacePolicy
from neffcache.server.services import Services

# How long a publish waits for a collection of one of its blobs to end.
_COLLECTION_WAIT_S = 10.0


class MissingBlobs(BadRequest):
    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"the manifest names {len(missing)} blob(s) the server lacks")
        self.missing = missing


def check_writer(services: Services, caller: Caller, namespace: str) -> NamespacePolicy:
    """The trusted-writers rule, on the policy as the index holds it now (not the
    per-replica cache: a namespace turned trusted-only through another replica takes
    no untrusted write from that instant on). Raises Forbidden."""
    policy = services.policies.current(namespace)
    if policy.trusted_writers_only and not caller.trusted:
        raise Forbidden(
            f"namespace {namespace!r} takes only trusted writers; publish into a namespace "
            "of your own (which may read this one through) or use a trusted token"
        )
    return policy


def check_size(policy: NamespacePolicy, namespace: str, size: int) -> None:
    """TooLarge for an entry of ``size`` bytes over the namespace's limits: the smaller
    of the two, since an entry larger than the whole quota could only be evicted
    again at once."""
    limits = [(policy.max_entry_bytes, "largest entry"), (policy.quota_bytes, "quota")]
    for limit, what in limits:
        if limit is not None and size > limit:
            raise TooLarge(
                f"the entry is {size} bytes; namespace {namespace!r} allows {limit} ({what})"
            )


def publish(
    services: Services,
    caller: Caller,
    namespace: str,
    key: str,
    files: Mapping[str, FileRef],
    canonical: str,
    aliases: tuple[str, ...],
) -> PutResult:
    """Store an entry (``canonical``, its manifest) once its blobs are known to be
    there; CREATED, EXISTS (the same manifest) or CONFLICT (another one)."""
    digests = [ref.digest for ref in files.values()]
    services.blob_use.touch(digests)  # referenced from now on: never collected meanwhile
    missing = [ref.digest for ref in files.values() if services.blobs.size(ref.digest) != ref.size]
    if missing:
        raise MissingBlobs(sorted(set(missing)))
    check_writer(services, caller, namespace)
    entry = Entry(namespace, key, canonical, time.time(), caller.name)
    result = services.index.put_entry(entry, aliases)
    if result is PutResult.CREATED:
        try:
            # The rule again, now that the entry is in: a namespace turned trusted-only
            # between the check and the write (the admin's side counts entries after
            # storing the rule) never keeps an untrusted entry.
            check_writer(services, caller, namespace)
            _settle_blobs(services, digests)
        except ServerError:
            services.index.delete_entry(namespace, key, entry.created_at)
            raise
    return result


def _settle_blobs(services: Services, digests: list[str]) -> None:
    """A blob unreferenced for its whole grace period may be being collected (by any
    replica's evictor) as this publishes. While it is condemned, wait for the evictor
    to decide; the blob then either stays (this entry keeps it from now on) or is
    gone, and the client is asked to upload it (Evictor._remove says why no entry is
    then ever left naming a removed blob)."""
    deadline = monotonic() + _COLLECTION_WAIT_S
    for digest in digests:
        while condemned(services.index, digest):
            if monotonic() > deadline:
                raise StoreError(f"blob {digest} is being collected; publish again shortly")
            sleep(0.05)
    gone = [d for d in digests if services.blobs.size(d) is None]
    if gone:
        raise MissingBlobs(sorted(set(gone)))


def add_alias(
    services: Services, caller: Caller, namespace: str, alias: str, key: str
) -> PutResult | None:
    """Name an existing entry by ``alias`` too; None when the namespace has no entry
    ``key``. The writer rule is checked again here, after the request's body."""
    check_writer(services, caller, namespace)
    return services.index.add_alias(namespace, alias, key)
