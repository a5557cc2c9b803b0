"""The ``Sequences`` primitive (index/sequences.py) on every backend: what the roles
written once over it (events.py) rely on. Several handles on one store stand for
replicas."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.backends import IndexHandles, backends
from support.indexes import HANG_LIMIT_S

from neffcache.server.index.sequences import Item, Placed, Sequences, Trim

ALL = Trim(keep=1_000_000)  # drops nothing
FIRST = (-math.inf, 0)  # a place before every item
NEVER = math.inf  # an ``until`` past every item


@pytest.fixture(params=backends("memory", "sqlite", "redis"))
def handles(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IndexHandles]:
    store = IndexHandles(request.param, request, tmp_path / "data")
    yield store
    store.close()


def sequences_of(handles: IndexHandles) -> Sequences:
    found: Sequences = getattr(handles.open(), "sequences")  # noqa: B009 - not in the Index protocol
    return found


def item(at: float, n: int, group: str = "g", tag: str = "t") -> Item:
    return Item(at, group, tag, "kind", f"item {n}")


def numbers(found: list[Placed]) -> list[int]:
    return [int(placed.item.body.split()[1]) for placed in found]


def test_items_read_back_whole_in_place_order(handles: IndexHandles) -> None:
    seqs = sequences_of(handles)
    odd = Item(2.5, "a:b%", "", "head with spaces", 'line one\nline two, "é"')
    seqs.append("log", [item(3.0, 1), odd, item(1.0, 2)], ALL)
    found = seqs.read("log", FIRST, NEVER, None, 10)
    assert [placed.item for placed in found] == [item(1.0, 2), odd, item(3.0, 1)]
    # Places are (at, seq), the seqs handed out in order of appending.
    assert [placed.place[0] for placed in found] == [1.0, 2.5, 3.0]
    first, second, third = (placed.place[1] for placed in found)
    assert 1 <= third < second < first


def test_items_of_one_time_keep_the_order_of_appending(handles: IndexHandles) -> None:
    seqs = sequences_of(handles)
    seqs.append("log", [item(5.0, n) for n in range(3)], ALL)
    seqs.append("log", [item(5.0, n) for n in range(3, 6)], ALL)
    assert numbers(seqs.read("log", FIRST, NEVER, None, 10)) == list(range(6))
    assert numbers(seqs.newest("log", None, None, -math.inf, 10)) == list(range(5, -1, -1))


def test_read_pages_after_a_place_and_before_until(handles: IndexHandles) -> None:
    seqs = sequences_of(handles)
    seqs.append("log", [item(float(n // 2), n) for n in range(10)], ALL)
    first = seqs.read("log", FIRST, NEVER, None, 3)
    assert numbers(first) == [0, 1, 2]
    # After the last read: the rest of its instant, then on.
    assert numbers(seqs.read("log", first[-1].place, NEVER, None, 3)) == [3, 4, 5]
    # ``(at, 0)`` takes every item at ``at``; ``until`` is exclusive.
    assert numbers(seqs.read("log", (2.0, 0), 4.0, None, 10)) == [4, 5, 6, 7]
    assert seqs.read("log", (9.0, 0), NEVER, None, 10) == []


def test_read_of_some_groups_skips_the_others(handles: IndexHandles) -> None:
    seqs = sequences_of(handles)
    seqs.append("log", [item(float(n), n, group="abc"[n % 3]) for n in range(12)], ALL)
    found = seqs.read("log", FIRST, NEVER, ["a", "c"], 4)
    assert numbers(found) == [0, 2, 3, 5]
    assert numbers(seqs.read("log", found[-1].place, NEVER, ["c", "a"], 10)) == [6, 8, 9, 11]
    assert seqs.read("log", FIRST, NEVER, ["absent"], 10) == []


def test_newest_of_a_tag_of_a_group_or_of_all(handles: IndexHandles) -> None:
    seqs = sequences_of(handles)
    seqs.append(
        "log", [item(float(n), n, group="ab"[n % 2], tag="xy"[n // 4 % 2]) for n in range(8)], ALL
    )
    assert numbers(seqs.newest("log", "a", "x", -math.inf, 10)) == [2, 0]
    assert numbers(seqs.newest("log", "a", "y", -math.inf, 1)) == [6]
    assert numbers(seqs.newest("log", "b", None, 3.0, 10)) == [7, 5, 3]
    assert numbers(seqs.newest("log", None, None, 5.0, 2)) == [7, 6]
    assert seqs.newest("log", "a", "x", -math.inf, 0) == []
    assert seqs.newest("log", "a", "absent", -math.inf, 5) == []


def test_trim_keeps_the_newest_by_count_and_age(handles: IndexHandles) -> None:
    seqs = sequences_of(handles)
    seqs.append("log", [item(float(n), n) for n in range(10)], Trim(keep=6, before=2.0))
    assert numbers(seqs.read("log", FIRST, NEVER, None, 20)) == [4, 5, 6, 7, 8, 9]
    seqs.append("log", [], Trim(keep=100, before=8.0))  # no items: only trims
    assert numbers(seqs.read("log", FIRST, NEVER, None, 20)) == [8, 9]
    # What left the log left the reads of its tag too.
    assert numbers(seqs.newest("log", "g", "t", -math.inf, 20)) == [9, 8]


def test_group_bytes_is_a_running_total_bounded_per_appended_group(
    handles: IndexHandles,
) -> None:
    seqs = sequences_of(handles)
    sized = [Item(float(n), "ab"[n % 2], "", "", "x" * 100) for n in range(8)]
    seqs.append("log", sized, ALL)
    assert seqs.group_bytes("log", "a") == seqs.group_bytes("log", "b") == 400
    assert seqs.group_bytes("log", "absent") == 0
    # Only the groups of the append are bounded, each from its oldest.
    seqs.append("log", [Item(9.0, "a", "", "", "é" * 50)], Trim(keep=100, max_bytes=250))
    assert seqs.group_bytes("log", "a") == 200
    assert seqs.group_bytes("log", "b") == 400
    found = seqs.read("log", FIRST, NEVER, ["a"], 10)
    assert [placed.item.at for placed in found] == [6.0, 9.0]
    seqs.append("log", [], Trim(keep=100, before=100.0))
    assert seqs.group_bytes("log", "a") == seqs.group_bytes("log", "b") == 0


def test_logs_are_apart(handles: IndexHandles) -> None:
    seqs = sequences_of(handles)
    seqs.append("one", [item(1.0, 1)], ALL)
    seqs.append("two", [item(2.0, 2), item(3.0, 3)], Trim(keep=1))
    assert numbers(seqs.read("one", FIRST, NEVER, None, 10)) == [1]
    assert numbers(seqs.read("two", FIRST, NEVER, None, 10)) == [3]
    assert seqs.group_bytes("one", "g") == len("item 1")
    assert seqs.read("absent", FIRST, NEVER, None, 10) == []
    assert seqs.newest("absent", None, None, -math.inf, 10) == []


def test_concurrent_appends_on_replicas_each_get_their_own_places(
    handles: IndexHandles,
) -> None:
    replicas = [sequences_of(handles) for _ in range(4)]
    start = threading.Barrier(8, timeout=HANG_LIMIT_S)

    def append(i: int) -> None:
        start.wait()
        replicas[i % 4].append("log", [item(1.0, 10 * i + n) for n in range(10)], ALL)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(append, range(8)))
    found = replicas[0].read("log", FIRST, NEVER, None, 100)
    assert sorted(numbers(found)) == list(range(80))
    assert len({placed.place for placed in found}) == 80
    # One batch's items keep their order among themselves.
    for i in range(8):
        assert [n for n in numbers(found) if n // 10 == i] == list(range(10 * i, 10 * i + 10))
