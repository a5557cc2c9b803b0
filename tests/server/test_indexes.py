"""The Index contract (index/base.py), run against every backend: memory, sqlite and a
real redis-server; then what only one backend promises, and the URL registry."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from support.backends import IndexHandles
from support.indexes import (
    BEFORE_ALL,
    HANG_LIMIT_S,
    KEY,
    OTHER_KEY,
    entry,
    failure,
    index,
    persistent_store,
    store,
    token,
)

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError
from neffcache.server.index import (
    Entry,
    Failure,
    Index,
    Lease,
    PutResult,
    open_index,
    sqlite_schema,
)
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.index.redis import RedisIndex
from neffcache.server.index.sqlite import SCHEMA_VERSION, SqliteIndex

# The contract runs once per backend: ``store``, ``persistent_store`` and ``index``.
__all__ = ["index", "persistent_store", "store"]


# --- entries --------------------------------------------------------------------------


def test_put_then_get_round_trips_every_field(index: Index) -> None:
    index.check()
    stored = entry()
    assert index.put_entry(stored, ()) is PutResult.CREATED
    assert index.get_entry("team-a", KEY) == stored


def test_identical_manifest_is_same_and_keeps_the_first_writer(index: Index) -> None:
    first = entry(writer="tok1", created_at=1.5)
    index.put_entry(first, ())
    assert index.put_entry(entry(writer="tok2", created_at=2.5), ()) is PutResult.SAME
    assert index.get_entry("team-a", KEY) == first


def test_different_manifest_conflicts_and_keeps_the_original(index: Index) -> None:
    original = entry(manifest='{"neff":"11"}')
    index.put_entry(original, ())
    assert index.put_entry(entry(manifest='{"neff":"22"}'), ()) is PutResult.CONFLICT
    assert index.get_entry("team-a", KEY) == original


def test_non_ascii_manifests_round_trip_and_compare(index: Index) -> None:
    # The redis backend compares manifests inside a Lua script.
    manifest = '{"name":"café 🚀"}'
    assert index.put_entry(entry(manifest=manifest), ()) is PutResult.CREATED
    assert index.put_entry(entry(manifest=manifest), ()) is PutResult.SAME
    assert index.put_entry(entry(manifest='{"name":"cafe 🚀"}'), ()) is PutResult.CONFLICT
    found = index.get_entry("team-a", KEY)
    assert found is not None
    assert found.manifest == manifest


def test_absent_is_none(index: Index) -> None:
    assert index.get_entry("team-a", KEY) is None
    assert index.resolve_alias("team-a", "resnet") is None
    assert index.token_by_hash("hash-of-nothing") is None
    assert index.tokens() == []


# --- aliases ---------------------------------------------------------------------------


def test_aliases_resolve_and_the_first_key_wins(index: Index) -> None:
    assert index.put_entry(entry(KEY), ("resnet", "resnet-v1")) is PutResult.CREATED
    assert index.put_entry(entry(OTHER_KEY), ("resnet", "resnet-v2")) is PutResult.CREATED
    assert index.resolve_alias("team-a", "resnet") == KEY
    assert index.resolve_alias("team-a", "resnet-v1") == KEY
    assert index.resolve_alias("team-a", "resnet-v2") == OTHER_KEY


def test_a_refused_put_stores_none_of_its_aliases(index: Index) -> None:
    index.put_entry(entry(manifest='{"neff":"11"}'), ("first",))
    assert index.put_entry(entry(manifest='{"neff":"11"}'), ("same",)) is PutResult.SAME
    assert index.put_entry(entry(manifest='{"neff":"22"}'), ("conflict",)) is PutResult.CONFLICT
    assert index.resolve_alias("team-a", "first") == KEY
    assert index.resolve_alias("team-a", "same") is None
    assert index.resolve_alias("team-a", "conflict") is None


# --- namespaces ------------------------------------------------------------------------


def test_namespaces_are_isolated(index: Index) -> None:
    a = entry(namespace="team-a", manifest='{"neff":"aa"}')
    b = entry(namespace="team-b", manifest='{"neff":"bb"}')
    assert index.put_entry(a, ("resnet",)) is PutResult.CREATED
    assert index.put_entry(b, ()) is PutResult.CREATED
    assert index.get_entry("team-a", KEY) == a
    assert index.get_entry("team-b", KEY) == b
    assert index.resolve_alias("team-b", "resnet") is None
    assert index.get_entry("team-c", KEY) is None


def test_a_separator_in_a_namespace_cannot_reach_another_namespace(index: Index) -> None:
    # Backends that join namespace and name into one string must not let
    # ("a:b", "c") and ("a", "b:c") meet.
    index.put_entry(entry("c", namespace="a:b"), ("x",))
    index.put_entry(entry("b:c", namespace="a", manifest='{"neff":"other"}'), ("b:x",))
    first = index.get_entry("a:b", "c")
    assert first is not None
    assert first.manifest == '{"neff":"11"}'
    assert index.resolve_alias("a:b", "x") == "c"
    assert index.resolve_alias("a", "b:x") == "b:c"
    assert index.get_entry("a", "b:x") is None


# --- failures --------------------------------------------------------------------------


def test_failures_round_trip_newest_first(index: Index) -> None:
    first, second, third = failure(100.0), failure(120.0), failure(110.0)
    for record in (first, second, third):
        index.put_failure(record, keep=5)
    assert index.failures("team-a", KEY, now=150.0) == [second, third, first]


def test_no_failures_is_an_empty_list(index: Index) -> None:
    assert index.failures("team-a", KEY, now=150.0) == []
    index.put_failure(failure(100.0), keep=5)
    assert index.failures("team-a", OTHER_KEY, now=150.0) == []
    assert index.failures("team-b", KEY, now=150.0) == []


def test_failures_of_namespaces_and_keys_stay_apart(index: Index) -> None:
    a = failure(100.0, '{"n":"a"}', namespace="a:b", key="c")
    b = failure(100.0, '{"n":"b"}', namespace="a", key="b:c")
    index.put_failure(a, keep=5)
    index.put_failure(b, keep=5)
    assert index.failures("a:b", "c", now=150.0) == [a]
    assert index.failures("a", "b:c", now=150.0) == [b]


def test_expired_failures_are_never_returned(index: Index) -> None:
    short, long = failure(100.0, ttl=10.0), failure(101.0, ttl=50.0)
    index.put_failure(short, keep=5)
    index.put_failure(long, keep=5)
    assert index.failures("team-a", KEY, now=109.9) == [long, short]
    assert index.failures("team-a", KEY, now=110.0) == [long]  # expires_at is exclusive
    assert index.failures("team-a", KEY, now=151.0) == []


def test_a_write_deletes_its_keys_expired_failures(index: Index) -> None:
    index.put_failure(failure(100.0, ttl=10.0), keep=5)
    index.put_failure(failure(105.0, ttl=100.0), keep=5)
    fresh = failure(120.0)
    index.put_failure(fresh, keep=5)
    # BEFORE_ALL shows what is stored: the expired record is gone, not only hidden.
    assert index.failures("team-a", KEY, now=BEFORE_ALL) == [fresh, failure(105.0, ttl=100.0)]


def test_a_write_keeps_only_the_newest_failures(index: Index) -> None:
    # Written out of order: "newest" is by created_at, not by arrival.
    for created_at in (105.0, 101.0, 108.0, 100.0, 107.0, 103.0):
        index.put_failure(failure(created_at), keep=3)
    stored = index.failures("team-a", KEY, now=BEFORE_ALL)
    assert [f.created_at for f in stored] == [108.0, 107.0, 105.0]


def test_identical_failures_of_one_instant_are_two_records(index: Index) -> None:
    index.put_failure(failure(100.0, '{"same":1}'), keep=5)
    index.put_failure(failure(100.0, '{"same":1}'), keep=5)
    assert index.failures("team-a", KEY, now=150.0) == [failure(100.0, '{"same":1}')] * 2


def test_non_ascii_failure_records_round_trip(index: Index) -> None:
    record = failure(100.0, '{"log":"café 🚀 error: x y"}')
    index.put_failure(record, keep=5)
    assert index.failures("team-a", KEY, now=150.0) == [record]


def test_failures_never_touch_entries(index: Index) -> None:
    index.put_failure(failure(100.0), keep=5)
    assert index.get_entry("team-a", KEY) is None
    assert index.put_entry(entry(), ("resnet",)) is PutResult.CREATED
    index.put_failure(failure(101.0), keep=5)
    assert index.get_entry("team-a", KEY) == entry()
    assert len(index.failures("team-a", KEY, now=150.0)) == 2


# --- tokens ----------------------------------------------------------------------------


def test_token_round_trips_by_hash(index: Index) -> None:
    stored = token("t1", namespaces=("team-a", "team-b"))
    index.put_token(stored)
    assert index.token_by_hash("hash-of-t1") == stored
    assert index.token_by_hash("hash-of-t2") is None


def test_tokens_are_listed_oldest_first(index: Index) -> None:
    for token_id, created_at in [("t3", 30.0), ("t1", 10.0), ("t2b", 20.0), ("t2a", 20.0)]:
        index.put_token(token(token_id, created_at))
    assert [t.token_id for t in index.tokens()] == ["t1", "t2a", "t2b", "t3"]


def test_a_revoked_token_stays_visible_as_revoked(index: Index) -> None:
    index.put_token(token("t1", 1.0))
    index.put_token(token("t2", 2.0))
    assert index.revoke_token("t1") is True
    revoked = index.token_by_hash("hash-of-t1")
    assert revoked is not None
    assert revoked.revoked
    assert [(t.token_id, t.revoked) for t in index.tokens()] == [("t1", True), ("t2", False)]


def test_revoking_an_unknown_token_is_false(index: Index) -> None:
    index.put_token(token("t1"))
    assert index.revoke_token("t9") is False
    assert [t.token_id for t in index.tokens()] == ["t1"]


# --- concurrency and persistence -------------------------------------------------------


def test_racing_writers_of_one_key_have_one_winner(store: IndexHandles) -> None:
    writers = 50
    # Two handles: for sqlite and redis, two processes (replicas) sharing one store.
    handles = [store.open(), store.open()]
    barrier = threading.Barrier(writers)

    def put(i: int) -> PutResult:
        barrier.wait(timeout=HANG_LIMIT_S)
        racer = entry(manifest=f'{{"n":{i}}}', writer=f"w{i}")
        return handles[i % 2].put_entry(racer, (f"alias{i}",))

    with ThreadPoolExecutor(max_workers=writers) as pool:
        results = list(pool.map(put, range(writers), timeout=HANG_LIMIT_S))

    winners = [i for i, result in enumerate(results) if result is PutResult.CREATED]
    assert len(winners) == 1
    (winner,) = winners
    # Every manifest differs, so no loser can see SAME.
    assert results.count(PutResult.CONFLICT) == writers - 1
    for handle in handles:
        found = handle.get_entry("team-a", KEY)
        assert found is not None
        assert (found.manifest, found.writer) == (f'{{"n":{winner}}}', f"w{winner}")
    aliases = {i: handles[0].resolve_alias("team-a", f"alias{i}") for i in range(writers)}
    assert aliases == {i: KEY if i == winner else None for i in range(writers)}


def test_racing_failure_writers_never_exceed_keep(store: IndexHandles) -> None:
    writers, keep = 20, 5
    handles = [store.open(), store.open()]
    barrier = threading.Barrier(writers)

    def put(i: int) -> None:
        barrier.wait(timeout=HANG_LIMIT_S)
        handles[i % 2].put_failure(failure(1000.0 + i), keep=keep)

    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(put, range(writers), timeout=HANG_LIMIT_S))

    # Each write keeps the newest `keep` of what it sees, so whatever the interleaving
    # the survivors are the newest `keep` of all.
    newest = [1000.0 + i for i in reversed(range(writers - keep, writers))]
    for handle in handles:
        stored = handle.failures("team-a", KEY, now=BEFORE_ALL)
        assert [f.created_at for f in stored] == newest


def test_data_survives_close_and_reopen(persistent_store: IndexHandles) -> None:
    first = persistent_store.open()
    first.put_entry(entry(), ("resnet",))
    first.put_token(token("t1"))
    first.revoke_token("t1")
    first.put_failure(failure(100.0), keep=5)
    first.close()

    again = persistent_store.open()
    assert again.get_entry("team-a", KEY) == entry()
    assert again.resolve_alias("team-a", "resnet") == KEY
    assert again.tokens() == [dataclasses.replace(token("t1"), revoked=True)]
    assert again.failures("team-a", KEY, now=150.0) == [failure(100.0)]


# --- sqlite ----------------------------------------------------------------------------


def test_sqlite_file_is_in_wal_mode_at_the_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dirs" / "index.db"
    SqliteIndex.from_url(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


# The version 1 schema as it shipped, copied here so that changes to sqlite.py cannot
# change what "a file from before" means.
_SCHEMA_V1 = """
CREATE TABLE entries (namespace TEXT NOT NULL, key TEXT NOT NULL, manifest TEXT NOT NULL,
    created_at REAL NOT NULL, writer TEXT NOT NULL, PRIMARY KEY (namespace, key));
