"""``reindex`` and ``fsck`` end to end, through the HTTP API, on every backend pair
(memory; filesystem + SQLite; filesystem + a real redis-server; moto's S3 + a real
redis-server, the replicas' pair).

Nothing lost: after the index is wiped (a new empty SQLite file, FLUSHDB, a new
in-memory index), ``reindex`` brings back every acknowledged entry exactly as GET
returned it before (manifest, ``created_at``, writer), every alias, token (revoked
ones stay revoked), namespace policy and pin; blob collection never runs on the
wiped index; and ``fsck`` finds and repairs each kind of damage it names."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import pytest
import redis
from fastapi.testclient import TestClient
from support.backends import backends

from neffcache.server.app import create_app
from neffcache.server.blobs import BlobStore, open_blob_store
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.deps import Backends
from neffcache.server.index import Index, open_index
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.recovery import documents as docs
from neffcache.server.recovery.durable import DurableIndex, is_complete
from neffcache.server.recovery.fsck import fsck
from neffcache.server.recovery.reindex import reindex
from neffcache.server.settings import ServerSettings

ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
# A pair whose index can be wiped and opened again: its own fixture, these backends.
BACKENDS = ["memory", "filesystem+sqlite", "filesystem+redis", "s3+redis"]


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


@dataclass
class Pair:
    """A blob store, and a way to open its index (again, after a wipe)."""

    blobs: BlobStore
    kind: str
    tmp: Path
    redis_url: str = ""
    memory: MemoryIndex | None = None

    def open_index(self) -> Index:
        if self.kind == "memory":
            assert self.memory is not None
            return self.memory
        if self.kind == "redis":
            return open_index(self.redis_url)
        return open_index(f"sqlite://{self.tmp / 'index.db'}")

    def wipe(self) -> None:
        """What losing the index looks like for each backend."""
        if self.kind == "memory":
            self.memory = MemoryIndex()
        elif self.kind == "redis":
            redis.Redis.from_url(self.redis_url).flushdb()
        else:
            for name in ("index.db", "index.db-wal", "index.db-shm"):
                (self.tmp / name).unlink(missing_ok=True)


@pytest.fixture(params=backends(*BACKENDS))
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    blob_kind, _, index_kind = request.param.partition("+")
    if blob_kind == "memory":
        found = Pair(MemoryBlobStore(), "memory", tmp_path, memory=MemoryIndex())
    else:
        url = (
            request.getfixturevalue("s3_bucket") if blob_kind == "s3" else (tmp_path / "b").as_uri()
        )
        found = Pair(open_blob_store(url), index_kind, tmp_path)
        if index_kind == "redis":
            found.redis_url = request.getfixturevalue("redis_server")
            redis.Redis.from_url(found.redis_url).flushdb()
    yield found
    found.blobs.close()


@pytest.fixture
def settings(tmp_path: Path) -> ServerSettings:
    # Collection on every pass and no grace: the setting under which a wiped index
    # would lose every blob at once if nothing guarded it.
    return ServerSettings(data_dir=tmp_path, blob_grace_seconds=0, eviction_interval_seconds=0)


class Cache:
    """An app over a pair's stores, with an admin token, driven through its API."""

    def __init__(self, pair: Pair, settings: ServerSettings, admin: str) -> None:
        self.index = pair.open_index()
        self.app = create_app(settings, blob_store=pair.blobs, index=self.index)
        self.http = TestClient(self.app)
        self.http.__enter__()
        if admin:
            self.http.headers["Authorization"] = f"Bearer {admin}"

    @property
    def backends(self) -> Backends:
        value: Backends = self.app.state.backends
        return value

    def close(self) -> None:
        self.http.__exit__(None, None, None)
        if not isinstance(self.index, MemoryIndex):
            self.index.close()

    def publish(self, namespace: str, key: str, files: dict[str, bytes], **extra: Any) -> None:
        for data in files.values():
            assert self.http.put(f"/v1/blobs/{digest(data)}", content=data).status_code in (
                200,
                201,
            )
        manifest = {
            "key": key,
            "files": {n: {"digest": digest(d), "size": len(d)} for n, d in files.items()},
            "compile_seconds": 30.0,
            **extra,
        }
        answer = self.http.put(f"/v1/ns/{namespace}/entries/{key}", json=manifest)
        assert answer.status_code == 201, answer.text

    def snapshot(self, keys: list[tuple[str, str]]) -> dict[str, Any]:
        """Everything a client or an admin can read that reindex must bring back."""
        found: dict[str, Any] = {}
        for namespace, key in keys:
            answer = self.http.get(f"/v1/ns/{namespace}/entries/{key}")
            found[f"{namespace}/{key}"] = (answer.status_code, answer.json())
        for namespace in ("team-a", "team-b"):
            alias = self.http.get(f"/v1/ns/{namespace}/aliases/{ADDRESS}")
            found[f"{namespace} address"] = (alias.status_code, alias.json().get("key"))
            policy = self.http.get(f"/v1/admin/namespaces/{namespace}").json()
            found[f"{namespace} policy"] = {k: v for k, v in policy.items() if k != "usage"}
        tokens = self.http.get("/v1/admin/tokens").json()["tokens"]
        # The bootstrap token is made again at start-up from the settings, before any
        # reindex: the same id and secret, a new creation time.
        found["tokens"] = sorted(
            (
                {k: v for k, v in t.items() if t["name"] != "bootstrap" or k != "created_at"}
                for t in tokens
            ),
            key=lambda t: str(t["token_id"]),
        )
        return found


