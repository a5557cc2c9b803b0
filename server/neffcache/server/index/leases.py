"""Compile leases written once over ``Cells``: a lease is one cell,
``lease:{namespace}:{name}``, holding ``"<lease_id> <failed 0|1> <JSON of the rest>"``
and expiring with the lease. Every change is a put-if-absent or a compare-and-set of
that cell, so concurrent replicas never both hold a name. (The Redis layout is the one
earlier servers wrote, key and value, so replicas of both can share a database.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from neffcache.server.errors import StoreError

from .base import Lease
from .primitives import Cell, Cells

# Rounds of put-if-absent, compare-and-set before acquire_lease gives up: each
# lost round means another caller changed the cell in between, which under any real
# contention settles within a couple of rounds.
ACQUIRE_ROUNDS = 16


def lease_key(namespace: str, name: str) -> str:
    # Escape ":" so that namespace "a:b" with name "c" and namespace "a" with name
    # "b:c" get different keys; "%" too, so the escaping cannot collide with itself.
    escaped = namespace.replace("%", "%25").replace(":", "%3A")
    return f"lease:{escaped}:{name}"


def lease_value(lease: Lease) -> str:
    rest = {
        "holder": lease.holder,
        "acquired_at": lease.acquired_at,
        "expected_seconds": lease.expected_seconds,
    }
    return f"{lease.lease_id} {int(lease.failed)} {json.dumps(rest)}"


def lease_from(namespace: str, name: str, cell: Cell) -> Lease:
    lease_id, failed, rest = cell.value.split(" ", 2)
    fields = json.loads(rest)
    return Lease(
        namespace=namespace,
        name=name,
        lease_id=lease_id,
        holder=fields["holder"],
        acquired_at=fields["acquired_at"],
        expires_at=cell.expires_at,
        expected_seconds=fields["expected_seconds"],
        failed=failed == "1",
    )


class CellLeases:
    """The ``Leases`` role over any ``Cells``. ``clock`` is the now of renewals and
    releases, which the protocol does not pass: only a backend with its own clock
    (Redis) reads it, to turn the new ``expires_at`` into a lifetime."""

    def __init__(self, cells: Cells, clock: Callable[[], float] = time.time) -> None:
        self._cells = cells
        self._clock = clock

    def acquire_lease(self, lease: Lease, replacing: str | None = None) -> Lease:
        key = lease_key(lease.namespace, lease.name)
        value = lease_value(lease)
        now = lease.acquired_at
        for _ in range(ACQUIRE_ROUNDS):
            cell = self._cells.put_new(key, value, now, lease.expires_at)
            if cell is None:
                return lease
            current = lease_from(lease.namespace, lease.name, cell)
            if current.lease_id != replacing:
                return current
            if self._cells.swap(key, cell.value, value, now, lease.expires_at):
                return lease
        raise StoreError(f"lease {key}: still contended after {ACQUIRE_ROUNDS} rounds")

    # Renewals and releases are one swap_head each, one round trip: the head names
    # the holder, ``"<lease_id> 0 "``, so a failure notice or another holder's lease
    # is never changed, and the rest of the value is kept as it is.

    def renew_lease(self, namespace: str, name: str, lease_id: str, expires_at: float) -> bool:
        head = _holding(lease_id)
        return self._cells.swap_head(
            lease_key(namespace, name), head, head, self._clock(), expires_at
        )

    def release_lease(
        self, namespace: str, name: str, lease_id: str, failed_until: float | None
    ) -> bool:
        key = lease_key(namespace, name)
        if failed_until is None:
            return self._cells.swap_head(key, _holding(lease_id), None, self._clock(), 0.0)
        notice = f"{lease_id} 1 "
        return self._cells.swap_head(key, _holding(lease_id), notice, self._clock(), failed_until)

    def get_lease(self, namespace: str, name: str, now: float) -> Lease | None:
        cell = self._cells.get(lease_key(namespace, name), now)
        return None if cell is None else lease_from(namespace, name, cell)


def _holding(lease_id: str) -> str:
    """The head of the value of a lease ``lease_id`` holds (a failure notice holds
    nothing); a lease that expired but was not reclaimed still counts, as the protocol
    allows."""
    return f"{lease_id} 0 "
