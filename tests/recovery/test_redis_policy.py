"""A Redis that may evict keys under memory pressure loses index rows one at a time,
which nothing notices (a wipe is noticed: the marker goes too). The index says so at
start-up; a real redis-server is configured each way."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from loopback import uses_fakeredis

from neffcache.server.index.redis import RedisIndex


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    if uses_fakeredis():
        pytest.skip("fakeredis has no CONFIG SET for maxmemory: needs a real redis-server")
    found = redis.Redis.from_url(redis_server)
    before = found.config_get("maxmemory-policy"), found.config_get("maxmemory")
    yield found
    found.config_set("maxmemory-policy", before[0]["maxmemory-policy"])
    found.config_set("maxmemory", before[1]["maxmemory"])


@pytest.mark.parametrize(
    ("limit", "policy", "warns"),
    [
        ("0", "allkeys-lru", False),  # no limit: nothing is ever evicted
        ("100mb", "noeviction", False),
        ("100mb", "allkeys-lru", True),
        ("100mb", "volatile-ttl", True),
    ],
)
def test_an_evicting_redis_is_named_at_start_up(
    client: redis.Redis,
    redis_server: str,
    limit: str,
    policy: str,
    warns: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client.config_set("maxmemory", limit)
    client.config_set("maxmemory-policy", policy)
    with caplog.at_level(logging.WARNING, logger="neffcache.server.index"):
        index = RedisIndex.from_url(redis_server)
    index.close()
    assert any("maxmemory-policy noeviction" in r.getMessage() for r in caplog.records) is warns