BOOT = "nfc_bootstrap_secret_for_recovery_tests_0123456789"


def seed(cache: Cache) -> list[tuple[str, str]]:
    """Two namespaces: a policy with a quota, a pin, six entries (one with a stock
    address alias, one aliased after its publish), a write token and a revoked one."""
    http = cache.http
    assert (
        http.post("/v1/admin/namespaces/team-a", json={"quota_bytes": 1 << 30}).status_code == 201
    )
    pin = {"kind": "model", "value": "llama", "reason": "release"}
    assert http.put("/v1/admin/namespaces/team-a/pins", json=pin).status_code == 201
    keys = []
    for i in range(6):
        namespace = "team-a" if i % 2 else "team-b"
        key = f"{i:x}" * 64
        extra: dict[str, Any] = {"model": "llama"}
        if i < 2:
            extra["neuron_address"] = ADDRESS
        cache.publish(
            namespace, key[:64], {"model.neff": os.urandom(2000 + i), "log": b"ok %d" % i}, **extra
        )
        keys.append((namespace, key[:64]))
    later = {"key": keys[2][1]}
    assert http.put(f"/v1/ns/{keys[2][0]}/aliases/{'e' * 64}", json=later).status_code == 201
    made = http.post(
        "/v1/admin/tokens", json={"scope": "write", "namespaces": ["team-a"], "name": "ci"}
    )
    revoked = http.post(
        "/v1/admin/tokens", json={"scope": "read", "namespaces": ["*"], "name": "old"}
    )
    assert http.delete(f"/v1/admin/tokens/{revoked.json()['token_id']}").status_code == 204
    cache.write_token = made.json()["token"]  # type: ignore[attr-defined]
    return keys


def test_a_wiped_index_comes_back_whole(pair: Pair, settings: ServerSettings) -> None:
    settings = ServerSettings(**{**settings.model_dump(), "bootstrap_admin_token": BOOT})
    before_cache = Cache(pair, settings, BOOT)
    keys = seed(before_cache)
    before = before_cache.snapshot(keys)
    write_token = before_cache.write_token  # type: ignore[attr-defined]
    before_cache.close()

    pair.wipe()
    wiped = Cache(pair, settings, BOOT)
    try:
        index = wiped.backends.index
        assert isinstance(index, DurableIndex)
        # The bootstrap token comes back by itself (settings); the rest is gone.
        assert wiped.http.get(f"/v1/ns/{keys[0][0]}/entries/{keys[0][1]}").status_code == 404
        assert not is_complete(index.inner)
        # A pass on the wiped index collects nothing, although no entry names a blob.
        stored = sorted(b.digest for b in pair.blobs.blobs())
        done = wiped.backends.maintenance.run("test")
        assert done is not None
        assert sorted(b.digest for b in pair.blobs.blobs()) == stored
        # ... because it rebuilt the index first (the evicting replica's own reindex).
        assert is_complete(index.inner)
        after = wiped.snapshot(keys)
        assert after == before
        # The write token works again; the revoked one stays revoked (in the snapshot).
        probe = os.urandom(64)
        answer = wiped.http.put(
            f"/v1/blobs/{digest(probe)}",
            content=probe,
            headers={"Authorization": f"Bearer {write_token}"},
        )
        assert answer.status_code == 201
        again = reindex(index.inner, pair.blobs, index.store)
        assert (again.restored, again.present, again.tokens, again.records) == (0, 6, 0, 0)
        assert again.conflicts == again.missing_blobs == again.damaged == []
        checked = fsck(wiped.backends)
        assert checked.orphaned == [digest(probe)]  # uploaded, never published (no grace)
        assert checked.problems == 0  # an orphan is the collector's, not damage
    finally:
        wiped.close()


