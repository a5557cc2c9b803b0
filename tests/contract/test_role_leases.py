"""The ``Leases`` role (index/leases.py, written once over cells) on every backend.
Times are the server's clock (renewals and releases read it themselves), taken once
per module: every lease here lives an hour, far longer than the tests."""

from __future__ import annotations

import time

from support.indexes import index, store

from neffcache.server.index import Lease, Leases

__all__ = ["index", "store"]

NOW = time.time()


def lease(lease_id: str, *, ttl: float = 3600.0, now: float = NOW) -> Lease:
    return Lease("team-a", "graph", lease_id, f"host {lease_id}", now, now + ttl, 12.5)


def test_one_holder_at_a_time(index: Leases) -> None:
    first = lease("a" * 32)
    assert index.acquire_lease(first) == first
    held = index.acquire_lease(lease("b" * 32))
    assert (held.lease_id, held.holder, held.expected_seconds) == ("a" * 32, first.holder, 12.5)
    assert not held.failed


def test_replacing_takes_over_only_the_named_holder(index: Leases) -> None:
    index.acquire_lease(lease("a" * 32))
    assert index.acquire_lease(lease("b" * 32), replacing="c" * 32).lease_id == "a" * 32
    assert index.acquire_lease(lease("b" * 32), replacing="a" * 32).lease_id == "b" * 32
    assert not index.renew_lease("team-a", "graph", "a" * 32, NOW + 1200)


def test_release_frees_the_name_and_only_the_holder_may(index: Leases) -> None:
    index.acquire_lease(lease("a" * 32))
    assert not index.release_lease("team-a", "graph", "b" * 32, None)
    assert index.release_lease("team-a", "graph", "a" * 32, None)
    assert index.get_lease("team-a", "graph", NOW) is None
    assert index.acquire_lease(lease("b" * 32)).lease_id == "b" * 32


def test_a_failed_release_leaves_a_notice_nobody_holds(index: Leases) -> None:
    index.acquire_lease(lease("a" * 32))
    assert index.release_lease("team-a", "graph", "a" * 32, NOW + 600)
    notice = index.get_lease("team-a", "graph", NOW)
    assert notice is not None
    assert notice.failed
    assert notice.lease_id == "a" * 32
    assert not index.renew_lease("team-a", "graph", "a" * 32, NOW + 1200)
    assert not index.release_lease("team-a", "graph", "a" * 32, None)
    assert index.acquire_lease(lease("b" * 32)).failed


def test_renewing_moves_the_expiry(index: Leases) -> None:
    index.acquire_lease(lease("a" * 32, ttl=600.0))
    assert index.renew_lease("team-a", "graph", "a" * 32, NOW + 3600)
    assert not index.renew_lease("team-a", "graph", "b" * 32, NOW + 3600)
    held = index.get_lease("team-a", "graph", NOW)
    assert held is not None
    assert held.lease_id == "a" * 32
