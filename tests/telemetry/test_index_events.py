"""The events part of the Index contract (index/base.py: ``append_events``, ``events``,
``events_for_key``) on every backend: memory, SQLite and a real redis-server; then
what only one backend promises."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import astuple
from pathlib import Path

import pytest
import redis
from support.backends import IndexHandles
from support.indexes import index, store

import neffcache.server.index.redis_sequences as redis_module
from neffcache.server.index import Index, open_index
from neffcache.server.index.base import AuditRecord, Event, event_size
from neffcache.server.index.sqlite import SCHEMA_VERSION

KEY = "ab" * 32
OTHER_KEY = "cd" * 32
NEVER = 1e12  # an ``until`` past every event
NONE_OLD = 0.0  # a ``before`` that drops nothing by age
MANY = 1_000_000  # a ``keep`` that drops nothing by count

# ``store`` and ``index`` (support/indexes.py): each test once per kind of index.
__all__ = ["index", "store"]


def event(at: float, n: int, namespace: str = "team-a", key: str = KEY) -> Event:
    """An event whose body says which it is (``n``), so lists compare by identity."""
    kind = "graph" if key else "counters"
    return Event(at, namespace, kind, key, f'{{"n":{n}}}')


def numbers(events: list[Event]) -> list[int]:
    return [int(e.body[5:-1]) for e in events]


def read_all(
    index: Index,
    limit: int,
    namespaces: list[str] | None = None,
    since: float = 0.0,
    until: float = NEVER,
) -> list[Event]:
    """Every page in turn, checking each page's size and that the last has no cursor."""
    found: list[Event] = []
    cursor: str | None = None
    while True:
        page, cursor = index.events(since, until, namespaces, cursor, limit)
        assert len(page) <= limit
        found += page
        if cursor is None:
            return found
        assert len(page) == limit  # a cursor only after a full page


# --- order and bounds --------------------------------------------------------------------


def test_events_come_oldest_first_then_in_order_of_appending(index: Index) -> None:
    # Out of order across batches (replicas' clocks), and ties within and across them.
    index.append_events([event(20.0, 1), event(10.0, 2), event(20.0, 3)], MANY, NONE_OLD)
    index.append_events([event(15.0, 4), event(20.0, 5), event(10.0, 6)], MANY, NONE_OLD)
    page, cursor = index.events(0.0, NEVER, None, None, 100)
    assert numbers(page) == [2, 6, 4, 1, 3, 5]
    assert [e.at for e in page] == [10.0, 10.0, 15.0, 20.0, 20.0, 20.0]
    assert cursor is None


def test_events_are_stored_whole(index: Index) -> None:
    body = '{"at":1.25,"kind":"graph","model":"llama \u00e9\\n","z":[1,2]}'
    stored = [
        Event(1.25, "team-a", "graph", KEY, body),
        Event(1.25, "team-b", "counters", "", '{"counts":{"compiles":3}}'),
    ]
    index.append_events(stored, MANY, NONE_OLD)
    assert index.events(0.0, NEVER, None, None, 10) == (stored, None)


def test_since_is_inclusive_and_until_exclusive(index: Index) -> None:
    index.append_events([event(float(t), t) for t in range(10, 16)], MANY, NONE_OLD)
    page, _ = index.events(11.0, 14.0, None, None, 100)
    assert numbers(page) == [11, 12, 13]
    assert index.events(14.0, 14.0, None, None, 100) == ([], None)
    assert index.events(16.0, NEVER, None, None, 100) == ([], None)


def test_an_empty_index_has_no_events(index: Index) -> None:
    assert index.events(0.0, NEVER, None, None, 10) == ([], None)
    assert index.events(0.0, NEVER, ["team-a"], None, 10) == ([], None)
    assert index.events_for_key("team-a", KEY, 10) == []


# --- paging ------------------------------------------------------------------------------