def test_reindex_restores_only_entries_whose_blobs_are_all_there(
    pair: Pair, settings: ServerSettings
) -> None:
    cache = Cache(pair, settings, "")
    lost = os.urandom(3000)
    cache.publish("team-a", "1" * 64, {"model.neff": lost})
    cache.publish("team-a", "2" * 64, {"model.neff": os.urandom(3000)})
    cache.close()
    assert pair.blobs.delete(digest(lost))
    pair.wipe()
    index = pair.open_index()
    try:
        report = reindex(index, pair.blobs, cache.backends.index.store)  # type: ignore[attr-defined]
        assert report.restored == 1
        assert report.missing_blobs == [f"team-a/{'1' * 64}"]
        assert index.get_entry("team-a", "1" * 64) is None
        assert index.get_entry("team-a", "2" * 64) is not None
    finally:
        if not isinstance(index, MemoryIndex):
            index.close()


def test_reindex_keeps_the_index_row_when_it_disagrees(
    pair: Pair, settings: ServerSettings
) -> None:
    """A document whose key the index already holds under another manifest (it cannot
    happen through the API: entries are immutable) is a conflict, and the row stays."""
    cache = Cache(pair, settings, "")
    try:
        cache.publish("team-a", "1" * 64, {"model.neff": b"one"})
        index = cache.backends.index
        assert isinstance(index, DurableIndex)
        held = index.get_entry("team-a", "1" * 64)
        assert held is not None
        other = type(held)(
            held.namespace, held.key, held.manifest.replace("30.0", "31.0"), held.created_at, "x"
        )
        index.store.put_document(docs.entry_name("team-a", "1" * 64), docs.entry_document(other))
        report = reindex(index.inner, pair.blobs, index.store)
        assert report.conflicts == [f"team-a/{'1' * 64}"]
        assert index.get_entry("team-a", "1" * 64) == held
        # fsck sees the document differ from the row and writes the row's.
        found = fsck(cache.backends, repair=True)
        assert found.undocumented == [f"team-a/{'1' * 64}"]
        assert index.store.get_document(docs.entry_name("team-a", "1" * 64)) == docs.entry_document(
            held
        )
    finally:
        cache.close()