CREATE TABLE aliases (namespace TEXT NOT NULL, alias TEXT NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (namespace, alias));
CREATE TABLE tokens (token_id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL, namespaces TEXT NOT NULL, name TEXT NOT NULL,
    created_at REAL NOT NULL, revoked INTEGER NOT NULL DEFAULT 0);
INSERT INTO entries VALUES ('team-a', '{key}', '{{"neff":"11"}}', 1712000000.125, 'tok1');
INSERT INTO aliases VALUES ('team-a', 'resnet', '{key}');
PRAGMA journal_mode = WAL;
PRAGMA user_version = 1;
"""


def test_sqlite_file_from_schema_1_is_migrated_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V1.format(key=KEY))
    conn.close()
    index = SqliteIndex.from_url(f"sqlite:///{path}")
    assert index.get_entry("team-a", KEY) == entry()
    assert index.resolve_alias("team-a", "resnet") == KEY
    index.put_failure(failure(100.0), keep=5)
    assert index.failures("team-a", KEY, now=150.0) == [failure(100.0)]
    index.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        # Leases and failure records live in the primitives' tables; the old ones are
        # gone, so a server of an older schema still open on the file fails closed.
        assert {"cells", "log_items", "log_items_by_score"} <= tables
        assert not {"leases", "failures", "failures_by_key"} & tables
    # Opening again at the current version runs no step twice.
    SqliteIndex.from_url(f"sqlite:///{path}").close()


def test_sqlite_reads_failures_through_their_logs_key(tmp_path: Path) -> None:
    index = SqliteIndex.from_url(f"sqlite:///{tmp_path}/index.db")
    index.close()
    with sqlite3.connect(tmp_path / "index.db") as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT item, score FROM log_items WHERE log = ? AND score > ?",
            (f"failures:team-a:{KEY}", 0.0),
        ).fetchall()
    assert "PRIMARY KEY" in str(plan)


def test_a_write_reclaims_expired_failures_of_every_key(tmp_path: Path) -> None:
    # Redis reclaims by key expiry instead (test_redis_failure_keys_expire).
    for each in (MemoryIndex(), SqliteIndex.from_url(f"sqlite:///{tmp_path}/index.db")):
        each.put_failure(failure(100.0, key=OTHER_KEY, ttl=10.0), keep=5)
        each.put_failure(failure(200.0), keep=5)
        assert each.failures("team-a", OTHER_KEY, now=BEFORE_ALL) == []
        each.close()


@pytest.mark.parametrize(
    "url", ["sqlite://index.db", "sqlite://data/index.db", "sqlite://", "sqlite:///"]
)
def test_sqlite_url_needs_an_absolute_file_path(url: str) -> None:
    with pytest.raises(ConfigError, match="absolute"):
        open_index(url)


def test_sqlite_refuses_a_file_from_a_newer_server(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match="upgrade neffcache"):
        SqliteIndex.from_url(f"sqlite:///{path}")


def test_sqlite_errors_become_store_errors(tmp_path: Path) -> None:
    # A directory where the database file should be.
    (tmp_path / "index.db").mkdir()
    with pytest.raises(StoreError, match="sqlite index"):
        SqliteIndex.from_url(f"sqlite:///{tmp_path}/index.db")


# --- redis -----------------------------------------------------------------------------


def test_redis_keys_follow_the_documented_layout(redis_server: str) -> None:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    index = RedisIndex.from_url(redis_server)
    index.put_entry(entry(), ("resnet",))
    index.put_token(token("t1"))
    index.put_failure(failure(time.time()), keep=5)
    index.close()
    assert set(client.keys("*")) == {
        f"neffcache:entry:team-a:{KEY}",
        "neffcache:keys:team-a",
        "neffcache:stats:team-a",
        "neffcache:access:team-a",
        "neffcache:hits:team-a",
        "neffcache:namespaces",
        f"neffcache:entry-aliases:team-a:{KEY}",
        f"neffcache:failures:team-a:{KEY}",
        "neffcache:alias:team-a:resnet",
        "neffcache:token-records",
        "neffcache:tokens",  # says where tokens went, for servers from before the map
    }
    client.close()


def test_redis_failure_keys_expire(redis_server: str) -> None:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    index = RedisIndex.from_url(redis_server)
    name = f"neffcache:failures:team-a:{KEY}"
    now = time.time()
    index.put_failure(failure(now, ttl=60.0), keep=5)
    assert 59_000 < client.pttl(name) <= 60_000
    # A record with a shorter life does not shorten the key's.
    index.put_failure(failure(now, ttl=0.2), keep=5)
    assert client.pttl(name) > 59_000
    client.flushdb()
    index.put_failure(failure(now, ttl=0.2), keep=5)
    assert 0 < client.pttl(name) <= 201  # rounded up, never shorter than the record
    time.sleep(0.3)
    assert client.exists(name) == 0
    index.close()
    client.close()


def test_a_dead_redis_fails_fast_with_store_error(unused_port: int) -> None:
    index = RedisIndex.from_url(f"redis://:s3cret@127.0.0.1:{unused_port}/0")
    calls: list[Callable[[], object]] = [
        index.check,
        lambda: index.get_entry("team-a", KEY),
        lambda: index.put_entry(entry(), ()),
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(StoreError) as raised:
            call()
        assert time.monotonic() - started < HANG_LIMIT_S / 2  # a refusal takes ms
        assert "s3cret" not in str(raised.value)
    index.close()


def test_redis_url_with_a_bad_port_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="redis://host:port/db"):
        open_index("redis://127.0.0.1:notaport/0")


# --- registry --------------------------------------------------------------------------


def test_unknown_scheme_is_a_config_error_naming_the_schemes() -> None:
    with pytest.raises(ConfigError, match="mysql") as raised:
        open_index("mysql://x")
    assert "sqlite:///" in str(raised.value)
    assert "redis://" in str(raised.value)


def test_each_scheme_opens_its_backend(tmp_path: Path, unused_port: int) -> None:
    opened = [
        open_index(f"sqlite:///{tmp_path}/index.db"),
        open_index(f"redis://127.0.0.1:{unused_port}/0"),  # connects on first use
        open_index("memory://"),
    ]
    assert [type(each) for each in opened] == [SqliteIndex, RedisIndex, MemoryIndex]
    for each in opened:
        each.close()


def test_memory_failure_bookkeeping_grows_with_records_not_writes() -> None:
    # Not one heap item per write, trimmed or not: the bookkeeping follows the records.
    from neffcache.server.index.memory import MemoryIndex

    index = MemoryIndex()
    for i in range(2000):
        index.put_failure(Failure("ns", "a" * 64, f'{{"i":{i}}}', 1000.0 + i, 5000.0 + i), keep=5)
    assert len(index.failures("ns", "a" * 64, now=1000.0)) == 5
    assert len(index.logs._expiries) <= 2 * 5 + 64


# --- listing ---------------------------------------------------------------------------

# Keys out of order on purpose, and two sharing a long prefix.
LISTED = ["9c" * 32, "0a" * 32, "f1" * 32, "30" * 32, "30" * 31 + "31", "0b" * 32, "77" * 32]


def fill(index: Index, namespace: str = "team-a", keys: list[str] = LISTED) -> list[Entry]:
    stored = [
        entry(k, f'{{"k":"{k[:4]}"}}', namespace=namespace, created_at=1.5 + i)
        for i, k in enumerate(keys)
    ]
    for one in stored:
        assert index.put_entry(one, ()) is PutResult.CREATED
    return sorted(stored, key=lambda e: e.key)


def test_listing_is_in_ascending_key_order_with_every_field(index: Index) -> None:
    expected = fill(index)
    assert index.list_entries("team-a", None, 100) == expected
    assert [e.key for e in expected] == sorted(LISTED)


def test_listing_pages_by_the_last_key_without_repeats_or_gaps(index: Index) -> None:
    expected = fill(index)
    pages, after = [], None
    while True:
        page = index.list_entries("team-a", after, 3)
        assert len(page) <= 3
        if not page:
            break
        pages.append(page)
        after = page[-1].key
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [e for p in pages for e in p] == expected


def test_listing_starts_after_a_key_that_is_not_there(index: Index) -> None:
    fill(index)
    # Between "30…30" and "30…31"; and past the last key.
    assert [e.key for e in index.list_entries("team-a", "30" * 31 + "30f", 2)] == [
        "30" * 31 + "31",
        "77" * 32,
    ]
    assert index.list_entries("team-a", "ff" * 32, 5) == []
    assert [e.key for e in index.list_entries("team-a", None, 1)] == ["0a" * 32]


def test_listing_keeps_namespaces_apart(index: Index) -> None:
    fill(index, "team-a", LISTED[:3])
    fill(index, "team-ab", LISTED[3:5])
    fill(index, "team", LISTED[5:])
    index.put_entry(entry("c", namespace="team-a:b"), ())  # a separator, as above
    assert {e.key for e in index.list_entries("team-a", None, 100)} == set(LISTED[:3])
    assert {e.key for e in index.list_entries("team-ab", None, 100)} == set(LISTED[3:5])
    assert {e.key for e in index.list_entries("team", None, 100)} == set(LISTED[5:])
    assert all(e.namespace == "team-ab" for e in index.list_entries("team-ab", None, 100))


def test_listing_an_empty_namespace_is_empty(index: Index) -> None:
    assert index.list_entries("team-a", None, 100) == []
    assert index.list_entries("team-a", KEY, 100) == []
    fill(index, "team-b")
    assert index.list_entries("team-a", None, 100) == []


def test_a_refused_put_is_listed_once_as_the_first(index: Index) -> None:
    first = entry(manifest='{"neff":"11"}', created_at=1.5)
    index.put_entry(first, ())
    assert index.put_entry(entry(manifest='{"neff":"11"}', created_at=2.5), ()) is PutResult.SAME
    assert index.put_entry(entry(manifest='{"neff":"22"}'), ()) is PutResult.CONFLICT
    assert index.list_entries("team-a", None, 100) == [first]


# --- leases ---------------------------------------------------------------------------
# Times are the real clock: Redis measures a lease's life itself.

LEASE_NAME = "ab" * 32
LEASE_ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"


def lease(
    lease_id: str = "l1" * 16,
    *,
    ttl: float = 30.0,
    name: str = LEASE_NAME,
    namespace: str = "team-a",
    expected: float | None = None,
) -> Lease:
    now = time.time()
    return Lease(namespace, name, lease_id, f"host-{lease_id[:4]} 42", now, now + ttl, expected)


def test_the_first_asker_gets_the_lease_and_the_next_sees_it(index: Index) -> None:
    first = lease("a" * 32, expected=812.5)
    assert index.acquire_lease(first) == first
    held = index.acquire_lease(lease("b" * 32))
    assert held.lease_id == "a" * 32
    assert held.holder == first.holder
    assert held.expected_seconds == 812.5
    assert not held.failed
    assert abs(held.expires_at - first.expires_at) < 1.0
    got = index.get_lease("team-a", LEASE_NAME, time.time())
    assert got is not None
    assert got.lease_id == "a" * 32


def test_an_expired_lease_is_taken_over(index: Index) -> None:
    index.acquire_lease(lease("a" * 32, ttl=0.2))
    time.sleep(0.3)
    assert index.get_lease("team-a", LEASE_NAME, time.time()) is None
    second = lease("b" * 32)
    assert index.acquire_lease(second).lease_id == "b" * 32
    assert not index.renew_lease("team-a", LEASE_NAME, "a" * 32, time.time() + 30)
    assert not index.release_lease("team-a", LEASE_NAME, "a" * 32, None)
    got = index.get_lease("team-a", LEASE_NAME, time.time())
    assert got is not None
    assert got.lease_id == "b" * 32


def test_renewing_keeps_the_lease_past_its_first_expiry(index: Index) -> None:
    index.acquire_lease(lease("a" * 32, ttl=0.5))
    for _ in range(3):
        time.sleep(0.25)
        assert index.renew_lease("team-a", LEASE_NAME, "a" * 32, time.time() + 0.5)
    assert index.acquire_lease(lease("b" * 32)).lease_id == "a" * 32
    assert not index.renew_lease("team-a", LEASE_NAME, "b" * 32, time.time() + 30)


def test_release_frees_the_name_and_only_the_holder_can(index: Index) -> None:
    index.acquire_lease(lease("a" * 32))
    assert not index.release_lease("team-a", LEASE_NAME, "b" * 32, None)
    assert index.get_lease("team-a", LEASE_NAME, time.time()) is not None
    assert index.release_lease("team-a", LEASE_NAME, "a" * 32, None)
    assert index.get_lease("team-a", LEASE_NAME, time.time()) is None
    assert not index.release_lease("team-a", LEASE_NAME, "a" * 32, None)
    assert index.acquire_lease(lease("c" * 32)).lease_id == "c" * 32


def test_a_failed_release_leaves_a_notice_nobody_holds(index: Index) -> None:
    index.acquire_lease(lease("a" * 32))
    assert index.release_lease("team-a", LEASE_NAME, "a" * 32, time.time() + 0.4)
    notice = index.get_lease("team-a", LEASE_NAME, time.time())
    assert notice is not None
    assert notice.failed
    assert notice.lease_id == "a" * 32
    # The notice blocks a new holder until it ends, and grants nothing to its writer.
    assert index.acquire_lease(lease("b" * 32)).failed
    assert not index.renew_lease("team-a", LEASE_NAME, "a" * 32, time.time() + 30)
    assert not index.release_lease("team-a", LEASE_NAME, "a" * 32, None)
    time.sleep(0.5)
    assert index.acquire_lease(lease("b" * 32)).lease_id == "b" * 32


def test_leases_of_names_and_namespaces_stay_apart(index: Index) -> None:
    index.acquire_lease(lease("a" * 32))
    assert index.acquire_lease(lease("b" * 32, namespace="team-b")).lease_id == "b" * 32
    assert index.acquire_lease(lease("c" * 32, name=LEASE_ADDRESS)).lease_id == "c" * 32
    assert index.get_lease("team-b", LEASE_ADDRESS, time.time()) is None
    assert index.release_lease("team-a", LEASE_ADDRESS, "c" * 32, None)
    got = index.get_lease("team-a", LEASE_NAME, time.time())
    assert got is not None
    assert got.lease_id == "a" * 32


def test_racing_askers_get_one_holder(store: IndexHandles) -> None:
    """32 askers on separate handles (as replicas would be): all see one holder."""
    handles = [store.open() for _ in range(8)]
    start = threading.Barrier(32)

    def ask(i: int) -> str:
        start.wait()
        return handles[i % 8].acquire_lease(lease(f"{i:032x}")).lease_id

    with ThreadPoolExecutor(32) as pool:
        holders = set(pool.map(ask, range(32)))
    assert len(holders) == 1


def test_sqlite_sweeps_expired_leases_of_other_names(tmp_path: Path) -> None:
    index = SqliteIndex(tmp_path / "index.db")
    for i in range(20):
        index.acquire_lease(lease(f"{i:032x}", ttl=0.05, name=f"{i:064x}"))
    time.sleep(0.1)
    index.acquire_lease(lease("f" * 32, name="e" * 64))
    with sqlite3.connect(tmp_path / "index.db") as conn:
        assert conn.execute("SELECT count(*) FROM cells").fetchall() == [(1,)]
    index.close()


# --- adding aliases to an existing entry ------------------------------------------------


def test_add_alias_names_an_existing_entry(index: Index) -> None:
    index.put_entry(entry(KEY), ("resnet",))
    assert index.add_alias("team-a", LEASE_ADDRESS, KEY) is PutResult.CREATED
    assert index.resolve_alias("team-a", LEASE_ADDRESS) == KEY
    assert index.add_alias("team-a", LEASE_ADDRESS, KEY) is PutResult.SAME
    assert index.add_alias("team-a", "resnet", KEY) is PutResult.SAME  # from put_entry


def test_add_alias_keeps_the_first_key(index: Index) -> None:
    index.put_entry(entry(KEY), ("resnet",))
    index.put_entry(entry(OTHER_KEY, '{"neff":"22"}'), ())
    assert index.add_alias("team-a", "resnet", OTHER_KEY) is PutResult.CONFLICT
    assert index.resolve_alias("team-a", "resnet") == KEY
    # An alias added first is kept by a later put_entry too.
    assert index.add_alias("team-a", "shared", OTHER_KEY) is PutResult.CREATED
    index.put_entry(entry("ef" * 32, '{"neff":"33"}'), ("shared",))
    assert index.resolve_alias("team-a", "shared") == OTHER_KEY


def test_add_alias_needs_the_entry_in_that_namespace(index: Index) -> None:
    assert index.add_alias("team-a", "resnet", KEY) is None
    index.put_entry(entry(KEY, namespace="team-b"), ())
    assert index.add_alias("team-a", "resnet", KEY) is None
    assert index.resolve_alias("team-a", "resnet") is None
    assert index.add_alias("team-b", "resnet", KEY) is PutResult.CREATED
    assert index.resolve_alias("team-a", "resnet") is None
    assert index.list_entries("team-a", None, 10) == []


def test_racing_alias_adders_agree_on_one_key(store: IndexHandles) -> None:
    handles = [store.open() for _ in range(8)]
    keys = [f"{i:02x}" * 32 for i in range(8)]
    for key in keys:
        handles[0].put_entry(entry(key, f'{{"k":"{key[:4]}"}}'), ())
    start = threading.Barrier(32)

    def add(i: int) -> PutResult | None:
        start.wait()
        return handles[i % 8].add_alias("team-a", "contested", keys[i % 8])

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(add, range(32)))
    assert results.count(PutResult.CREATED) == 1
    winner = handles[0].resolve_alias("team-a", "contested")
    assert winner == keys[results.index(PutResult.CREATED) % 8]
    same = [r for i, r in enumerate(results) if keys[i % 8] == winner]
    assert sorted(r.value for r in same if r is not None) == ["created", "same", "same", "same"]


def test_redis_lists_an_entry_written_before_the_listing_once_put_again(
    redis_server: str,
) -> None:
    # A server older than the listing wrote the entry without its member in
    # neffcache:keys:{ns} (simulated by removing it): putting it again lists it.
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    index = RedisIndex.from_url(redis_server)
    try:
        old, other = entry(KEY), entry(OTHER_KEY, '{"neff":"22"}')
        assert index.put_entry(old, ()) is PutResult.CREATED
        assert index.put_entry(other, ()) is PutResult.CREATED
        client.delete("neffcache:keys:team-a")
        assert index.list_entries("team-a", None, 100) == []
        assert index.put_entry(entry(KEY, created_at=9.5), ()) is PutResult.SAME
        assert index.list_entries("team-a", None, 100) == [old]
        assert index.put_entry(entry(OTHER_KEY, '{"neff":"99"}'), ()) is PutResult.CONFLICT
        assert index.list_entries("team-a", None, 100) == [old, other]
    finally:
        index.close()
        client.close()


def test_sqlite_file_from_schema_3_keeps_its_live_leases_and_failures(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    conn = sqlite3.connect(path)
    for step in (1, 2, 3):
        conn.executescript(sqlite_schema.STEPS[step])
    now = time.time()
    conn.executemany(
        "INSERT INTO leases VALUES ('team-a', ?, ?, 'host 42', ?, ?, ?, ?)",
        [
            ("live", "a" * 32, now, now + 3600, 12.5, 0),
            ("notice", "b" * 32, now, now + 3600, None, 1),
            ("gone", "c" * 32, now - 7200, now - 3600, None, 0),
        ],
    )
    live_failure = failure(now, '{"why":"oom"}')
    conn.executemany(
        "INSERT INTO failures (namespace, key, record, created_at, expires_at)"
        " VALUES ('team-a', ?, ?, ?, ?)",
        [
            (KEY, live_failure.record, now, live_failure.expires_at),
            (KEY, '{"why":"old"}', now - 7200, now - 3600),
        ],
    )
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    index = SqliteIndex.from_url(f"sqlite:///{path}")
    live = index.get_lease("team-a", "live", now)
    assert live == Lease("team-a", "live", "a" * 32, "host 42", now, now + 3600, 12.5)
    notice = index.get_lease("team-a", "notice", now)
    assert notice is not None
    assert notice.failed
    assert index.get_lease("team-a", "gone", now - 7200) is None
    assert index.acquire_lease(Lease("team-a", "live", "d" * 32, "h", now, now + 60)) == live
    assert index.failures("team-a", KEY, BEFORE_ALL) == [live_failure]
    index.close()
