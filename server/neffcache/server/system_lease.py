"""The leases that let one replica at a time run a background job (the evictor, the
scrub). They live in the ``_system`` namespace, which is not a valid namespace name,
so no client can take or release one."""

from __future__ import annotations

from neffcache.server.index import Index, Lease

SYSTEM = "_system"


def hold(index: Index, name: str, lease_id: str, actor: str, now: float, ttl: float) -> bool:
    """Take or renew the lease ``name`` as ``lease_id`` until ``now + ttl``; False while
    another replica holds it."""
    if index.renew_lease(SYSTEM, name, lease_id, now + ttl):
        return True
    mine = Lease(SYSTEM, name, lease_id, actor, now, now + ttl)
    return index.acquire_lease(mine).lease_id == lease_id
