"""Fixtures for the scale-out tests: the session's real ``redis-server`` and moto S3
server (tests/support/services.py), and ``pair``: two ``neffcache serve`` replicas over
them, started once per module.

Each module gets a Redis database of its own (flushed first) and a fresh bucket, so
modules never see each other's entries, tokens, audit records or leases. A module
sets ``REPLICA_SETTINGS`` (``NEFFCACHE_*`` variables, the same for both replicas) to
tune them, for example a short eviction interval.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from scaleout.replicas import Pair, running_replicas
from support.services import new_bucket

__all__ = ["pair"]

ADMIN = "scaleout-bootstrap-admin-secret"
# Databases 8 to 15 of the session's redis-server (other tests use 0), one per module.
_DATABASES = itertools.cycle(range(8, 16))


def fresh_database(redis_url: str) -> str:
    """The session's Redis server with a database of this module's, emptied."""
    import redis

    base = redis_url.rsplit("/", 1)[0]
    url = f"{base}/{next(_DATABASES)}"
    with redis.Redis.from_url(url) as connection:
        connection.flushdb()
    return url


@pytest.fixture(scope="module")
def pair(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: str,
    s3_endpoint: str,
) -> Iterator[Pair]:
    """Replicas ``a`` and ``b`` sharing one Redis index and one S3 bucket, with a
    bootstrap admin token (so neither is in protected mode)."""
    settings = {"NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN": ADMIN}
    settings.update(getattr(request.module, "REPLICA_SETTINGS", {}))
    index_url = fresh_database(redis_server)
    blob_url = new_bucket(s3_endpoint, "neffcache-scaleout")
    workdir = tmp_path_factory.mktemp("replicas")
    # A replica that does not start fails the fixture with its log's end.
    with running_replicas(
        workdir,
        index_url=index_url,
        blob_url=blob_url,
        settings=settings,
        env={"AWS_ENDPOINT_URL_S3": s3_endpoint},
    ) as (a, b):
        yield Pair(a, b, ADMIN, index_url, blob_url)
