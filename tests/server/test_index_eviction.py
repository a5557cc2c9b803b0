"""The Index contract for eviction (index/base.py): entry facts and use, deletion and
what it frees, namespaces, records, the audit log and trusted tokens, run against
every backend (the fixtures of test_indexes.py); then what only one backend promises:
SQLite's migration to version 4 and Redis's key layout."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from support.backends import IndexHandles
from support.indexes import (
    HANG_LIMIT_S,
    KEY,
    OTHER_KEY,
    entry,
    index,
    persistent_store,
    store,
    token,
)

from neffcache.server.index import (
    AuditRecord,
    EntryFacts,
    EntryStats,
    Index,
    PutResult,
    Record,
    Touch,
    sqlite_schema,
)
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.index.redis import RedisIndex
from neffcache.server.index.sqlite import SCHEMA_VERSION, SqliteIndex

__all__ = ["index", "persistent_store", "store"]  # fixtures: support/indexes.py

CREATED = 1_712_000_000.125
# A key that no entry ever had: what an alias left behind by older data names.
GONE_KEY = "ee" * 32
DIGEST_A = "a1" * 32
DIGEST_B = "b2" * 32


def manifest(
    files: dict[str, tuple[int, str]] | None = None,
    *,
    seconds: float | None = 812.5,
    version: str | None = "2.20.9961.0",
    model: str | None = "llama-70b",
    salt: str = "",
) -> str:
    """A canonical manifest: ``files`` maps a name to (size, digest)."""
    raw: dict[str, Any] = {
        "files": {n: {"size": s, "digest": d} for n, (s, d) in (files or {}).items()}
    }
    if seconds is not None:
        raw["compile_seconds"] = seconds
    if version is not None:
        raw["components"] = {"compiler_version": version}
    if model is not None:
        raw["model"] = model
    if salt:
        raw["salt"] = salt
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))


# Two files share a blob: counted in size, referenced once.
FULL = manifest({"a.neff": (1000, DIGEST_B), "b.json": (24, DIGEST_A), "c.neff": (5, DIGEST_B)})
FULL_FACTS = EntryFacts(
    size=1029,
    compile_seconds=812.5,
    compiler_version="2.20.9961.0",
    model="llama-70b",
    digests=(DIGEST_A, DIGEST_B),
)
BARE = manifest(seconds=None, version=None, model=None)
BARE_FACTS = EntryFacts(size=0, compile_seconds=None, compiler_version="", model="", digests=())


def stats_of(index: Index, namespace: str = "team-a") -> dict[str, EntryStats]:
    return {s.key: s for s in index.entry_stats(namespace, None, 1000)}


def one_stats(index: Index, key: str = KEY, namespace: str = "team-a") -> EntryStats:
    found = stats_of(index, namespace)
    assert key in found, sorted(found)
    return found[key]


def plant_alias(handle: Index, namespace: str, alias: str, key: str) -> None:
    """Write an alias naming ``key`` behind the index's back, as data from before
    ``delete_entry`` (or a backend's older layout) can leave one naming a lost entry."""
    if isinstance(handle, MemoryIndex):
        handle._aliases[(namespace, alias)] = key
    elif isinstance(handle, SqliteIndex):
        with sqlite3.connect(handle._path) as conn:
            conn.execute("INSERT INTO aliases VALUES (?, ?, ?)", (namespace, alias, key))
        conn.close()
    else:
        assert isinstance(handle, RedisIndex)
        handle._redis.set(f"neffcache:alias:{namespace}:{alias}", key)


# --- facts and stats -------------------------------------------------------------------


def test_put_entry_stores_the_facts_of_its_manifest(index: Index) -> None:
    assert index.put_entry(entry(KEY, FULL, writer="tok9"), ()) is PutResult.CREATED
    assert index.put_entry(entry(OTHER_KEY, BARE, created_at=7.25), ()) is PutResult.CREATED
    assert index.entry_stats("team-a", None, 10) == [
        EntryStats("team-a", KEY, CREATED, "tok9", FULL_FACTS, CREATED, 0),
        EntryStats("team-a", OTHER_KEY, 7.25, "tok1", BARE_FACTS, 7.25, 0),
    ]


def test_non_ascii_facts_round_trip(index: Index) -> None:
    odd = manifest({"é.neff": (3, DIGEST_A)}, version="2.20 ✓", model="modèle 🚀")
    index.put_entry(entry(KEY, odd), ())
    facts = one_stats(index).facts
    assert (facts.compiler_version, facts.model, facts.size) == ("2.20 ✓", "modèle 🚀", 3)


def test_a_refused_put_changes_no_stats(index: Index) -> None:
    index.put_entry(entry(KEY, FULL, writer="first", created_at=10.5), ())
    index.touch_entries([Touch("team-a", KEY, 20.5, 3)])
    assert index.put_entry(entry(KEY, FULL, writer="again", created_at=30.5), ()) is PutResult.SAME
    assert index.put_entry(entry(KEY, BARE, created_at=40.5), ()) is PutResult.CONFLICT
    assert one_stats(index) == EntryStats("team-a", KEY, 10.5, "first", FULL_FACTS, 20.5, 3)


def test_entry_stats_pages_like_list_entries(index: Index) -> None:
    keys = sorted(f"{i:02x}" * 32 for i in (7, 3, 250, 16, 1, 99, 42))
    for i, key in enumerate(keys):
        index.put_entry(entry(key, manifest({"x": (i, DIGEST_A)})), ())
    index.put_entry(entry(KEY, FULL, namespace="team-b"), ())
    pages: list[list[str]] = []
    after: str | None = None
    while page := index.entry_stats("team-a", after, 3):
        pages.append([s.key for s in page])
        after = page[-1].key
    assert pages == [keys[0:3], keys[3:6], keys[6:7]]
    # Each entry's own facts, not a neighbour's.
    assert [s.facts.size for s in index.entry_stats("team-a", None, 100)] == list(range(7))
    assert index.entry_stats("team-a", "ff" * 32, 5) == []
    assert index.entry_stats("team-c", None, 5) == []
    assert [s.key for s in index.entry_stats("team-b", None, 5)] == [KEY]


# --- touches ---------------------------------------------------------------------------


def test_touch_keeps_the_latest_access_and_counts_hits(index: Index) -> None:
    index.put_entry(entry(KEY, FULL, created_at=100.0), ())
    index.put_entry(entry(OTHER_KEY, BARE, created_at=100.0), ())
    index.put_entry(entry(KEY, FULL, namespace="team-b", created_at=100.0), ())
    index.touch_entries(
        [
            Touch("team-a", KEY, 150.5, 2),
            Touch("team-a", KEY, 120.0, 1),  # earlier, reported late: counted, not later
            Touch("team-b", KEY, 90.0, 4),  # before its publish: last_access stays
        ]
    )
    index.touch_entries([Touch("team-a", OTHER_KEY, 101.0, 1)])
    index.touch_entries([])
    assert (one_stats(index).last_access, one_stats(index).hits) == (150.5, 3)
    other = one_stats(index, OTHER_KEY)
    assert (other.last_access, other.hits) == (101.0, 1)
    b = one_stats(index, KEY, "team-b")
    assert (b.last_access, b.hits) == (100.0, 4)


def test_touch_times_keep_every_bit(index: Index) -> None:
    # Backends that pass times as text must not round them (Lua prints 14 digits).
    created = 1_712_000_000.123456
    later = math.nextafter(created, math.inf)
    index.put_entry(entry(created_at=created), ())
    index.touch_entries([Touch("team-a", KEY, later, 1)])
    assert one_stats(index).last_access == later
    index.touch_entries([Touch("team-a", KEY, created, 1)])
    assert one_stats(index).last_access == later


def test_touching_an_absent_entry_creates_nothing(index: Index) -> None:
    index.touch_entries([Touch("team-z", KEY, 500.0, 7), Touch("team-a", OTHER_KEY, 500.0, 1)])
    index.put_entry(entry(KEY), ())
    index.touch_entries([Touch("team-a", OTHER_KEY, 600.0, 1)])
    assert index.get_entry("team-z", KEY) is None
    assert index.get_entry("team-a", OTHER_KEY) is None
    assert index.entry_stats("team-z", None, 10) == []
    assert [s.key for s in index.entry_stats("team-a", None, 10)] == [KEY]
    assert "team-z" not in index.namespaces()
    # Published after the touches: none of them counts.
    index.put_entry(entry(OTHER_KEY, BARE, created_at=200.0), ())
    assert (one_stats(index, OTHER_KEY).last_access, one_stats(index, OTHER_KEY).hits) == (
        200.0,
        0,
    )


# --- deletion --------------------------------------------------------------------------


def test_delete_entry_needs_its_exact_created_at(index: Index) -> None:
    created = 1_712_000_000.1 + 1e-7  # a double with no short decimal form
    index.put_entry(entry(created_at=created), ("resnet",))
    assert index.delete_entry("team-a", KEY, math.nextafter(created, math.inf)) is False
    assert index.delete_entry("team-a", KEY, created - 1.0) is False
    assert index.delete_entry("team-b", KEY, created) is False
    assert index.get_entry("team-a", KEY) == entry(created_at=created)
    assert index.resolve_alias("team-a", "resnet") == KEY
    assert [s.key for s in index.entry_stats("team-a", None, 10)] == [KEY]
    assert index.delete_entry("team-a", KEY, created) is True
    assert index.get_entry("team-a", KEY) is None
    assert index.delete_entry("team-a", KEY, created) is False


def test_delete_entry_takes_its_stats_listing_and_aliases(index: Index) -> None:
    index.put_entry(entry(KEY, FULL), ("resnet", "resnet-v1"))
    index.put_entry(entry(OTHER_KEY, BARE), ("bert",))
    index.put_entry(entry(KEY, FULL, namespace="team-b"), ("resnet",))
    assert index.add_alias("team-a", "added", KEY) is PutResult.CREATED
    index.touch_entries([Touch("team-a", KEY, CREATED + 5, 9)])
    assert index.delete_entry("team-a", KEY, CREATED) is True
    for alias in ("resnet", "resnet-v1", "added"):
        assert index.resolve_alias("team-a", alias) is None
    assert [e.key for e in index.list_entries("team-a", None, 10)] == [OTHER_KEY]
    assert [s.key for s in index.entry_stats("team-a", None, 10)] == [OTHER_KEY]
    # The namespace's other entry and the other namespace keep theirs.
    assert index.resolve_alias("team-a", "bert") == OTHER_KEY
    assert index.resolve_alias("team-b", "resnet") == KEY
    assert one_stats(index, KEY, "team-b").facts == FULL_FACTS


def test_an_entry_published_again_after_deletion_starts_afresh(index: Index) -> None:
    index.put_entry(entry(KEY, FULL, created_at=10.0), ("resnet",))
    index.touch_entries([Touch("team-a", KEY, 50.0, 12)])
    assert index.delete_entry("team-a", KEY, 10.0)
    # Another manifest under the same key: a new entry, not a conflict.
    again = entry(KEY, BARE, writer="tok2", created_at=60.0)
    assert index.put_entry(again, ("resnet", "fresh")) is PutResult.CREATED
    assert index.get_entry("team-a", KEY) == again
    assert one_stats(index) == EntryStats("team-a", KEY, 60.0, "tok2", BARE_FACTS, 60.0, 0)
    assert index.resolve_alias("team-a", "resnet") == KEY
    assert index.resolve_alias("team-a", "fresh") == KEY
    # The old created_at no longer deletes it; the new one does.
    assert index.delete_entry("team-a", KEY, 10.0) is False
    assert index.delete_entry("team-a", KEY, 60.0) is True
    assert index.resolve_alias("team-a", "fresh") is None


def test_a_deleted_entrys_alias_can_name_another_entry(index: Index) -> None:
    index.put_entry(entry(KEY, FULL), ("resnet",))
    index.put_entry(entry(OTHER_KEY, BARE), ())
    assert index.add_alias("team-a", "resnet", OTHER_KEY) is PutResult.CONFLICT
    index.delete_entry("team-a", KEY, CREATED)
    assert index.add_alias("team-a", "resnet", OTHER_KEY) is PutResult.CREATED
    assert index.resolve_alias("team-a", "resnet") == OTHER_KEY


def test_put_entry_takes_an_alias_that_names_a_lost_entry(index: Index) -> None:
    plant_alias(index, "team-a", "resnet", GONE_KEY)
    assert index.resolve_alias("team-a", "resnet") == GONE_KEY
    index.put_entry(entry(KEY, FULL), ("resnet",))
    assert index.resolve_alias("team-a", "resnet") == KEY
    # An alias naming a live entry still keeps its first key.
    index.put_entry(entry(OTHER_KEY, BARE), ("resnet",))
    assert index.resolve_alias("team-a", "resnet") == KEY
    # Taken over, it is the new entry's: deleting that entry takes it.
    index.delete_entry("team-a", KEY, CREATED)
    assert index.resolve_alias("team-a", "resnet") is None


def test_add_alias_takes_an_alias_that_names_a_lost_entry(index: Index) -> None:
    index.put_entry(entry(KEY, FULL), ())
    plant_alias(index, "team-a", "resnet", GONE_KEY)
    assert index.add_alias("team-a", "resnet", KEY) is PutResult.CREATED
    assert index.resolve_alias("team-a", "resnet") == KEY
    assert index.add_alias("team-a", "resnet", KEY) is PutResult.SAME
    index.put_entry(entry(OTHER_KEY, BARE), ())
    assert index.add_alias("team-a", "resnet", OTHER_KEY) is PutResult.CONFLICT
    index.delete_entry("team-a", KEY, CREATED)
    assert index.resolve_alias("team-a", "resnet") is None
    # With no entry to name, nothing is stored, lost alias or not.
    plant_alias(index, "team-a", "bert", GONE_KEY)
    assert index.add_alias("team-a", "bert", KEY) is None
    assert index.resolve_alias("team-a", "bert") == GONE_KEY


# --- namespaces ------------------------------------------------------------------------


def test_namespaces_lists_those_holding_entries_sorted(index: Index) -> None:
    assert index.namespaces() == []
    for namespace in ("team-b", "a:b", "team-a", "team-b"):
        index.put_entry(entry(namespace=namespace), ())
    index.put_entry(entry(OTHER_KEY, BARE, namespace="gone"), ())
    index.delete_entry("gone", OTHER_KEY, CREATED)
    listed = index.namespaces()
    assert listed == sorted(listed)
    # A namespace whose entries were all deleted may be listed or not.
    assert [ns for ns in listed if ns != "gone"] == ["a:b", "team-a", "team-b"]


# --- records ---------------------------------------------------------------------------


def test_records_are_stored_replaced_and_deleted(index: Index) -> None:
    policy = Record("policy", "team-a", "", '{"max_bytes":1000}')
    assert index.get_record("policy", "team-a", "") is None
    assert index.put_record(policy) is True
    assert index.get_record("policy", "team-a", "") == policy
    newer = dataclasses.replace(policy, value='{"max_bytes":2000}')
    assert index.put_record(newer) is True
    assert index.get_record("policy", "team-a", "") == newer
    assert index.delete_record("policy", "team-a", "") is True
    assert index.get_record("policy", "team-a", "") is None
    assert index.delete_record("policy", "team-a", "") is False
    assert index.records("policy") == []


def test_create_only_never_replaces(index: Index) -> None:
    pin = Record("pin", "team-a", "release-1", '{"by":"alice"}')
    assert index.put_record(pin, create_only=True) is True
    other = dataclasses.replace(pin, value='{"by":"bob"}')
    assert index.put_record(other, create_only=True) is False
    assert index.get_record("pin", "team-a", "release-1") == pin
    # Another name, namespace or kind is another record.
    for free in (
        dataclasses.replace(other, name="release-2"),
        dataclasses.replace(other, namespace="team-b"),
        dataclasses.replace(other, kind="policy"),
    ):
        assert index.put_record(free, create_only=True) is True
        assert index.get_record(free.kind, free.namespace, free.name) == free


def test_records_are_listed_by_namespace_then_name(index: Index) -> None:
    pins = [
        Record("pin", "team-b", "zeta", "{}"),
        Record("pin", "team-a", "beta", '{"n":1}'),
        Record("pin", "team-a", "alpha", '{"n":2}'),
        Record("pin", "a:b", "c", "{}"),  # separators must not merge records
        Record("pin", "a", "b:c", '{"n":3}'),
        Record("pin", "team-a", "naïve\nname", '{"é":"🚀"}'),
    ]
    for pin in pins:
        index.put_record(pin)
    index.put_record(Record("policy", "team-a", "", "{}"))
    expected = sorted(pins, key=lambda r: (r.namespace, r.name))
    assert index.records("pin") == expected
    assert index.records("pin", "team-a") == [r for r in expected if r.namespace == "team-a"]
    assert index.records("pin", "team-c") == []
    assert index.records("policy") == [Record("policy", "team-a", "", "{}")]
    assert index.get_record("pin", "a", "b:c") == pins[4]


# --- audit log -------------------------------------------------------------------------


def audit_record(
    at: float, namespace: str = "team-a", target: str = "", **detail: Any
) -> AuditRecord:
    return AuditRecord(
        at=at,
        actor="evictor@host",
        action="evict",
        namespace=namespace,
        target=target,
        detail=json.dumps(detail, sort_keys=True, separators=(",", ":")),
    )


def test_audit_is_newest_first_and_an_instant_in_reverse_append_order(index: Index) -> None:
    first, second, third = audit_record(10.0, target="1"), audit_record(30.0), audit_record(20.0)
    index.append_audit([first, second], keep=100)
    index.append_audit([third], keep=100)
    tie_a, tie_b = audit_record(20.0, target="a"), audit_record(20.0, target="b")
    index.append_audit([tie_a, tie_b], keep=100)
    assert index.audit(0.0, None, 100) == [second, tie_b, tie_a, third, first]
    assert index.audit(0.0, None, 2) == [second, tie_b]


def test_audit_reads_since_an_instant_and_one_namespace(index: Index) -> None:
    records = [
        audit_record(10.0, "team-a"),
        audit_record(20.0, "team-b"),
        audit_record(30.0, "team-a", reason="size"),
        audit_record(40.0, "", action="server-wide"),
    ]
    index.append_audit(records, keep=100)
    assert index.audit(30.0, None, 100) == [records[3], records[2]]  # since is inclusive
    assert index.audit(0.0, "team-a", 100) == [records[2], records[0]]
    assert index.audit(15.0, "team-a", 100) == [records[2]]
    assert index.audit(0.0, "", 100) == [records[3]]
    assert index.audit(50.0, None, 100) == []
    assert index.audit(0.0, "team-c", 100) == []


def test_audit_keeps_only_the_newest(index: Index) -> None:
    index.append_audit([audit_record(float(i)) for i in range(5)], keep=3)
    assert [r.at for r in index.audit(0.0, None, 100)] == [4.0, 3.0, 2.0]
    index.append_audit([audit_record(5.0, "team-b")], keep=3)
    assert [r.at for r in index.audit(0.0, None, 100)] == [5.0, 4.0, 3.0]
    # Across namespaces: the log is trimmed as a whole.
    assert [r.at for r in index.audit(0.0, "team-a", 100)] == [4.0, 3.0]
    index.append_audit([], keep=1)
    assert [r.at for r in index.audit(0.0, None, 100)] == [5.0]


def test_audit_details_round_trip(index: Index) -> None:
    record = audit_record(1_712_000_000.123456, target=KEY, reason="café 🚀", bytes=10**12)
    index.append_audit([record], keep=10)
    (found,) = index.audit(0.0, None, 10)
    assert found == record
    assert found.as_json()["detail"] == {"reason": "café 🚀", "bytes": 10**12}


def test_audit_of_one_namespace_reads_past_many_of_others(index: Index) -> None:
    # Many records of few instants, one namespace in three: a backend that filters
    # while paging must neither repeat nor skip records of one instant across pages.
    records = [
        audit_record(float(i // 400), ("team-a", "team-b", "team-c")[i % 3], str(i))
        for i in range(1500)
    ]
    index.append_audit(records, keep=10_000)
    newest_first = list(reversed(records))
    mine = [r for r in newest_first if r.namespace == "team-b"]
    assert index.audit(0.0, "team-b", 10_000) == mine
    assert index.audit(0.0, "team-b", 120) == mine[:120]
    assert index.audit(2.0, "team-b", 10_000) == [r for r in mine if r.at >= 2.0]
    assert index.audit(0.0, None, 1000) == newest_first[:1000]


# --- tokens ----------------------------------------------------------------------------


def test_token_trust_round_trips(index: Index) -> None:
    trusted = dataclasses.replace(token("ci", 1.0), trusted=True)
    plain = token("dev", 2.0)
    index.put_token(trusted)
    index.put_token(plain)
    assert index.token_by_hash("hash-of-ci") == trusted
    assert index.token_by_hash("hash-of-dev") == plain
    assert [(t.token_id, t.trusted) for t in index.tokens()] == [("ci", True), ("dev", False)]
    index.revoke_token("ci")
    assert index.token_by_hash("hash-of-ci") == dataclasses.replace(trusted, revoked=True)


# --- replicas and races ----------------------------------------------------------------


def test_replicas_see_each_others_writes(persistent_store: IndexHandles) -> None:
    a, b = persistent_store.open(), persistent_store.open()
    a.put_entry(entry(KEY, FULL), ("resnet",))
    assert b.entry_stats("team-a", None, 10) == [
        EntryStats("team-a", KEY, CREATED, "tok1", FULL_FACTS, CREATED, 0)
    ]
    b.touch_entries([Touch("team-a", KEY, CREATED + 1, 2)])
    a.touch_entries([Touch("team-a", KEY, CREATED + 0.5, 3)])
    assert (one_stats(a).last_access, one_stats(a).hits) == (CREATED + 1, 5)
    assert b.namespaces() == ["team-a"]
    assert b.delete_entry("team-a", KEY, CREATED)
    assert a.get_entry("team-a", KEY) is None
    assert a.resolve_alias("team-a", "resnet") is None
    a.put_record(Record("pin", "team-a", "p", "{}"))
    assert b.put_record(Record("pin", "team-a", "p", '{"x":1}'), create_only=True) is False
    assert b.records("pin") == [Record("pin", "team-a", "p", "{}")]
    a.append_audit([audit_record(1.0)], keep=10)
    b.append_audit([audit_record(2.0)], keep=10)
    assert [r.at for r in a.audit(0.0, None, 10)] == [2.0, 1.0]
    a.put_token(dataclasses.replace(token("ci"), trusted=True))
    found = b.token_by_hash("hash-of-ci")
    assert found is not None
    assert found.trusted


def test_stats_survive_close_and_reopen(persistent_store: IndexHandles) -> None:
    first = persistent_store.open()
    first.put_entry(entry(KEY, FULL), ())
    first.touch_entries([Touch("team-a", KEY, CREATED + 3, 4)])
    first.close()
    again = persistent_store.open()
    assert one_stats(again) == EntryStats(
        "team-a", KEY, CREATED, "tok1", FULL_FACTS, CREATED + 3, 4
    )


def _race_touches_with_a_deletion(handles: list[Index], created: float, touchers: int) -> bool:
    """Touch (namespace team-a, KEY) from ``touchers`` threads while another deletes
    it; whether the deletion happened."""
    start = threading.Barrier(touchers + 1)

    def touch(i: int) -> None:
        start.wait(timeout=HANG_LIMIT_S)
        for n in range(5):
            handles[i % 2].touch_entries([Touch("team-a", KEY, created + n + 1, 1)])

    def delete() -> bool:
        start.wait(timeout=HANG_LIMIT_S)
        return handles[1].delete_entry("team-a", KEY, created)

    with ThreadPoolExecutor(touchers + 1) as pool:
        touched = [pool.submit(touch, i) for i in range(touchers)]
        deleted = pool.submit(delete)
        for future in touched:
            future.result(timeout=HANG_LIMIT_S)
        return deleted.result(timeout=HANG_LIMIT_S)


def test_a_touch_racing_a_deletion_never_revives_the_entry(store: IndexHandles) -> None:
    handles = [store.open(), store.open()]
    for round_ in range(20):
        created = 1000.0 + round_
        handles[0].put_entry(entry(KEY, FULL, created_at=created), ("resnet",))
        assert _race_touches_with_a_deletion(handles, created, touchers=4) is True
        for handle in handles:
            assert handle.get_entry("team-a", KEY) is None
            assert handle.entry_stats("team-a", None, 10) == []
    # Whatever the touches left, none of it reaches the next publication.
    handles[0].put_entry(entry(KEY, BARE, created_at=5000.0), ())
    assert one_stats(handles[1]) == EntryStats("team-a", KEY, 5000.0, "tok1", BARE_FACTS, 5000.0, 0)


def test_racing_deleters_have_one_winner(store: IndexHandles) -> None:
    handles = [store.open(), store.open()]
    handles[0].put_entry(entry(KEY, FULL), ("resnet",))
    start = threading.Barrier(16)

    def delete(i: int) -> bool:
        start.wait(timeout=HANG_LIMIT_S)
        return handles[i % 2].delete_entry("team-a", KEY, CREATED)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(delete, range(16), timeout=HANG_LIMIT_S))
    assert results.count(True) == 1


# --- sqlite ----------------------------------------------------------------------------


def _v3_file(path: Path, rows: list[tuple[str, str, str, float]]) -> None:
    """A file as version 3 left it, holding ``rows`` (namespace, key, manifest,
    created_at), an alias of the first and a token."""
    conn = sqlite3.connect(path)
    for step in (1, 2, 3):
        conn.executescript(sqlite_schema.STEPS[step])
    conn.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, 'tok1')", rows)
    conn.execute("INSERT INTO aliases VALUES (?, 'resnet', ?)", rows[0][:2])
    conn.execute("INSERT INTO tokens VALUES ('t1', 'hash-of-t1', 'write', '[\"*\"]', 'ci', 1.0, 0)")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()


def test_sqlite_file_from_schema_3_gets_facts_and_use(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    odd = '{"files":[1,2],"compile_seconds":"slow","components":"x","model":7}'
    _v3_file(path, [("team-a", KEY, FULL, CREATED), ("team-a", OTHER_KEY, odd, 5.5)])
    before = time.time()
    index = SqliteIndex.from_url(f"sqlite:///{path}")
    found = index.entry_stats("team-a", None, 10)
    # Last access is the upgrade: use before it was never recorded, and created_at
    # would expire every old entry at the first pass, however much it is used.
    assert all(before <= s.last_access <= time.time() for s in found)
    assert [dataclasses.replace(s, last_access=0.0) for s in found] == [
        EntryStats("team-a", KEY, CREATED, "tok1", FULL_FACTS, 0.0, 0),
        # A manifest of the wrong shape reads as unknown facts rather than failing.
        EntryStats("team-a", OTHER_KEY, 5.5, "tok1", BARE_FACTS, 0.0, 0),
    ]
    assert index.resolve_alias("team-a", "resnet") == KEY
    tokens = index.tokens()
    assert [(t.token_id, t.trusted) for t in tokens] == [("t1", False)]
    # Everything of version 4 works on the migrated file.
    index.touch_entries([Touch("team-a", KEY, CREATED + 1, 2)])
    assert one_stats(index).hits == 2
    assert index.delete_entry("team-a", KEY, CREATED)
    assert index.resolve_alias("team-a", "resnet") is None
    assert index.put_record(Record("pin", "team-a", "p", "{}"))
    index.append_audit([audit_record(1.0)], keep=5)
    assert len(index.audit(0.0, None, 5)) == 1
    index.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    conn.close()
    # Opening again at the current version runs no step twice.
    SqliteIndex.from_url(f"sqlite:///{path}").close()


def test_sqlite_backfill_reaches_every_row_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_schema, "_BACKFILL_BATCH", 3)
    rows = [
        (namespace, f"{i:064x}", manifest({"f": (i, DIGEST_A)}), float(i))
        for namespace in ("team-a", "team-b")
        for i in range(1, 9)
    ]
    _v3_file(tmp_path / "index.db", rows)
    index = SqliteIndex(tmp_path / "index.db")
    for namespace in ("team-a", "team-b"):
        found = index.entry_stats(namespace, None, 100)
        assert [s.facts.size for s in found] == list(range(1, 9))
        assert all(s.last_access > 1000 for s in found)  # the upgrade's time
    index.close()


def test_sqlite_deletes_aliases_and_reads_audit_through_indexes(tmp_path: Path) -> None:
    SqliteIndex(tmp_path / "index.db").close()
    queries = {
        "aliases_by_key": "DELETE FROM aliases WHERE namespace = 'a' AND key = 'k'",
        # The audit log's reads of one namespace, and of all (audit.py, sqlite_sequences.py).
        "sequence_items_by_group": "SELECT * FROM sequence_items WHERE log = 'audit-log'"
        " AND grp = 'a' AND at >= 0 ORDER BY at DESC, id DESC LIMIT 5",
        "sequence_items_by_time": "SELECT * FROM sequence_items WHERE log = 'audit-log'"
        " AND at >= 0 ORDER BY at DESC, id DESC LIMIT 5",
    }
    with sqlite3.connect(tmp_path / "index.db") as conn:
        for name, query in queries.items():
            plan = str(conn.execute(f"EXPLAIN QUERY PLAN {query}").fetchall())
            assert name in plan, plan
            assert "TEMP B-TREE" not in plan, plan  # the index gives the order: no sort
    conn.close()


# --- redis -----------------------------------------------------------------------------


RedisPair = tuple[RedisIndex, "redis.Redis[str]"]


@pytest.fixture
def redis_pair(redis_server: str) -> Iterator[RedisPair]:
    """An index on an empty database, and a client to look at its keys."""
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    index = RedisIndex.from_url(redis_server)
    yield index, client
    index.close()
    client.close()


def test_redis_deletion_leaves_only_the_namespace_behind(redis_pair: RedisPair) -> None:
    index, client = redis_pair
    index.put_entry(entry(KEY, FULL), ("resnet",))
    index.add_alias("team-a", "added", KEY)
    index.touch_entries([Touch("team-a", KEY, CREATED + 1, 1)])
    assert index.delete_entry("team-a", KEY, CREATED)
    assert set(client.keys("*")) == {"neffcache:namespaces", "neffcache:eviction-since"}


def test_redis_touching_an_absent_entry_writes_no_key(redis_pair: RedisPair) -> None:
    index, client = redis_pair
    index.touch_entries([Touch("team-a", KEY, 1.0, 1)] * 3)
    assert client.keys("*") == ["neffcache:eviction-since"]


def test_redis_touches_go_in_batches(
    redis_pair: RedisPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, _ = redis_pair
    monkeypatch.setattr("neffcache.server.index.entries.TOUCH_BATCH", 2)
    index.put_entry(entry(KEY, FULL, created_at=1.0), ())
    index.touch_entries([Touch("team-a", KEY, float(t), 1) for t in range(2, 9)])
    assert (one_stats(index).last_access, one_stats(index).hits) == (8.0, 7)


def test_redis_entry_from_before_stats_reads_from_its_manifest(redis_pair: RedisPair) -> None:
    # A server older than stats stored the entry key alone (simulated by removing the
    # rest): its stats come from the manifest, it counts as last served when eviction
    # data began (not when created: an upgrade must not expire every old entry), and
    # touches and deletion still work.
    index, client = redis_pair
    index.put_entry(entry(KEY, FULL, created_at=10.0), ())
    for name in ("stats", "access", "hits"):
        client.delete(f"neffcache:{name}:team-a")
    first = one_stats(index)
    since = float(client.get("neffcache:eviction-since") or 0)
    assert since > 1000
    assert first == EntryStats("team-a", KEY, 10.0, "tok1", FULL_FACTS, since, 0)
    index.touch_entries([Touch("team-a", KEY, 12.5, 1)])  # before that: stays
    assert (one_stats(index).last_access, one_stats(index).hits) == (since, 1)
    index.touch_entries([Touch("team-a", KEY, since + 2.5, 1)])
    assert (one_stats(index).last_access, one_stats(index).hits) == (since + 2.5, 2)
    assert index.delete_entry("team-a", KEY, 10.0)
    assert index.entry_stats("team-a", None, 10) == []


def test_redis_namespaces_of_a_database_from_before_are_listed(
    redis_server: str, redis_pair: RedisPair
) -> None:
    # Else the blobs of its entries would look unreferenced, and be collected.
    index, client = redis_pair
    index.put_entry(entry(KEY, FULL, created_at=10.0), ())
    client.delete("neffcache:namespaces")  # as a server older than the set left it
    fresh = RedisIndex.from_url(redis_server)  # a server started after the upgrade
    assert fresh.namespaces() == ["team-a"]
    fresh.close()


def test_redis_token_from_before_trust_is_untrusted(redis_pair: RedisPair) -> None:
    index, client = redis_pair
    # As a server from before trust stored it: a hash without "trusted".
    stored = {"secret_hash": "hash-of-old", "scope": "write", "namespaces": '["*"]'}
    stored |= {"name": "ci", "created_at": "1.5", "revoked": "0"}
    client.hset("neffcache:token:old", mapping=stored)
    client.set("neffcache:token-hash:hash-of-old", "old")
    client.zadd("neffcache:tokens", {"old": 1.5})
    found = index.token_by_hash("hash-of-old")
    assert found is not None
    assert found.trusted is False


def test_redis_audit_pages_through_instants_of_many_records(
    redis_pair: RedisPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, _ = redis_pair
    monkeypatch.setattr("neffcache.server.index.redis_sequences.PAGE", 4)
    records = [audit_record(float(i // 7), ("team-a", "team-b")[i % 2], str(i)) for i in range(60)]
    index.append_audit(records, keep=100)
    newest_first = list(reversed(records))
    assert index.audit(0.0, None, 100) == newest_first
    assert index.audit(0.0, None, 9) == newest_first[:9]
    assert index.audit(3.0, "team-a", 100) == [
        r for r in newest_first if r.namespace == "team-a" and r.at >= 3.0
    ]


@pytest.mark.parametrize("appended", [2, 30])
def test_redis_audit_read_is_not_thrown_by_appends_between_pages(
    redis_pair: RedisPair, monkeypatch: pytest.MonkeyPatch, appended: int
) -> None:
    # Appends of the instant being read sort before what was read of it and shift it
    # down the ranks: the read must neither repeat, skip nor loop on a page.
    index, _ = redis_pair
    monkeypatch.setattr("neffcache.server.index.redis_sequences.PAGE", 4)
    records = [audit_record(5.0, target=f"old{i}") for i in range(10)]
    records += [audit_record(1.0, target=f"older{i}") for i in range(3)]
    index.append_audit(records, keep=100)
    read_page = index._redis.zrevrangebyscore
    pages = 0

    def read_then_append(*args: Any, **kwargs: Any) -> Any:
        nonlocal pages
        pages += 1
        found = read_page(*args, **kwargs)
        if pages == 1:
            late = [audit_record(5.0, target=f"late{i}") for i in range(appended)]
            index.append_audit(late, keep=100)
        return found

    monkeypatch.setattr(index._redis, "zrevrangebyscore", read_then_append)
    found = index.audit(0.0, "team-a", 100)
    old = sorted(records, key=lambda r: r.at, reverse=True)  # stable: appended order
    # Appended after the read began: may be seen or not, but each at most once.
    assert [r for r in found if not r.target.startswith("late")] == [
        *reversed(old[:10]),
        *reversed(old[10:]),
    ]
    assert len({r.target for r in found}) == len(found)


def test_redis_deleting_a_key_spares_its_former_alias_now_naming_another(
    redis_pair: RedisPair,
) -> None:
    # An entry lost behind the index's back (as older data can be) leaves its alias
    # free; once another entry takes the alias, deleting the first key again (published
    # anew) must not take the alias along with it.
    index, client = redis_pair
    index.put_entry(entry(GONE_KEY, BARE, created_at=1.0), ("shared",))
    client.delete(f"neffcache:entry:team-a:{GONE_KEY}")
    index.put_entry(entry(KEY, FULL), ("shared",))
    assert index.resolve_alias("team-a", "shared") == KEY
    assert client.smembers(f"neffcache:entry-aliases:team-a:{KEY}") == {"shared"}
    index.put_entry(entry(GONE_KEY, BARE, created_at=2.0), ())
    assert index.delete_entry("team-a", GONE_KEY, 2.0)
    assert index.resolve_alias("team-a", "shared") == KEY
