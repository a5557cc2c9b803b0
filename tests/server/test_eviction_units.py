"""Unit tests of the eviction pieces: the planner's rules and ranking, pins, effective
policies, the access log and the evictor lease. The API and the real servers are
covered in tests/eviction/."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator

import blake3
import pytest

from neffcache.server.access import AccessLog
from neffcache.server.audit import AuditLog
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.blobuse import BlobUse
from neffcache.server.errors import BadRequest, StoreError
from neffcache.server.eviction.evictor import CONDEMNED, Evictor
from neffcache.server.eviction.maintenance import Maintenance
from neffcache.server.eviction.pins import Pin, Pinned, check_pin, version_matches
from neffcache.server.eviction.plan import (
    ASSUMED_COMPILE_SECONDS,
    LOW_WATER,
    assumed_seconds,
    plan_namespace,
    value,
)
from neffcache.server.index import Entry, EntryFacts, EntryStats, Touch, entry_facts
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.namespaces import NamespacePolicy, Policies, effective, store_fields
from neffcache.server.settings import ServerSettings

DAY = 86400.0
NOW = 1_800_000_000.0
HALF_LIFE = DAY


def key(n: int) -> str:
    return f"{n:064x}"


def stats(
    n: int,
    *,
    size: int = 1000,
    seconds: float | None = 60.0,
    version: str = "2.21.1.0",
    model: str = "",
    last: float = NOW,
    hits: int = 0,
) -> EntryStats:
    facts = EntryFacts(size, seconds, version, model, (key(1000 + n),))
    return EntryStats("ns", key(n), last - 1, "writer", facts, last, hits)


def policy(**fields: object) -> NamespacePolicy:
    return NamespacePolicy(namespace="ns", **fields)


NO_PINS: frozenset[EntryStats] = frozenset()


# --- entry facts


def test_entry_facts_read_the_manifest() -> None:
    manifest = json.dumps(
        {
            "key": key(1),
            "files": {
                "model.neff": {"digest": "bb" * 32, "size": 300},
                "model.hlo_module.pb": {"digest": "aa" * 32, "size": 200},
                "copy.neff": {"digest": "bb" * 32, "size": 300},
            },
            "compile_seconds": 812.5,
            "components": {"compiler_version": "2.21.1.0"},
            "model": "llama",
        }
    )
    facts = entry_facts(manifest)
    assert facts == EntryFacts(800, 812.5, "2.21.1.0", "llama", ("aa" * 32, "bb" * 32))


@pytest.mark.parametrize(
    "manifest",
    ["not json", "[]", '{"files": 3}', '{"files": {"a": {"size": "x"}}, "compile_seconds": true}'],
)
def test_entry_facts_of_odd_manifests_are_unknowns_not_errors(manifest: str) -> None:
    facts = entry_facts(manifest)
    assert facts.size == 0
    assert facts.compile_seconds is None
    assert facts.compiler_version == ""


# --- the rules


def test_expiry_uses_last_access_and_spares_pins() -> None:
    old = stats(1, last=NOW - 31 * DAY)
    pinned_old = stats(2, last=NOW - 40 * DAY)
    fresh = stats(3, last=NOW - 29 * DAY)
    plan = plan_namespace(
        [old, pinned_old, fresh], policy(ttl_seconds=30 * DAY), {pinned_old}, NOW, HALF_LIFE
    )
    assert [(v.stats.key, v.reason) for v in plan.victims] == [(old.key, "expired")]
    assert "31.0 days" in plan.victims[0].why


def test_no_ttl_expires_nothing() -> None:
    ancient = stats(1, last=NOW - 3000 * DAY)
    assert (
        plan_namespace([ancient], policy(ttl_seconds=None), NO_PINS, NOW, HALF_LIFE).victims == []
    )


def test_compiler_retention_keeps_the_most_recently_used_versions() -> None:
    entries = [
        stats(1, version="2.19.0.0", last=NOW - 1 * DAY),  # an old compiler, used yesterday
        stats(2, version="2.20.0.0", last=NOW - 9 * DAY),
        stats(3, version="2.21.0.0", last=NOW - 2 * DAY),
        stats(4, version="", last=NOW - 20 * DAY),  # unknown version: never retired
    ]
    plan = plan_namespace(entries, policy(compiler_versions=2), NO_PINS, NOW, HALF_LIFE)
    assert [(v.stats.key, v.reason) for v in plan.victims] == [(key(2), "compiler-retention")]


def test_quota_evicts_down_to_the_low_water_mark() -> None:
    entries = [stats(n, size=100, last=NOW - n) for n in range(10)]  # 1000 bytes
    plan = plan_namespace(entries, policy(quota_bytes=950, ranking="lru"), NO_PINS, NOW, HALF_LIFE)
    assert plan.bytes_after <= 950 * LOW_WATER
    assert plan.bytes_after > 950 * LOW_WATER - 100  # no more than needed
    # LRU: the least recently served first.
    assert [v.stats.key for v in plan.victims] == [key(9), key(8)]
    assert {v.reason for v in plan.victims} == {"quota"}


def test_value_keeps_the_long_compile_of_the_same_size_and_use() -> None:
    forty_minutes = stats(1, seconds=2400, last=NOW - 3600)
    ten_seconds = stats(2, seconds=10, last=NOW)  # even used more recently
    plan = plan_namespace(
        [forty_minutes, ten_seconds], policy(quota_bytes=1500), NO_PINS, NOW, HALF_LIFE
    )
    assert [v.stats.key for v in plan.victims] == [ten_seconds.key]
    lru = plan_namespace(
        [forty_minutes, ten_seconds],
        policy(quota_bytes=1500, ranking="lru"),
        NO_PINS,
        NOW,
        HALF_LIFE,
    )
    assert [v.stats.key for v in lru.victims] == [forty_minutes.key]


def test_value_is_per_byte_and_decays_with_disuse() -> None:
    small = stats(1, size=1000, seconds=100)
    large = stats(2, size=100_000, seconds=100)
    assert value(small, NOW, HALF_LIFE, 60) == pytest.approx(100 * value(large, NOW, HALF_LIFE, 60))
    week_old = dataclasses.replace(small, last_access=NOW - HALF_LIFE)
    assert value(week_old, NOW, HALF_LIFE, 60) == pytest.approx(
        value(small, NOW, HALF_LIFE, 60) / 2
    )
    # Use counts, damped: 3 hits make 1 + log2(4) = 3 uses, 255 make 9.
    used = dataclasses.replace(small, hits=3)
    assert value(used, NOW, HALF_LIFE, 60) == pytest.approx(3 * value(small, NOW, HALF_LIFE, 60))
    popular = dataclasses.replace(small, hits=255)
    assert value(popular, NOW, HALF_LIFE, 60) == pytest.approx(9 * value(small, NOW, HALF_LIFE, 60))
    # A client clock ahead of the server cannot make an entry look used in the future.
    future = dataclasses.replace(small, last_access=NOW + DAY)
    assert value(future, NOW, HALF_LIFE, 60) == value(small, NOW, HALF_LIFE, 60)


def test_unknown_compile_time_counts_at_the_namespace_median() -> None:
    entries = [stats(1, seconds=10), stats(2, seconds=30), stats(3, seconds=None)]
    assert assumed_seconds(entries) == 20
    assert assumed_seconds([stats(1, seconds=None)]) == ASSUMED_COMPILE_SECONDS


def test_pinned_bytes_count_but_are_never_chosen() -> None:
    pinned = stats(1, size=900)
    other = stats(2, size=200)
    plan = plan_namespace([pinned, other], policy(quota_bytes=1000), {pinned}, NOW, HALF_LIFE)
    assert [v.stats.key for v in plan.victims] == [other.key]
    assert plan.pinned_bytes == 900
    assert not plan.over_quota_pinned
    alone = plan_namespace([pinned], policy(quota_bytes=800), {pinned}, NOW, HALF_LIFE)
    assert alone.victims == []
    assert alone.over_quota_pinned


def test_an_entry_is_removed_for_one_reason_only() -> None:
    entry = stats(1, version="2.19.0.0", last=NOW - 40 * DAY, size=5000)
    newer = stats(2, version="2.21.0.0", size=10)
    plan = plan_namespace(
        [entry, newer],
        policy(ttl_seconds=30 * DAY, compiler_versions=1, quota_bytes=100),
        NO_PINS,
        NOW,
        HALF_LIFE,
    )
    assert [(v.stats.key, v.reason) for v in plan.victims] == [(entry.key, "expired")]


# --- pins


def test_pin_shapes_are_checked() -> None:
    check_pin("key", key(1))
    check_pin("address", "neuronxcc-2.21.1.0+abc/MODULE_123+0a1b2c3d")
    check_pin("compiler-version", "2.21.*")
    for kind, value_ in (("key", "xyz"), ("address", "../etc"), ("model", ""), ("nope", "x")):
        with pytest.raises(BadRequest):
            check_pin(kind, value_)
    with pytest.raises(BadRequest):
        check_pin("model", "a\nb")


def test_version_patterns() -> None:
    assert version_matches("2.21.*", "2.21.18209.0+043b1bf7")
    assert version_matches("2.21.1.0", "2.21.1.0")
    assert not version_matches("2.21.*", "2.2.1")
    assert not version_matches("*", "")  # an unknown version matches nothing


def test_pinned_by_each_kind() -> None:
    index = MemoryIndex()
    manifest = json.dumps({"key": key(1), "files": {"a": {"digest": "aa" * 32, "size": 1}}})
    index.put_entry(Entry("ns", key(1), manifest, NOW, "w"), ("neuronxcc-2.1/MODULE_1+0a1b2c3d",))
    for kind, value_ in (
        ("key", key(2)),
        ("address", "neuronxcc-2.1/MODULE_1+0a1b2c3d"),
        ("model", "llama"),
        ("compiler-version", "2.20.*"),
    ):
        index.put_record(Pin("ns", kind, value_, "", "admin", NOW).record())
    pinned = Pinned(index, "ns")
    assert stats(1) in pinned  # through the address
    assert stats(2) in pinned  # by key
    assert stats(3, model="llama") in pinned
    assert stats(4, version="2.20.7.0") in pinned
    assert stats(5) not in pinned
    assert stats(5) not in Pinned(index, "other")  # pins are per namespace


# --- policies


def test_effective_policy_is_the_record_over_the_defaults() -> None:
    settings = ServerSettings(default_ttl_seconds=7 * DAY, failure_ttl_seconds=600)
    bare = effective("ns", None, settings)
    assert (bare.ttl_seconds, bare.failure_ttl_seconds, bare.created) == (7 * DAY, 600, False)
    chosen = effective("ns", {"ttl_seconds": None, "quota_bytes": 5}, settings)
    assert (chosen.ttl_seconds, chosen.quota_bytes, chosen.created) == (None, 5, True)
    assert chosen.failure_ttl_seconds == 600  # not chosen: follows the server's default


def test_policies_cache_and_forget() -> None:
    index = MemoryIndex()
    policies = Policies(index, ServerSettings(), ttl=3600)
    assert policies.get("ns").quota_bytes is None
    store_fields(index, "ns", {"quota_bytes": 10}, create=True)
    assert policies.get("ns").quota_bytes is None  # cached
    policies.forget("ns")
    assert policies.get("ns").quota_bytes == 10


def test_trusted_namespaces_read_through_only_trusted_ones() -> None:
    index = MemoryIndex()
    store_fields(
        index, "main", {"trusted_writers_only": True, "read_through": ["a", "b"]}, create=True
    )
    store_fields(index, "b", {"trusted_writers_only": True}, create=True)
    assert Policies(index, ServerSettings()).sources("main") == ["b"]


# --- access log


def test_access_log_batches_hits_and_keeps_them_on_failure() -> None:
    log = AccessLog()
    log.hit("ns", key(1), at=10.0)
    log.hit("ns", key(1), at=5.0)  # out of order: the latest wins
    log.hit("ns", key(2), at=7.0)

    class Broken(MemoryIndex):
        def touch_entries(self, touches: object) -> None:
            raise StoreError("down")

    with pytest.raises(StoreError):
        log.flush(Broken())
    log.hit("ns", key(1), at=12.0)
    touches = sorted(log.drain(), key=lambda t: t.key)
    assert touches == [Touch("ns", key(1), 12.0, 3), Touch("ns", key(2), 7.0, 1)]


def test_access_log_under_threads_counts_every_hit() -> None:
    log = AccessLog()

    def hammer() -> None:
        for _ in range(2000):
            log.hit("ns", key(1))

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [t.hits for t in log.drain()] == [8000]


# --- one evictor


def _maintenance(index: MemoryIndex, blobs: MemoryBlobStore) -> Maintenance:
    settings = ServerSettings(eviction_interval_seconds=0)
    policies = Policies(index, settings)
    evictor = Evictor(index, blobs, policies, AuditLog(index, 1000), settings, BlobUse())
    return Maintenance(index, evictor, AccessLog(), settings)


@pytest.fixture
def blobs() -> Iterator[MemoryBlobStore]:
    store = MemoryBlobStore()
    yield store
    store.close()


def test_one_replica_leads_and_another_takes_over_when_it_stops(blobs: MemoryBlobStore) -> None:
    index = MemoryIndex()
    first, second = _maintenance(index, blobs), _maintenance(index, blobs)
    assert first.lead()
    assert first.lead()
    assert not second.lead()
    assert second.run("admin") is None  # a pass only on the leader
    assert first.run("admin") is not None
    first.stop()  # releases the lease
    assert second.lead()
    assert not first.lead()


def test_label_pins_protect_only_trusted_writers_entries() -> None:
    index = MemoryIndex()
    index.put_record(Pin("ns", "model", "prod", "", "admin", NOW).record())
    index.put_record(Pin("ns", "key", key(9), "", "admin", NOW).record())
    pinned = Pinned(index, "ns", trusted_writers={"ci"})
    by_ci = dataclasses.replace(stats(1, model="prod"), writer="ci")
    by_anyone = dataclasses.replace(stats(2, model="prod"), writer="mallory")
    named = dataclasses.replace(stats(9), writer="mallory")
    assert by_ci in pinned
    assert by_anyone not in pinned  # else any writer could label its way past the quota
    assert named in pinned  # a key pin names the entry itself


def test_pin_coverage_counts_what_each_pin_protects_now() -> None:
    index = MemoryIndex()
    for kind, value_ in (("model", "prod"), ("key", key(9)), ("key", key(8))):
        index.put_record(Pin("ns", kind, value_, "", "admin", NOW).record())
    pinned = Pinned(index, "ns", trusted_writers={"ci"})
    covered = pinned.coverage(
        [
            dataclasses.replace(stats(1, model="prod"), writer="ci"),
            dataclasses.replace(stats(2, model="prod"), writer="mallory"),
            dataclasses.replace(stats(9, model="prod"), writer="mallory"),  # kept by key
        ]
    )
    assert (covered["model:prod"].protects, covered["model:prod"].unprotected) == (1, 1)
    assert covered[f"key:{key(9)}"].protects == 1
    assert covered[f"key:{key(8)}"].protects == 0  # pinned before it is published


def test_blob_use_forgets_old_uses_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("neffcache.server.blobuse.time.monotonic", lambda: now[0])
    use = BlobUse(keep_seconds=60)
    use.touch(key(n) for n in range(5000))
    now[0] += 30
    use.touch([key(1)])
    assert use.used_within(key(1), 60)
    assert use.used_within(key(2), 60)
    now[0] += 31  # key(2) is now 61 s old, key(1) 31 s
    use.touch([key(3)])
    assert use.used_within(key(1), 60)
    assert not use.used_within(key(2), 3600)  # forgotten, not only old
    assert len(use._last) == 2  # key(1) and key(3)


def test_collection_clears_its_condemned_marks(blobs: MemoryBlobStore) -> None:
    index = MemoryIndex()
    maintenance = _maintenance(index, blobs)
    maintenance.settings = ServerSettings(eviction_interval_seconds=0, blob_grace_seconds=0)
    evictor = maintenance.evictor
    evictor.settings = maintenance.settings
    staged = blobs.staging_dir() / "upload"
    staged.write_bytes(b"orphan")
    orphan = blake3.blake3(b"orphan").hexdigest()
    blobs.commit(staged, orphan)
    collected = evictor.collect_blobs()
    assert collected.blobs == 1
    assert blobs.size(orphan) is None
    assert index.records(CONDEMNED) == []
