"""The ``Leases`` role (index/leases.py, written once over cells) on every backend.
Times are the server's clock (renewals and releases read it themselves), taken once
per module: every lease here lives an hour, far longer than the tests."""

from __future__ import annotations

import time
from typing import Any

import redis
from support.backends import flush_redis
from support.indexes import index, store

from neffcache.server.index import Lease, Leases
from neffcache.server.index.redis import RedisIndex

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


class CountingConnection(redis.Connection):
    """A connection that counts what it sends: each send is one round trip to Redis
    (a command, a script's EVALSHA, or a whole pipeline)."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def test_a_redis_renewal_and_release_are_one_round_trip_each(redis_server: str) -> None:
    flush_redis(redis_server)
    client = redis.Redis.from_url(
        redis_server, decode_responses=True, connection_class=CountingConnection
    )
    index = RedisIndex(client)
    # Once first, unmeasured: a script's first call may also load it into Redis.
    index.acquire_lease(lease("0" * 32))
    index.renew_lease("team-a", "graph", "0" * 32, NOW + 3600)
    index.release_lease("team-a", "graph", "0" * 32, None)

    def round_trips(call: Any, *args: Any) -> tuple[object, int]:
        CountingConnection.sent = 0
        return call(*args), CountingConnection.sent

    assert round_trips(index.get_lease, "team-a", "graph", NOW) == (None, 1)  # a pipeline
    index.acquire_lease(lease("a" * 32))
    assert round_trips(index.renew_lease, "team-a", "graph", "a" * 32, NOW + 3600) == (True, 1)
    assert round_trips(index.renew_lease, "team-a", "graph", "b" * 32, NOW + 3600) == (False, 1)
    assert round_trips(index.release_lease, "team-a", "graph", "a" * 32, None) == (True, 1)
    index.acquire_lease(lease("c" * 32))
    failed = round_trips(index.release_lease, "team-a", "graph", "c" * 32, NOW + 600)
    assert failed == (True, 1)
    notice = index.get_lease("team-a", "graph", NOW)
    assert notice is not None
    assert notice.failed
    index.close()
