"""The primitives (index/primitives.py), ``Cells``, ``Logs`` and ``Maps``, on every
backend: what the roles written once over them (leases.py, failures.py, tokens.py,
records.py) rely on. Several handles on one store stand for replicas."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.backends import IndexHandles, backends
from support.indexes import HANG_LIMIT_S

from neffcache.server.index.primitives import ANY_TIME, Cells, Logs, Maps

NOW = 1_712_000_000.0


@pytest.fixture(params=backends("memory", "sqlite", "redis"))
def handles(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IndexHandles]:
    store = IndexHandles(request.param, request, tmp_path / "data")
    yield store
    store.close()


def cells_of(handles: IndexHandles) -> Cells:
    cells: Cells = getattr(handles.open(), "cells")  # noqa: B009 - not in the Index protocol
    return cells


def logs_of(handles: IndexHandles) -> Logs:
    logs: Logs = getattr(handles.open(), "logs")  # noqa: B009 - not in the Index protocol
    return logs


def maps_of(handles: IndexHandles) -> Maps:
    maps: Maps = getattr(handles.open(), "maps")  # noqa: B009 - not in the Index protocol
    return maps


def test_put_new_stores_once_and_get_reads_it(handles: IndexHandles) -> None:
    cells = cells_of(handles)
    assert cells.get("c", NOW) is None
    assert cells.put_new("c", "one", NOW, NOW + 30) is None
    kept = cells.put_new("c", "two", NOW, NOW + 30)
    assert kept is not None
    assert kept.value == "one"
    cell = cells.get("c", NOW)
    assert cell is not None
    assert cell.value == "one"
    assert NOW + 29 < cell.expires_at <= NOW + 30


def test_swap_replaces_only_the_expected_value(handles: IndexHandles) -> None:
    cells = cells_of(handles)
    cells.put_new("c", "one", NOW, NOW + 30)
    assert not cells.swap("c", "other", "two", NOW, NOW + 60)
    assert not cells.swap("absent", "one", "two", NOW, NOW + 60)
    assert cells.swap("c", "one", "two", NOW, NOW + 60)
    cell = cells.get("c", NOW)
    assert cell is not None
    assert cell.value == "two"
    assert cell.expires_at > NOW + 59


def test_swap_head_changes_only_a_value_with_that_head(handles: IndexHandles) -> None:
    cells = cells_of(handles)
    cells.put_new("c", "id1 0 rest", NOW, NOW + 30)
    assert not cells.swap_head("c", "id1 1 ", "id1 0 ", NOW, NOW + 60)
    assert not cells.swap_head("c", "id1 0 rest and more", "x", NOW, NOW + 60)
    assert not cells.swap_head("absent", "id1 0 ", "id1 1 ", NOW, NOW + 60)
    assert cells.swap_head("c", "id1 0 ", "id1 1 ", NOW, NOW + 60)
    cell = cells.get("c", NOW)
    assert cell is not None
    assert cell.value == "id1 1 rest"
    assert NOW + 59 < cell.expires_at <= NOW + 60


def test_swap_head_to_none_removes_only_a_value_with_that_head(handles: IndexHandles) -> None:
    cells = cells_of(handles)
    cells.put_new("c", "id1 0 rest", NOW, NOW + 30)
    assert not cells.swap_head("c", "id2 0 ", None, NOW, NOW)
    assert cells.get("c", ANY_TIME) is not None
    assert cells.swap_head("c", "id1 0 ", None, NOW, NOW)
    assert cells.get("c", ANY_TIME) is None
    assert not cells.swap_head("c", "id1 0 ", None, NOW, NOW)
    assert cells.put_new("c", "again", NOW, NOW + 30) is None


def test_swap_head_compares_characters_beyond_ascii(handles: IndexHandles) -> None:
    cells = cells_of(handles)
    cells.put_new("c", "é€ 0 rest ü", NOW, NOW + 30)
    assert not cells.swap_head("c", "é€ 1", "x", NOW, NOW + 30)
    assert cells.swap_head("c", "é€ 0", "ö 1", NOW, NOW + 30)
    cell = cells.get("c", NOW)
    assert cell is not None
    assert cell.value == "ö 1 rest ü"


def test_of_concurrent_swap_heads_of_one_head_exactly_one_wins(handles: IndexHandles) -> None:
    replicas = [cells_of(handles) for _ in range(4)]
    replicas[0].put_new("c", "id 0 rest", NOW, NOW + 30)
    start = threading.Barrier(16, timeout=HANG_LIMIT_S)

    def swap(i: int) -> bool:
        start.wait()
        return replicas[i % 4].swap_head("c", "id 0 ", f"v{i} ", NOW, NOW + 30)

    with ThreadPoolExecutor(16) as pool:
        won = list(pool.map(swap, range(16)))
    assert won.count(True) == 1


# Only the backends that compare the caller's clock; Redis expires cells by its own.
@pytest.fixture(params=backends("memory", "sqlite"))
def local_handles(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IndexHandles]:
    store = IndexHandles(request.param, request, tmp_path / "data")
    yield store
    store.close()


def test_an_expired_cell_is_free_on_the_callers_clock(local_handles: IndexHandles) -> None:
    cells = cells_of(local_handles)
    cells.put_new("c", "one", NOW, NOW + 30)
    assert cells.get("c", NOW + 30) is None
    still = cells.get("c", ANY_TIME)
    assert still is not None
    assert still.value == "one"
    assert cells.put_new("c", "two", NOW + 30, NOW + 60) is None


def test_of_concurrent_put_new_on_replicas_exactly_one_wins(handles: IndexHandles) -> None:
    replicas = [cells_of(handles) for _ in range(4)]
    start = threading.Barrier(16, timeout=HANG_LIMIT_S)

    def put(i: int) -> bool:
        start.wait()
        return replicas[i % 4].put_new("c", f"v{i}", NOW, NOW + 30) is None

    with ThreadPoolExecutor(16) as pool:
        won = list(pool.map(put, range(16)))
    assert won.count(True) == 1


def test_of_concurrent_swaps_of_one_value_exactly_one_wins(handles: IndexHandles) -> None:
    replicas = [cells_of(handles) for _ in range(4)]
    replicas[0].put_new("c", "start", NOW, NOW + 30)
    start = threading.Barrier(16, timeout=HANG_LIMIT_S)

    def swap(i: int) -> bool:
        start.wait()
        return replicas[i % 4].swap("c", "start", f"v{i}", NOW, NOW + 30)

    with ThreadPoolExecutor(16) as pool:
        won = list(pool.map(swap, range(16)))
    assert won.count(True) == 1


# --- logs


def test_a_log_reads_its_live_items_with_their_scores(handles: IndexHandles) -> None:
    logs = logs_of(handles)
    assert logs.read("l", NOW) == []
    logs.add("l", "a", NOW + 10, 5, NOW)
    logs.add("l", "b", NOW + 20, 5, NOW)
    logs.add("other", "c", NOW + 30, 5, NOW)
    assert sorted(logs.read("l", NOW)) == [("a", NOW + 10), ("b", NOW + 20)]
    assert logs.read("l", NOW + 10) == [("b", NOW + 20)]  # the score is exclusive


def test_an_add_keeps_the_highest_scored_and_drops_the_expired(handles: IndexHandles) -> None:
    logs = logs_of(handles)
    for i, score in enumerate((5.0, 30.0, 10.0, 40.0, 20.0)):
        logs.add("l", f"item{i}", NOW + score, 3, NOW)
    assert sorted(s for _, s in logs.read("l", NOW)) == [NOW + 20, NOW + 30, NOW + 40]
    logs.add("l", "late", NOW + 50, 3, NOW + 25)
    assert sorted(s for _, s in logs.read("l", 0.0)) == [NOW + 30, NOW + 40, NOW + 50]


def test_an_equal_item_is_one_item(handles: IndexHandles) -> None:
    logs = logs_of(handles)
    logs.add("l", "same", NOW + 10, 5, NOW)
    logs.add("l", "same", NOW + 20, 5, NOW)
    assert logs.read("l", NOW) == [("same", NOW + 20)]


def test_concurrent_adds_on_replicas_never_leave_more_than_keep(handles: IndexHandles) -> None:
    replicas = [logs_of(handles) for _ in range(4)]
    start = threading.Barrier(16, timeout=HANG_LIMIT_S)

    def add(i: int) -> None:
        start.wait()
        replicas[i % 4].add("l", f"item{i}", NOW + i + 1, 3, NOW)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(add, range(16)))
    assert sorted(s for _, s in replicas[0].read("l", NOW)) == [NOW + 14, NOW + 15, NOW + 16]


# --- maps


def test_a_map_field_is_put_once_then_swapped_and_deleted_only_as_expected(
    handles: IndexHandles,
) -> None:
    maps = maps_of(handles)
    assert maps.get("m", "f") is None
    assert maps.put_new("m", "f", "one")
    assert not maps.put_new("m", "f", "two")
    assert maps.get("m", "f") == "one"
    assert not maps.swap("m", "f", "other", "two")
    assert not maps.swap("m", "absent", "one", "two")
    assert maps.swap("m", "f", "one", "two")
    assert maps.get("m", "f") == "two"
    assert maps.swap("m", "f", "two", "two")  # to the value held: a write, and True
    assert not maps.delete_if("m", "f", "one")
    assert maps.delete_if("m", "f", "two")
    assert maps.get("m", "f") is None
    assert not maps.delete_if("m", "f", "two")
    assert maps.put_new("m", "f", "again")


def test_items_list_one_map_whole(handles: IndexHandles) -> None:
    maps = maps_of(handles)
    assert maps.items("m") == {}
    maps.put_new("m", "a", "1")
    maps.put_new("m", '["b", ":"]', "2")
    maps.put_new("other", "c", "3")
    maps.put_new("m:longer", "d", "4")  # a map whose name starts with another's
    assert maps.items("m") == {"a": "1", '["b", ":"]': "2"}


def test_a_map_survives_a_new_handle(handles: IndexHandles) -> None:
    maps_of(handles).put_new("m", "f", "kept")
    assert maps_of(handles).get("m", "f") == "kept"


def test_of_concurrent_map_writes_on_replicas_exactly_one_wins(handles: IndexHandles) -> None:
    replicas = [maps_of(handles) for _ in range(4)]
    replicas[0].put_new("m", "swapped", "start")
    start = threading.Barrier(16, timeout=HANG_LIMIT_S)

    def write(i: int) -> tuple[bool, bool]:
        start.wait()
        maps = replicas[i % 4]
        return maps.put_new("m", "new", f"v{i}"), maps.swap("m", "swapped", "start", f"v{i}")

    with ThreadPoolExecutor(16) as pool:
        won = list(pool.map(write, range(16)))
    assert [put for put, _ in won].count(True) == 1
    assert [swapped for _, swapped in won].count(True) == 1
