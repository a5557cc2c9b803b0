"""The ``Catalogs`` primitive (index/catalogs.py) on every backend: what the entries
role written once over it (entries.py) relies on. Several handles on one store stand
for replicas."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.backends import IndexHandles, backends
from support.indexes import HANG_LIMIT_S, KEY, OTHER_KEY, entry

from neffcache.server.index import EntryFacts, EntryStats, Touch
from neffcache.server.index.catalogs import Catalogs

FACTS = EntryFacts(size=42, compile_seconds=1.5, compiler_version="2.20", model="m", digests=("d",))
THIRD_KEY = "ef" * 32


@pytest.fixture(params=[False, True], ids=["plain", "documented"])
def documented(request: pytest.FixtureRequest) -> bool:
    """Also run every case over the catalogs ``DurableIndex`` writes entries through,
    which must keep this whole contract while they write documents."""
    return bool(request.param)


@pytest.fixture(params=backends("memory", "sqlite", "redis"))
def handles(
    request: pytest.FixtureRequest, tmp_path: Path, documented: bool
) -> Iterator[IndexHandles]:
    store = IndexHandles(request.param, request, tmp_path / "data", documented=documented)
    yield store
    store.close()


def catalogs_of(handles: IndexHandles) -> Catalogs:
    found: Catalogs = getattr(handles.open(), "catalogs")  # noqa: B009 - not in the Index protocol
    return found


def test_put_new_stores_once_and_returns_the_row_held(handles: IndexHandles) -> None:
    catalogs = catalogs_of(handles)
    first = entry(manifest='{"neff":"é"}')
    assert catalogs.get("team-a", KEY) is None
    assert catalogs.put_new(first, FACTS, ()) is None
    assert catalogs.put_new(entry(manifest='{"neff":"2"}', writer="t2"), FACTS, ()) == first
    assert catalogs.get("team-a", KEY) == first
    assert catalogs.get("team-b", KEY) is None
    assert catalogs_of(handles).get("team-a", KEY) == first  # another handle reads it


def test_a_put_names_only_free_names_and_a_refused_put_none(handles: IndexHandles) -> None:
    catalogs = catalogs_of(handles)
    catalogs.put_new(entry(KEY), FACTS, ("shared", "mine"))
    catalogs.put_new(entry(OTHER_KEY), FACTS, ("shared", "theirs"))
    catalogs.put_new(entry(KEY, '{"other":1}'), FACTS, ("refused",))
    assert catalogs.resolve("team-a", "shared") == KEY
    assert catalogs.resolve("team-a", "theirs") == OTHER_KEY
    assert catalogs.resolve("team-a", "refused") is None
    assert catalogs.names_of("team-a", KEY) == ["mine", "shared"]
    assert catalogs.names_of("team-a", OTHER_KEY) == ["theirs"]
    assert catalogs.names_of("team-a", THIRD_KEY) == []


def test_claim_writes_a_free_name_and_says_what_it_names(handles: IndexHandles) -> None:
    catalogs = catalogs_of(handles)
    catalogs.put_new(entry(KEY), FACTS, ("taken",))
    catalogs.put_new(entry(OTHER_KEY), FACTS, ())
    assert catalogs.claim("team-a", "new", OTHER_KEY) == (True, OTHER_KEY)
    assert catalogs.claim("team-a", "new", OTHER_KEY) == (False, OTHER_KEY)
    assert catalogs.claim("team-a", "taken", OTHER_KEY) == (False, KEY)
    assert catalogs.claim("team-a", "nothing", THIRD_KEY) is None
    assert catalogs.resolve("team-a", "nothing") is None


def test_delete_if_takes_the_row_and_its_names_only_at_its_created_at(
    handles: IndexHandles,
) -> None:
    catalogs = catalogs_of(handles)
    catalogs.put_new(entry(KEY, created_at=1.0), FACTS, ("a",))
    catalogs.claim("team-a", "b", KEY)
    assert not catalogs.delete_if("team-a", KEY, 2.0)
    assert not catalogs.delete_if("team-a", OTHER_KEY, 1.0)
    assert catalogs.delete_if("team-a", KEY, 1.0)
    assert catalogs.get("team-a", KEY) is None
    assert catalogs.resolve("team-a", "a") is None
    assert catalogs.names_of("team-a", KEY) == []
    assert catalogs.stats("team-a", None, 10) == []
    assert not catalogs.delete_if("team-a", KEY, 1.0)
    # Published again: a new row with a fresh use, its names free to take.
    assert catalogs.put_new(entry(KEY, created_at=3.0), FACTS, ("a",)) is None
    assert [(s.last_access, s.hits) for s in catalogs.stats("team-a", None, 10)] == [(3.0, 0)]
    assert catalogs.resolve("team-a", "a") == KEY


def test_a_name_left_naming_a_deleted_row_is_free(handles: IndexHandles) -> None:
    catalogs = catalogs_of(handles)
    catalogs.put_new(entry(KEY, created_at=1.0), FACTS, ())
    catalogs.put_new(entry(OTHER_KEY), FACTS, ())
    catalogs.claim("team-a", "n", KEY)
    catalogs.delete_if("team-a", KEY, 1.0)
    assert catalogs.claim("team-a", "n", OTHER_KEY) == (True, OTHER_KEY)


def test_rows_and_stats_page_by_key_within_a_catalog(handles: IndexHandles) -> None:
    catalogs = catalogs_of(handles)
    for key in (THIRD_KEY, KEY, OTHER_KEY):
        catalogs.put_new(entry(key, created_at=5.0), FACTS, ())
    catalogs.put_new(entry(KEY, namespace="team-b"), FACTS, ())
    assert [r.key for r in catalogs.rows("team-a", None, 2)] == [KEY, OTHER_KEY]
    assert [r.key for r in catalogs.rows("team-a", OTHER_KEY, 2)] == [THIRD_KEY]
    assert catalogs.rows("team-a", THIRD_KEY, 2) == []
    assert catalogs.rows("nobody", None, 2) == []
    (first,) = catalogs.stats("team-a", None, 1)
    assert first == EntryStats("team-a", KEY, 5.0, "tok1", FACTS, 5.0, 0)
    assert [s.key for s in catalogs.stats("team-a", KEY, 5)] == [OTHER_KEY, THIRD_KEY]
    assert catalogs.catalogs() == ["team-a", "team-b"]


def test_touches_keep_the_latest_access_and_count_hits(handles: IndexHandles) -> None:
    catalogs = catalogs_of(handles)
    catalogs.put_new(entry(KEY, created_at=10.0), FACTS, ())
    catalogs.touch(
        [
            Touch("team-a", KEY, 20.0, 2),
            Touch("team-a", KEY, 15.0, 1),  # earlier: the access stays 20
            Touch("team-a", OTHER_KEY, 30.0, 1),  # no row: creates nothing
        ]
    )
    catalogs.touch([])
    (stats,) = catalogs.stats("team-a", None, 10)
    assert (stats.last_access, stats.hits) == (20.0, 3)
    assert catalogs.get("team-a", OTHER_KEY) is None


def test_of_concurrent_puts_of_one_key_on_replicas_exactly_one_wins_with_its_names(
    handles: IndexHandles,
) -> None:
    replicas = [catalogs_of(handles) for _ in range(4)]
    start = threading.Barrier(16, timeout=HANG_LIMIT_S)

    def put(i: int) -> bool:
        start.wait()
        row = entry(manifest=f'{{"n":{i}}}', writer=f"w{i}")
        return replicas[i % 4].put_new(row, FACTS, (f"name{i}",)) is None

    with ThreadPoolExecutor(16) as pool:
        won = list(pool.map(put, range(16)))
    assert won.count(True) == 1
    winner = won.index(True)
    held = replicas[0].get("team-a", KEY)
    assert held is not None
    assert held.writer == f"w{winner}"
    assert replicas[0].names_of("team-a", KEY) == [f"name{winner}"]


def test_of_concurrent_claims_of_one_name_on_replicas_exactly_one_writes(
    handles: IndexHandles,
) -> None:
    replicas = [catalogs_of(handles) for _ in range(4)]
    keys = [KEY, OTHER_KEY, THIRD_KEY]
    for key in keys:
        replicas[0].put_new(entry(key), FACTS, ())
    start = threading.Barrier(12, timeout=HANG_LIMIT_S)

    def claim(i: int) -> tuple[bool, str] | None:
        start.wait()
        return replicas[i % 4].claim("team-a", "contested", keys[i % 3])

    with ThreadPoolExecutor(12) as pool:
        claims = [c for c in pool.map(claim, range(12)) if c is not None]
    written = [named for was_written, named in claims if was_written]
    assert len(written) == 1
    assert {named for _, named in claims} == set(written)
    assert replicas[0].resolve("team-a", "contested") == written[0]