def many(count: int) -> list[Event]:
    """Events in batches that share a time, as one request's events do, in three
    namespaces."""
    return [event(100.0 + i // 7, i, f"team-{'abc'[i % 3]}") for i in range(count)]


@pytest.mark.parametrize("limit", [1, 3, 7, 50])
def test_paging_never_repeats_nor_skips(index: Index, limit: int) -> None:
    index.append_events(many(60), MANY, NONE_OLD)
    assert numbers(read_all(index, limit)) == list(range(60))


def test_a_last_full_page_has_no_cursor(index: Index) -> None:
    index.append_events(many(10), MANY, NONE_OLD)
    first, cursor = index.events(0.0, NEVER, None, None, 5)
    assert cursor is not None
    second, cursor = index.events(0.0, NEVER, None, cursor, 5)
    assert numbers(first + second) == list(range(10))
    assert cursor is None


@pytest.mark.parametrize("limit", [1, 4, 100])
def test_paging_by_namespace(index: Index, limit: int) -> None:
    index.append_events(many(60), MANY, NONE_OLD)
    wanted = [i for i in range(60) if i % 3 != 1]  # team-a and team-c
    # A namespace named twice is read once.
    assert numbers(read_all(index, limit, ["team-c", "team-a", "team-c"])) == wanted
    assert read_all(index, limit, ["team-z"]) == []
    assert read_all(index, limit, []) == []


def test_paging_within_a_time_range(index: Index) -> None:
    index.append_events(many(60), MANY, NONE_OLD)
    inside = [i for i in range(60) if 102 <= 100 + i // 7 < 105]
    assert numbers(read_all(index, 4, None, since=102.0, until=105.0)) == inside
    assert numbers(read_all(index, 4, ["team-b"], since=102.0, until=105.0)) == [
        i for i in inside if i % 3 == 1
    ]


def test_paging_goes_on_across_appends_and_handles(store: IndexHandles) -> None:
    writer, reader = store.open(), store.open()
    writer.append_events(many(30), MANY, NONE_OLD)
    found: list[Event] = []
    cursor: str | None = None
    later = 30
    while True:
        page, cursor = reader.events(0.0, NEVER, None, cursor, 4)
        found += page
        if cursor is None:
            break
        # Events arriving meanwhile (later, or at the very time paging stands at).
        writer.append_events([event(page[-1].at, later), event(500.0, later + 1)], MANY, 0.0)
        later += 2
    seen = numbers(found)
    assert len(seen) == len(set(seen)), "an event came twice"
    assert set(range(30)) <= set(seen), "an event that existed throughout was skipped"


def test_a_cursor_survives_trimming_of_what_it_passed(index: Index) -> None:
    index.append_events(many(40), MANY, NONE_OLD)
    first, cursor = index.events(0.0, NEVER, None, None, 15)
    index.append_events([], 30, NONE_OLD)  # drops the 10 oldest, all read already
    rest = read_all_from(index, cursor, 15)
    assert numbers(first + rest) == list(range(40))


def read_all_from(index: Index, cursor: str | None, limit: int) -> list[Event]:
    found: list[Event] = []
    while cursor is not None:
        page, cursor = index.events(0.0, NEVER, None, cursor, limit)
        found += page
    return found


def test_a_foreign_cursor_is_a_value_error(index: Index) -> None:
    with pytest.raises(ValueError, match="not an events cursor"):
        index.events(0.0, NEVER, None, "not a cursor", 10)


def test_an_empty_page_is_a_value_error(index: Index) -> None:
    index.append_events(many(3), MANY, NONE_OLD)
    with pytest.raises(ValueError, match="at least 1 event"):
        index.events(0.0, NEVER, None, None, 0)


# --- retention ---------------------------------------------------------------------------


def test_events_older_than_before_are_dropped(index: Index) -> None:
    index.append_events([event(10.0, 1), event(20.0, 2, key=OTHER_KEY)], MANY, NONE_OLD)
    index.append_events([event(30.0, 3)], MANY, 20.0)
    assert numbers(read_all(index, 10)) == [2, 3]  # at == before is kept
    assert numbers(index.events_for_key("team-a", KEY, 10)) == [3]
    assert numbers(index.events_for_key("team-a", OTHER_KEY, 10)) == [2]


def test_only_the_newest_keep_events_stay(index: Index) -> None:
    # In order: times 10 (events 0, 4, 8), 11 (1, 5, 9), 12 (2, 6, 10), 13 (3, 7, 11).
    index.append_events([event(10.0 + i % 4, i) for i in range(12)], 5, NONE_OLD)
    # The newest by time, then by order of appending.
    assert numbers(read_all(index, 3)) == [6, 10, 3, 7, 11]
    index.append_events([event(50.0, 12)], 5, NONE_OLD)
    assert numbers(read_all(index, 3)) == [10, 3, 7, 11, 12]
    assert numbers(index.events_for_key("team-a", KEY, 100)) == [12, 11, 7, 3, 10]


def test_an_empty_append_only_trims(index: Index) -> None:
    index.append_events([event(float(t), t) for t in range(10)], MANY, NONE_OLD)
    index.append_events([], 6, 2.0)
    assert numbers(read_all(index, 4)) == [4, 5, 6, 7, 8, 9]
    index.append_events([], MANY, 8.0)
    assert numbers(read_all(index, 4)) == [8, 9]
    assert numbers(index.events_for_key("team-a", KEY, 10)) == [9, 8]


# --- events_for_key ----------------------------------------------------------------------


def test_events_for_key_are_newest_first_and_only_the_key(index: Index) -> None:
    index.append_events(
        [
            event(10.0, 1),
            event(12.0, 2, key=OTHER_KEY),
            event(11.0, 3, namespace="team-b"),
            event(12.0, 4),
            event(11.0, 5),  # appended later at an earlier time
            event(12.0, 6, key=""),  # no key: never listed
        ],
        MANY,
        NONE_OLD,
    )
    index.append_events([event(12.0, 7)], MANY, NONE_OLD)
    assert numbers(index.events_for_key("team-a", KEY, 10)) == [7, 4, 5, 1]
    assert numbers(index.events_for_key("team-a", KEY, 2)) == [7, 4]
    assert numbers(index.events_for_key("team-b", KEY, 10)) == [3]
    assert index.events_for_key("team-c", KEY, 10) == []
    assert index.events_for_key("team-a", "", 10) == []
    # No limit is no event on every backend (SQLite's LIMIT -1 would mean all of them).
    assert index.events_for_key("team-a", KEY, 0) == []
    assert index.events_for_key("team-a", KEY, -1) == []


def test_namespaces_that_look_alike_stay_apart(index: Index) -> None:
    # On Redis, ":" and "%" are escaped in key names, by Python and by the Lua trim.
    index.append_events(
        [event(1.0, 1, namespace="a:b", key="c"), event(1.0, 2, namespace="a", key="b:c")],
        MANY,
        NONE_OLD,
    )
    index.append_events([event(2.0, 3, namespace="a%3Ab", key="c")], MANY, NONE_OLD)
    assert numbers(index.events_for_key("a:b", "c", 10)) == [1]
    assert numbers(index.events_for_key("a", "b:c", 10)) == [2]
    index.append_events([], MANY, 1.5)
    assert index.events_for_key("a:b", "c", 10) == []
    assert numbers(index.events_for_key("a%3Ab", "c", 10)) == [3]


# --- bytes per namespace -----------------------------------------------------------------


def padded(at: float, n: int, size: int, namespace: str = "team-a", key: str = KEY) -> Event:
    """An event whose body takes exactly ``size`` bytes (at least 20) and says which
    it is (``n``)."""
    head = f'{{"n":"{n:06d}","p":"'
    return Event(at, namespace, "graph", key, head + "x" * (size - len(head) - 2) + '"}')


def which(events: list[Event]) -> list[int]:
    return [int(json.loads(e.body)["n"]) for e in events]


def stored_bytes(index: Index, namespace: str) -> int:
    """What a namespace's stored events take, counted from what a read returns."""
    return sum(event_size(e) for e in read_all(index, 500, [namespace]))


def test_events_bytes_is_the_running_total_of_each_namespace(index: Index) -> None:
    # The bytes of the body in UTF-8: "é" takes two.
    accented = Event(5.0, "team-b", "graph", KEY, '{"n":"0","raw":"é"}')
    assert event_size(accented) == len(accented.body) + 1
    index.append_events(
        [padded(float(i), i, 100 + i, key=f"{i % 3:064x}") for i in range(20)] + [accented],
        MANY,
        NONE_OLD,
    )
    assert index.events_bytes("team-a") == sum(100 + i for i in range(20))
    assert index.events_bytes("team-b") == event_size(accented)
    assert index.events_bytes("team-c") == 0
    # Retention and the count take their bytes off too.
    index.append_events([padded(30.0, 99, 50, "team-c", key="")], 12, 4.0)
    for namespace in ("team-a", "team-b", "team-c"):
        assert index.events_bytes(namespace) == stored_bytes(index, namespace)
    # 4 too old, then 6 too many: 4, 5, the one of team-b (at 5.0, appended later), 6-8.
    assert index.events_bytes("team-a") == sum(100 + i for i in range(9, 20))
    assert index.events_bytes("team-b") == 0
    index.append_events([], MANY, 1e6)  # every event too old
    assert [index.events_bytes(ns) for ns in ("team-a", "team-b", "team-c")] == [0, 0, 0]


def test_a_namespace_over_its_bytes_loses_its_oldest_and_only_it(index: Index) -> None:
    index.append_events(
        [padded(10.0 + i, i, 1000, key=f"{i % 2:064x}") for i in range(6)]
        + [padded(12.5, 50 + i, 1000, "team-b") for i in range(3)],
        MANY,
        NONE_OLD,
    )
    # team-a's new events: 8 of 1000 bytes against a bound of 4500; team-b is over
    # the bound too, but has no event in this append: it is not looked at.
    index.append_events([padded(30.0, 6, 1000), padded(30.0, 7, 1000)], MANY, NONE_OLD, 4500)
    assert which(read_all(index, 3, ["team-a"])) == [4, 5, 6, 7]  # the newest
    assert index.events_bytes("team-a") == stored_bytes(index, "team-a") == 4000
    assert which(read_all(index, 3, ["team-b"])) == [50, 51, 52]
    assert index.events_bytes("team-b") == 3000
    # What left the log left its key's events too.
    assert which(index.events_for_key("team-a", KEY, 10)) == [7, 6]
    assert which(index.events_for_key("team-a", f"{1:064x}", 10)) == [5]
    assert which(index.events_for_key("team-a", f"{0:064x}", 10)) == [4]


def test_a_batch_bounds_each_of_its_namespaces(index: Index) -> None:
    batch = [padded(1.0, i, 300, f"team-{'ab'[i % 2]}", key="") for i in range(20)]
    index.append_events(batch, MANY, NONE_OLD, 1000)
    # The last three of each, in order of appending (one time for the whole batch).
    assert which(read_all(index, 7)) == [14, 15, 16, 17, 18, 19]
    assert index.events_bytes("team-a") == index.events_bytes("team-b") == 900
    # An event over the bound by itself goes too: nothing of the namespace is over it.
    index.append_events([padded(2.0, 20, 1500, "team-a", key="")], MANY, NONE_OLD, 1000)
    assert which(read_all(index, 7, ["team-a"])) == []
    assert index.events_bytes("team-a") == 0


def test_the_byte_bound_and_the_count_bound_together(store: IndexHandles) -> None:
    # Another handle (another replica) sees the same totals.
    writer, reader = store.open(), store.open()
    for round_ in range(5):  # small events: the count binds
        small = [padded(float(round_), round_ * 10 + i, 100) for i in range(10)]
        writer.append_events(small, 25, NONE_OLD, 5000)
        assert reader.events_bytes("team-a") == stored_bytes(reader, "team-a") <= 5000
    assert which(read_all(reader, 10)) == list(range(25, 50))
    # Large ones: the count leaves 15 small and the 10 new, then the bytes the 7 newest.
    writer.append_events([padded(9.0, 50 + i, 700) for i in range(10)], 25, NONE_OLD, 5000)
    assert which(read_all(reader, 10)) == list(range(53, 60))
    assert reader.events_bytes("team-a") == stored_bytes(reader, "team-a") == 4900


# --- one backend -------------------------------------------------------------------------


def test_sqlite_keeps_its_row_count_and_reads_through_indexes(tmp_path: Path) -> None:
    index = open_index(f"sqlite:///{tmp_path}/index.db")
    index.append_events([event(float(i % 5), i) for i in range(50)], 30, 1.0)
    index.append_events([event(9.0, 50)], 20, NONE_OLD)
    index.close()
    with sqlite3.connect(tmp_path / "index.db") as conn:
        counted, kept = conn.execute(
            "SELECT (SELECT n FROM sequence_counts WHERE log = 'events'),"
            " (SELECT count(*) FROM sequence_items WHERE log = 'events')"
        ).fetchone()
        assert counted == kept == 20
        items = "FROM sequence_items WHERE log = 'events' AND"
        plans = {
            name: str(conn.execute(f"EXPLAIN QUERY PLAN {query}").fetchall())
            for name, query in {
                "sequence_items_by_time": f"SELECT * {items} at >= 0 AND at < 9"
                " ORDER BY at, id LIMIT 5",
                "sequence_items_by_group": f"SELECT * {items} grp = 'a'"
                " AND at < 9 AND (at > 1 OR (at = 1 AND id > 3)) ORDER BY at, id LIMIT 5",
                "sequence_items_by_tag": f"SELECT * {items} grp = 'a' AND tag = 'k'"
                " AND at >= 0 ORDER BY at DESC, id DESC LIMIT 5",
                # Trimming: the oldest by time, a namespace's oldest, then a range of them.
                " sequence_items_by_time": f"DELETE {items} at < 5",
                "sequence_items_by_group ": f"SELECT at, id {items} grp = 'a' ORDER BY at, id",
                " sequence_items_by_group": f"DELETE {items} grp = 'a'"
                " AND (at < 5 OR (at = 5 AND id <= 7))",
            }.items()
        }
    for name, plan in plans.items():
        assert name.strip() in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # no sort of the matching rows


def test_sqlite_paging_by_many_namespaces_reads_each_event_about_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A token of 20 namespaces, their events interleaved: a page must not read a full
    # page of every namespace (20 times what it returns), over and over.
    from neffcache.server.index.sqlite import SqliteIndex
    from neffcache.server.index.sqlite_sequences import SqliteSequences

    index = open_index(f"sqlite:///{tmp_path}/index.db")
    assert isinstance(index, SqliteIndex)
    names = [f"team-{n:02d}" for n in range(20)]
    index.append_events(
        [event(100.0 + i // 10, i, names[i % 20]) for i in range(2000)], MANY, NONE_OLD
    )
    read = [0]
    sequences = index.sequences
    assert isinstance(sequences, SqliteSequences)
    plain = sequences._read

    def counting(sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        rows = plain(sql, params)
        read[0] += len(rows)
        return rows

    monkeypatch.setattr(sequences, "_read", counting)
    assert numbers(read_all(index, 50, names[:-1])) == [i for i in range(2000) if i % 20 != 19]
    assert read[0] < 5 * 2000, read[0]  # about 50 x 20 per page of 50 without the bound
    index.close()
    with sqlite3.connect(tmp_path / "index.db") as conn:
        bounded = str(
            conn.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM sequence_items WHERE log = 'events'"
                " AND grp = 'a' AND at < 9 AND (at > 1 OR (at = 1 AND id > 3))"
                " AND (at < 5 OR (at = 5 AND id <= 7)) ORDER BY at, id LIMIT 5"
            ).fetchall()
        )
    assert "sequence_items_by_group" in bounded
    assert "TEMP B-TREE" not in bounded


def _v4_file(path: Path) -> None:
    """A file as version 4 left it, with an entry and an audit record."""
    from neffcache.server.index import sqlite_schema

    conn = sqlite3.connect(path)
    for step in (1, 2, 3, 4):
        conn.executescript(sqlite_schema.STEPS[step])
    conn.execute(
        "INSERT INTO entries (namespace, key, manifest, created_at, writer, last_access)"
        " VALUES ('team-a', ?, '{\"neff\":\"11\"}', 5.5, 'tok1', 5.5)",
        (KEY,),
    )
    conn.execute("INSERT INTO audit VALUES (1, 2.0, 'me', 'pin', 'team-a', 'p', '{}')")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()


def test_sqlite_file_from_schema_4_gains_the_events_log(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    _v4_file(path)
    index = open_index(f"sqlite:///{path}")
    entry = index.get_entry("team-a", KEY)
    assert entry is not None
    assert entry.created_at == 5.5
    assert [r.action for r in index.audit(0.0, None, 10)] == ["pin"]
    index.append_events([event(1.0, 1), event(2.0, 2)], MANY, NONE_OLD)
    index.append_events([event(3.0, 3)], 2, NONE_OLD)
    assert numbers(read_all(index, 1)) == [2, 3]
    assert numbers(index.events_for_key("team-a", KEY, 5)) == [3, 2]
    index.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (9,)
        made = {row[1] for row in conn.execute("PRAGMA index_list(sequence_items)")}
        assert {"sequence_items_by_time", "sequence_items_by_group"} <= made
        assert "sequence_items_by_tag" in made
        assert conn.execute("SELECT n FROM sequence_counts WHERE log = 'events'").fetchone() == (2,)
    # Opening again at the current version runs no step twice.
    again = open_index(f"sqlite:///{path}")
    assert numbers(read_all(again, 5)) == [2, 3]
    again.close()


def _v5_file(path: Path) -> None:
    """A file as version 5 left it, with events of two namespaces."""
    from neffcache.server.index import sqlite_schema

    conn = sqlite3.connect(path)
    for step in (1, 2, 3, 4, 5):
        conn.executescript(sqlite_schema.STEPS[step])
    conn.executemany(
        "INSERT INTO events (at, namespace, kind, key, body) VALUES (?, ?, ?, ?, ?)",
        [(e.at, e.namespace, e.kind, e.key, e.body) for e in _v5_events()],
    )
    conn.execute("UPDATE events_count SET n = 5")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA user_version = 5")
    conn.commit()
    conn.close()


def _v5_events() -> list[Event]:
    return [padded(1.0 + i, i, 200 + i, f"team-{'ab'[i % 2]}") for i in range(5)]


def test_sqlite_file_from_schema_5_sums_each_namespace_s_bytes_once(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    _v5_file(path)
    index = open_index(f"sqlite:///{path}")
    assert index.events_bytes("team-a") == 200 + 202 + 204
    assert index.events_bytes("team-b") == 201 + 203
    index.append_events([padded(9.0, 5, 300, "team-b")], MANY, NONE_OLD, 500)
    assert which(read_all(index, 10)) == [0, 2, 4, 5]
    assert index.events_bytes("team-b") == 300
    index.close()
    again = open_index(f"sqlite:///{path}")  # nothing summed twice
    assert [again.events_bytes(ns) for ns in ("team-a", "team-b")] == [606, 300]
    again.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT n FROM sequence_counts WHERE log = 'events'").fetchone() == (4,)


V8_AUDIT = [
    AuditRecord(4.0, "tok1 ci", "pin", "team-a", "resnet", '{"why":"größe"}'),
    AuditRecord(4.0, "evictor@host", "evict", "", KEY, "{}"),
]


def _v8_file(path: Path) -> str:
    """A file as version 8 left it, with the events of two namespaces; the cursor an
    events page of two handed out then."""
    from neffcache.server.index import sqlite_schema

    conn = sqlite3.connect(path)
    for step in range(1, 9):  # as migrate() runs them
        for statement in sqlite_schema.STEPS[step].split(";"):
            if statement.strip():
                conn.execute(statement)
        code = sqlite_schema._STEP_CODE.get(step)
        if code is not None:
            code(conn)
    conn.executemany(
        "INSERT INTO events (at, namespace, kind, key, body) VALUES (?, ?, ?, ?, ?)",
        [(e.at, e.namespace, e.kind, e.key, e.body) for e in _v5_events()],
    )
    conn.execute("UPDATE events_count SET n = 5")
    conn.executemany(
        "INSERT INTO audit (at, actor, action, namespace, target, detail)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [astuple(r) for r in V8_AUDIT],
    )
    conn.execute("PRAGMA user_version = 8")
    conn.commit()
    conn.close()
    return "2.0/2"  # after the second event: (at 2.0, id 2)


def test_sqlite_file_from_schema_8_moves_its_events_and_audit_to_sequences(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    cursor = _v8_file(path)
    index = open_index(f"sqlite:///{path}")
    # A cursor handed out before the upgrade resumes where it was.
    page, _ = index.events(0.0, NEVER, None, cursor, 10)
    assert which(page) == [2, 3, 4]
    assert which(read_all(index, 2, ["team-b"])) == [1, 3]
    assert [index.events_bytes(ns) for ns in ("team-a", "team-b")] == [606, 404]
    assert which(index.events_for_key("team-a", KEY, 2)) == [4, 2]
    # The audit log moved in its order: of one instant, the later appended first.
    assert index.audit(0.0, None, 10) == V8_AUDIT[::-1]
    assert index.audit(0.0, "", 10) == V8_AUDIT[1:]
    index.append_events([padded(9.0, 5, 300, "team-b")], 5, NONE_OLD)  # 6: one over
    assert which(read_all(index, 10)) == [1, 2, 3, 4, 5]
    index.close()
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert not {"events", "events_count", "events_bytes", "audit"} & tables
        assert conn.execute("SELECT n FROM sequence_counts WHERE log = 'events'").fetchone() == (5,)
        # The new event's id follows the moved ones (the audit's after them): the
        # sequence goes on.
        assert conn.execute("SELECT max(id) FROM sequence_items").fetchone() == (8,)


def test_redis_key_lists_follow_the_log_and_expire(redis_server: str) -> None:
    with redis.Redis.from_url(redis_server, decode_responses=True) as client:
        client.flushdb()
        index = open_index(redis_server)
        stored = [event(100.0 + i, i, key=f"{i % 3:064x}") for i in range(9)]
        index.append_events(stored, 5, 50.0)
        lists = sorted(client.scan_iter("neffcache:events:team-a:*"))
        assert lists == [f"neffcache:events:team-a:{i:064x}" for i in range(3)]
        # What left the log by count left its key's list too.
        assert sum(client.llen(name) for name in lists) == client.zcard("neffcache:events") == 5
        # They live as long as the batch's newest event is retained: 108 - 50 seconds.
        assert all(57_000 <= client.pttl(name) <= 58_000 for name in lists)
        index.close()


def test_redis_keeps_only_the_newest_events_of_a_key(redis_server: str) -> None:
    with redis.Redis.from_url(redis_server) as client:
        client.flushdb()
    index = open_index(redis_server)
    index.append_events([event(1.0 + i, i) for i in range(130)], MANY, NONE_OLD)
    found = numbers(index.events_for_key("team-a", KEY, 1000))
    assert found == list(range(129, 129 - redis_module.PER_TAG, -1))
    index.close()


def test_redis_drops_a_large_excess_in_bounded_steps(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with redis.Redis.from_url(redis_server) as client:
        client.flushdb()
    monkeypatch.setattr(redis_module, "TRIM_BATCH", 7)
    monkeypatch.setattr(redis_module, "APPEND_BATCH", 10)
    index = open_index(redis_server)
    index.append_events([event(float(i), i, key=f"{i % 4:064x}") for i in range(45)], MANY, 0.0)
    index.append_events([], 12, 5.0)  # 5 too old, then 28 too many: several calls
    assert numbers(read_all(index, 100)) == list(range(33, 45))
    assert sum(len(index.events_for_key("team-a", f"{k:064x}", 100)) for k in range(4)) == 12
    index.close()


def test_redis_namespace_sets_follow_the_log(redis_server: str) -> None:
    with redis.Redis.from_url(redis_server, decode_responses=True) as client:
        client.flushdb()
        index = open_index(redis_server)
        index.append_events([padded(1.0 + i, i, 100, "a:b", key="") for i in range(6)], 4, 2.0)
        # "a:b" escaped as key lists escape it; each member its sequence and bytes.
        members = client.zrange("neffcache:events-ns:a%3Ab", 0, -1, withscores=True)
        assert [(m.split()[1], score) for m, score in members] == [
            ("100", 3.0),
            ("100", 4.0),
            ("100", 5.0),
            ("100", 6.0),
        ]
        assert client.hgetall("neffcache:events-bytes") == {"a:b": "400"}
        index.append_events([], MANY, 1e6)  # all gone: so are the set and the total
        assert client.exists("neffcache:events-ns:a%3Ab", "neffcache:events-bytes") == 0
        index.close()


def test_redis_events_from_before_the_totals_are_not_counted(redis_server: str) -> None:
    # Members an older server wrote have no place in a namespace set: their bytes
    # were never counted, and leaving takes nothing off.
    with redis.Redis.from_url(redis_server, decode_responses=True) as client:
        client.flushdb()
        for i in range(3):
            old = padded(1.0 + i, i, 500)
            header = json.dumps([old.namespace, old.kind, old.key])
            client.zadd(
                "neffcache:events", {f"{i + 1:020d} {old.at!r} {header}\n{old.body}": old.at}
            )
        client.set("neffcache:events-seq", 3)
        index = open_index(redis_server)
        index.append_events([padded(9.0, 3, 300)], MANY, NONE_OLD, 1000)
        assert index.events_bytes("team-a") == 300  # the old three are not counted
        assert which(read_all(index, 10)) == [0, 1, 2, 3]
        index.append_events([padded(10.0, 4, 300)], 3, NONE_OLD, 1000)
        assert which(read_all(index, 10)) == [2, 3, 4]
        assert index.events_bytes("team-a") == 600
        index.close()


def test_redis_a_place_left_behind_is_dropped_with_its_bytes(redis_server: str) -> None:
    # An older server trims the log and leaves the namespace set alone.
    with redis.Redis.from_url(redis_server, decode_responses=True) as client:
        client.flushdb()
        index = open_index(redis_server)
        index.append_events([padded(1.0 + i, i, 400) for i in range(3)], MANY, NONE_OLD)
        client.zremrangebyrank("neffcache:events", 0, 0)
        assert index.events_bytes("team-a") == 1200
        index.append_events([padded(9.0, 3, 400)], MANY, NONE_OLD, 1000)
        assert which(read_all(index, 10)) == [2, 3]
        assert index.events_bytes("team-a") == stored_bytes(index, "team-a") == 800
        assert client.zcard("neffcache:events-ns:team-a") == 2
        index.close()


def test_redis_drops_a_namespace_s_excess_in_bounded_steps(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with redis.Redis.from_url(redis_server) as client:
        client.flushdb()
    monkeypatch.setattr(redis_module, "TRIM_BATCH", 7)
    monkeypatch.setattr(redis_module, "APPEND_BATCH", 10)
    index = open_index(redis_server)
    batch = [padded(1.0 + i // 10, i, 100, key=f"{i % 4:064x}") for i in range(45)]
    index.append_events(batch, MANY, NONE_OLD, 1200)
    assert which(read_all(index, 100)) == list(range(33, 45))
    assert index.events_bytes("team-a") == 1200
    assert sum(len(index.events_for_key("team-a", f"{k:064x}", 100)) for k in range(4)) == 12
    index.close()