def test_fsck_finds_and_repairs_every_kind_of_damage(pair: Pair, settings: ServerSettings) -> None:
    cache = Cache(pair, settings, "")
    try:
        index = cache.backends.index
        assert isinstance(index, DurableIndex)
        assert fsck(cache.backends).problems == 0
        gone, kept, bad = os.urandom(4000), os.urandom(4000), os.urandom(4000)
        cache.publish("team-a", "1" * 64, {"model.neff": gone})  # its blob will vanish
        cache.publish("team-a", "2" * 64, {"model.neff": kept})  # its document will vanish
        cache.publish("team-a", "3" * 64, {"model.neff": bad})  # its blob will rot
        cache.publish("team-b", "4" * 64, {"model.neff": os.urandom(10)})  # row will vanish
        cache.publish("team-b", "5" * 64, {"model.neff": os.urandom(10)})  # document damaged
        orphan = os.urandom(5000)
        assert cache.http.put(f"/v1/blobs/{digest(orphan)}", content=orphan).status_code == 201
        assert pair.blobs.delete(digest(gone))
        assert index.store.delete_document(docs.entry_name("team-a", "2" * 64))
        _rot(pair.blobs, digest(bad))
        row = index.inner.get_entry("team-b", "4" * 64)
        assert row is not None
        assert index.inner.delete_entry("team-b", "4" * 64, row.created_at)
        name5 = docs.entry_name("team-b", "5" * 64)
        damaged = bytearray(index.store.get_document(name5) or b"")
        damaged[len(damaged) // 2] ^= 1
        index.store.put_document(name5, bytes(damaged))

        found = fsck(cache.backends, verify=True)
        assert found.dangling == [
            f"team-a/{'1' * 64}: {digest(gone)}",
            f"team-a/{'3' * 64}: {digest(bad)}",
        ]
        assert found.corrupt == [digest(bad)]
        assert found.orphaned == [digest(orphan)]
        assert found.undocumented == [f"team-a/{'2' * 64}"]
        assert found.unindexed == [f"team-b/{'4' * 64}"]
        assert found.damaged == [name5]
        assert found.repaired == {}  # only a report without --repair
        assert pair.blobs.size(digest(orphan)) is not None

        fixed = fsck(cache.backends, repair=True, verify=True)
        assert fixed.problems == found.problems
        assert fsck(cache.backends, verify=True).problems == 0
        get = cache.http.get
        assert get(f"/v1/ns/team-a/entries/{'1' * 64}").status_code == 404  # dangling: removed
        assert get(f"/v1/ns/team-a/entries/{'3' * 64}").status_code == 404  # rotten: removed
        assert get(f"/v1/ns/team-a/entries/{'2' * 64}").status_code == 200
        assert get(f"/v1/ns/team-b/entries/{'4' * 64}").status_code == 200  # restored
        assert get(f"/v1/ns/team-b/entries/{'5' * 64}").status_code == 200
        # Orphans are the collector's (its lease, two sightings): fsck only names them.
        assert pair.blobs.size(digest(orphan)) is not None
        assert fixed.left == 0
        assert pair.blobs.size(digest(bad)) is None  # quarantined
        assert index.store.get_document(name5) == docs.entry_document(
            index.inner.get_entry("team-b", "5" * 64)  # type: ignore[arg-type]
        )
        actions = [r["action"] for r in get("/v1/admin/audit?since=0").json()["records"]]
        assert actions.count("fsck.remove") == 2
        # Healed by the next upload: the rotten graph publishes again.
        cache.publish("team-a", "3" * 64, {"model.neff": bad})
        assert get(f"/v1/blobs/{digest(bad)}").content == bad
    finally:
        cache.close()


def _rot(blobs: BlobStore, name: str) -> None:
    """The same number of bytes, one of them changed, behind the store's back."""
    if isinstance(blobs, MemoryBlobStore):
        data = bytearray(b"".join(blobs.read(name) or []))
        data[0] ^= 1
        blobs.corrupt(name, bytes(data))
        return
    path = blobs.local_path(name)
    if path is None:  # S3: the same key written with other bytes
        data = bytearray(b"".join(blobs.read(name) or []))
        data[0] ^= 1
        client = blobs._client  # type: ignore[attr-defined]
        client.put_object(Bucket=blobs._bucket, Key=blobs._blob_key(name), Body=bytes(data))  # type: ignore[attr-defined]
        return
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))


def test_with_eviction_off_a_wiped_index_is_rebuilt_tokens_first(
    pair: Pair, settings: ServerSettings
) -> None:
    """Nothing lost, and no long outage: a wiped index lacks its tokens too (every
    client refused), so a start-up restores them at once, and the entries come back
    on the next tick of the replica that takes the evictor lease, even when eviction
    is off (and with it on, before any collection)."""
    settings = ServerSettings(**{**settings.model_dump(), "bootstrap_admin_token": BOOT})
    cache = Cache(pair, settings, BOOT)
    cache.publish("team-a", "1" * 64, {"model.neff": b"neff"})
    made = cache.http.post("/v1/admin/tokens", json={"scope": "read", "namespaces": ["team-a"]})
    reader = {"Authorization": f"Bearer {made.json()['token']}"}
    cache.close()
    pair.wipe()
    wiped = Cache(pair, settings, BOOT)
    try:
        path = f"/v1/ns/team-a/entries/{'1' * 64}"
        assert wiped.http.get(path, headers=reader).status_code == 404  # token back, entry not
        wiped.backends.maintenance.tick()
        assert wiped.http.get(path, headers=reader).status_code == 200
        # Once complete, with eviction off, no replica holds the evictor lease.
        wiped.backends.maintenance.stop()
        assert wiped.backends.maintenance.leader() is None
    finally:
        wiped.close()
