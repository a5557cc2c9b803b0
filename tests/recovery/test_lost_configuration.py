"""Tokens, namespace policies and pins come back by themselves after the index loses
them, whatever the blob store holds beside their documents: no entry document yet,
or blobs but no entry document. Servers over a real ``redis-server`` (flushed under
them, or put back to a snapshot) and over SQLite (``index.db`` put back to a backup),
answering through their HTTP API.

Nothing lost: a token that worked before the loss works again, never a 401 for good;
a namespace that took only trusted writers takes none other again; a pin pins again;
and a token made during the rebuild is kept, documented."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from support.backends import backends

from neffcache.server.app import create_app
from neffcache.server.auth import new_token
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.index import Index
from neffcache.server.index.redis import RedisIndex
from neffcache.server.index.sqlite import SqliteIndex
from neffcache.server.recovery import documents as docs
from neffcache.server.recovery.durable import DurableIndex, is_complete
from neffcache.server.settings import ServerSettings

BOOT = "nfc_bootstrap_secret_for_lost_configuration_0123456789"
NS = "main"
KEY = "ab" * 32
PIN = {"kind": "model", "value": "llama-70b", "reason": "production"}


class HookedStore(FsBlobStore):
    """A filesystem blob store that runs ``during`` once, when the token documents
    are next listed (another replica acting while a rebuild reads them)."""

    during: Callable[[], None] | None = None

    def documents(self, prefix: str) -> Iterator[str]:
        if prefix == docs.TOKENS and self.during is not None:
            during, self.during = self.during, None
            during()
        return super().documents(prefix)


@dataclass
class Cluster:
    """Replicas over one blob store and one index (``backend``: a Redis database,
    or an SQLite file), eviction off unless asked, maintenance ticked by the test."""

    backend: str
    tmp: Path
    redis_url: str
    blobs: HookedStore
    opened: list[Index] = field(default_factory=list)

    def index(self) -> Index:
        opened: Index
        if self.backend == "redis":
            opened = RedisIndex.from_url(self.redis_url)
        else:
            opened = SqliteIndex(self.tmp / "index.db")
        self.opened.append(opened)
        return opened

    def replica(self, eviction_interval: float = 0) -> FastAPI:
        """A server starting (lifespan not run: no background thread, ``tick`` and
        ``run`` are the test's to call)."""
        settings = ServerSettings(
            data_dir=self.tmp,
            bootstrap_admin_token=BOOT,
            eviction_interval_seconds=eviction_interval,
            access_flush_seconds=3600,
            blob_grace_seconds=0,
        )
        return create_app(settings, blob_store=self.blobs, index=self.index())

    def close(self) -> None:
        for index in self.opened:
            index.close()
        self.blobs.close()


# A running SQLite index cannot be flushed under its server: it is lost by a restart
# (a deleted or restored ``index.db``), so the flush tests run on Redis only.
REDIS_ONLY = pytest.mark.parametrize("cluster", backends("redis"), indirect=True)


@pytest.fixture(params=backends("sqlite", "redis"))
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    redis_url = ""
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_server")
        flush(redis_url)
    made = Cluster(request.param, tmp_path, redis_url, HookedStore(tmp_path / "blobs"))
    yield made
    made.close()


def flush(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        client.flushall()


def client(app: FastAPI, secret: str = BOOT) -> TestClient:
    http = TestClient(app)
    http.headers["Authorization"] = f"Bearer {secret}"
    return http


def configure(app: FastAPI, *, blob: bool = False) -> str:
    """A write token (not trusted) for ``main``, ``main`` taking only trusted
    writers, a pin in it; with ``blob``, a blob uploaded and never published. No
    entry is published. The write token's secret."""
    admin = client(app)
    made = admin.post("/v1/admin/tokens", json={"scope": "write", "namespaces": [NS]})
    assert made.status_code == 201, made.text
    assert admin.post(f"/v1/admin/namespaces/{NS}", json={"trusted_writers_only": True}).is_success
    assert admin.put(f"/v1/admin/namespaces/{NS}/pins", json=PIN).status_code == 201
    secret: str = made.json()["token"]
    if blob:
        data = b"a NEFF uploaded by a publish that never came"
        digest = blake3.blake3(data).hexdigest()
        assert client(app, secret).put(f"/v1/blobs/{digest}", content=data).status_code == 201
    return secret


def assert_configured(app: FastAPI, writer: str) -> None:
    """The write token is known (a lookup misses: 404, not 401), ``main`` refuses it
    as an untrusted writer (403), and the policy and the pin are there."""
    http = client(app, writer)
    assert http.get(f"/v1/ns/{NS}/entries/{KEY}").status_code == 404
    refused = http.put(f"/v1/ns/{NS}/entries/{KEY}", content=b"{}")
    assert refused.status_code == 403, refused.text
    assert "trusted writers" in refused.json()["detail"]
    shown = client(app).get(f"/v1/admin/namespaces/{NS}")
    assert shown.status_code == 200, shown.text
    assert shown.json()["trusted_writers_only"] is True
    assert [(p["kind"], p["value"]) for p in shown.json()["pins"]] == [(PIN["kind"], PIN["value"])]


def tick(app: FastAPI) -> None:
    app.state.backends.maintenance.tick()


@REDIS_ONLY
@pytest.mark.parametrize("blob", [False, True], ids=["no-blobs", "an-unpublished-blob"])
def test_a_flushed_index_that_held_no_entry_gets_its_configuration_back(
    cluster: Cluster, blob: bool
) -> None:
    """Redis flushed before any entry was published, beside two running replicas:
    within the evicting replica's next tick every token, the policy and the pin are
    back, on both replicas, and they stay back on a replica that starts afterwards.
    (Was: the tick marked the empty index complete without restoring them, and a
    start on a marked index restores nothing: every token refused for good.)"""
    first, second = cluster.replica(), cluster.replica()
    writer = configure(first, blob=blob)
    assert_configured(second, writer)

    flush(cluster.redis_url)
    assert client(first, writer).get(f"/v1/ns/{NS}/entries/{KEY}").status_code == 401
    # Until the rebuild, no token: still not protected mode (anonymous as admin), not
    # even on a replica never asked anything without a token before.
    assert TestClient(second).get("/v1/admin/tokens").status_code == 401
    tick(second)  # the evicting replica (eviction off: it leads for the rebuild)
    for replica in (first, second):
        assert_configured(replica, writer)

    tick(first)  # another tick, another replica: nothing changes
    assert_configured(cluster.replica(), writer)  # a replica restarting


@REDIS_ONLY
def test_a_token_made_while_the_configuration_is_restored_is_kept(cluster: Cluster) -> None:
    """Redis flushed with no entry document; while the evicting replica reads the
    token documents back, an admin on the other replica makes a new token. Both the
    restored and the new token work, the new one is documented, and the index is
    marked complete (nothing is missing from it)."""
    first, second = cluster.replica(), cluster.replica()
    writer = configure(first)
    flush(cluster.redis_url)
    made, secret = new_token("read", (NS,), "made during the rebuild")
    cluster.blobs.during = lambda: first.state.backends.index.put_token(made)

    tick(second)
    assert cluster.blobs.during is None, "the token documents were never read back"
    assert_configured(first, writer)
    assert client(second, secret).get(f"/v1/ns/{NS}/entries/{KEY}").status_code == 404
    assert cluster.blobs.get_document(docs.token_name(made.token_id)) == docs.token_document(made)
    index = second.state.backends.index
    assert isinstance(index, DurableIndex)
    assert is_complete(index.inner)


def snapshot(cluster: Cluster) -> Callable[[], None]:
    """Take the index's state now; the function that puts it back (as a Redis
    restarted from its last RDB snapshot, or ``index.db`` restored from a backup
    with the servers stopped)."""
    if cluster.backend == "redis":
        with redis.Redis.from_url(cluster.redis_url) as db:
            dumped = {key: db.dump(key) for key in db.scan_iter()}

        def put_back_redis() -> None:
            with redis.Redis.from_url(cluster.redis_url) as db:
                db.flushall()
                for key, value in dumped.items():
                    db.restore(key, 0, value)

        return put_back_redis
    backup = cluster.tmp / "index.db.bak"
    with sqlite3.connect(cluster.tmp / "index.db") as live, sqlite3.connect(backup) as copy:
        live.backup(copy)

    def put_back_sqlite() -> None:
        for index in cluster.opened:
            index.close()
        # Through SQLite's backup API, as `sqlite3 index.db ".restore BACKUP"` does: a
        # file copied over a WAL database that a connection of another thread still
        # has open (a worker thread's) leaves its -wal and -shm naming other pages.
        with sqlite3.connect(backup) as source, sqlite3.connect(cluster.tmp / "index.db") as live:
            source.backup(live)

    return put_back_sqlite


def test_an_index_put_back_to_a_backup_starts_with_the_configuration_made_since(
    cluster: Cluster,
) -> None:
    """The index restored from a backup (SQLite) or a snapshot (Redis) taken before
    the token, the policy and the pin were made: it carries the marker, so no
    reindex runs, yet a replica starting on it has all three back at once. (Was: a
    marked index got nothing back; the token refused for good.)"""
    first = cluster.replica()
    put_back = snapshot(cluster)
    writer = configure(first)
    put_back()
    assert_configured(cluster.replica(), writer)


@REDIS_ONLY
def test_a_running_replica_restores_the_configuration_a_snapshot_lost_before_collecting(
    cluster: Cluster,
) -> None:
    """Redis restarted from a snapshot older than the token, the policy and the pin,
    under a running replica with eviction on: its next pass puts them back before it
    collects, as it puts back the entries a snapshot lost. (Was: entries only.)"""
    running = cluster.replica(eviction_interval=300)
    put_back = snapshot(cluster)
    writer = configure(running)
    put_back()
    assert client(running, writer).get(f"/v1/ns/{NS}/entries/{KEY}").status_code == 401
    done: Any = running.state.backends.maintenance.run("test")
    assert done is not None
    assert done.paused is False
    assert_configured(running, writer)
