"""``Sequences``, the primitive of the ordered logs written once over every backend
(the events log, events.py): named logs of items, each at a place ``(at, seq)`` (the
caller's time, then a sequence the log hands out in order of appending), bounded by
count, by age and by the bytes of each group, read a page at a time in place order
or newest first. An item belongs to a group (a namespace: reads may be limited to some
groups, and each group's bytes are a running total) and may carry a tag within it (a
key: its newest are read without walking the group).

Cells, logs and maps (primitives.py) cannot stand in: none orders many items by time
with an index per group, and trims them from the oldest as the log grows.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# An item's place in its log: its time, then its sequence (1, 2, ... per log, in order
# of appending). No item has sequence 0, so ``(at, 0)`` comes before every item at
# ``at``: ``read`` from ``(since, 0)`` takes all of ``since``.
Place = tuple[float, int]


@dataclass(frozen=True)
class Item:
    at: float
    group: str
    tag: str  # within its group; "" for none
    head: str  # a short label stored beside the body, not counted in the bytes
    body: str

    @property
    def size(self) -> int:
        """The bytes the item counts toward its group: its body, in UTF-8."""
        return len(self.body.encode())


@dataclass(frozen=True)
class Placed:
    place: Place
    item: Item


@dataclass(frozen=True)
class Trim:
    """What an append leaves: the ``keep`` newest items, none with ``at < before``,
    and with ``max_bytes`` each group of the appended items at most that many bytes
    (its oldest dropped first; other groups are not looked at)."""

    keep: int
    before: float = -math.inf
    max_bytes: int | None = None


class Sequences(Protocol):
    """Ordered, bounded logs, one per name. Each append is atomic against every other
    call on any handle to the same store as far as the backend's batch goes (readers
    may see part of a large append, never half an item); reads are in place order."""

    def append(self, log: str, items: Sequence[Item], trim: Trim) -> None:
        """Give each item the log's next sequence and store it, then trim (``trim``);
        with no items, only trim. Trimming drops the oldest by place, so what is left
        is always a suffix of the log (and of each group)."""

    def read(
        self, log: str, after: Place, until: float, groups: Sequence[str] | None, limit: int
    ) -> list[Placed]:
        """Up to ``limit`` (>= 1) items placed after ``after`` with ``at < until`` (of
        these groups, or of all for None), oldest first; ``[]`` past the last."""

    def newest(
        self, log: str, group: str | None, tag: str | None, since: float, limit: int
    ) -> list[Placed]:
        """Up to ``limit`` items with ``at >= since`` (of one group, or all; of one tag
        of it, or all), newest first; ``[]`` for none or a ``limit`` below 1. A backend
        may keep fewer per tag: Redis keeps each tag's newest 100."""

    def group_bytes(self, log: str, group: str) -> int:
        """The bytes (``Item.size``) of a group's stored items, 0 for none: a running
        total kept as items come and go, never a scan."""


@dataclass
class _Log:
    """One log in memory: its items sorted by place, and each group's and each
    (group, tag)'s in the same order, so that a group's byte bound drops its oldest
    and a tag's newest are read without walking the log."""

    items: list[Placed] = field(default_factory=list)
    by_group: dict[str, list[Placed]] = field(default_factory=dict)
    by_tag: dict[tuple[str, str], list[Placed]] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class MemorySequences:
    """Sequences in lists, for the in-memory index."""

    def __init__(self) -> None:
        self._logs: dict[str, _Log] = {}
        self._lock = threading.Lock()

    def append(self, log: str, items: Sequence[Item], trim: Trim) -> None:
        with self._lock:
            mine = self._logs.setdefault(log, _Log())
            for item in items:
                placed = Placed((item.at, next(mine.seq)), item)
                # Nearly always at the end: callers stamp items as they receive them.
                bisect.insort(mine.items, placed, key=_place)
                bisect.insort(mine.by_group.setdefault(item.group, []), placed, key=_place)
                if item.tag:
                    tagged = mine.by_tag.setdefault((item.group, item.tag), [])
                    bisect.insort(tagged, placed, key=_place)
                mine.bytes[item.group] = mine.bytes.get(item.group, 0) + item.size
            old = bisect.bisect_left(mine.items, (trim.before, 0), key=_place)
            drop = max(old, len(mine.items) - max(trim.keep, 0))
            for placed in mine.items[:drop]:
                _forget_oldest(mine, placed)
            del mine.items[:drop]
            if trim.max_bytes is not None:
                for group in {item.group for item in items}:
                    while mine.bytes.get(group, 0) > trim.max_bytes:
                        placed = mine.by_group[group][0]
                        _forget_oldest(mine, placed)
                        del mine.items[bisect.bisect_left(mine.items, placed.place, key=_place)]

    def read(
        self, log: str, after: Place, until: float, groups: Sequence[str] | None, limit: int
    ) -> list[Placed]:
        wanted = None if groups is None else set(groups)
        found: list[Placed] = []
        with self._lock:
            items = self._logs[log].items if log in self._logs else []
            # bisect_right: an item at ``after`` itself is not after it.
            i = bisect.bisect_right(items, after, key=_place)
            while i < len(items) and len(found) < limit and items[i].item.at < until:
                if wanted is None or items[i].item.group in wanted:
                    found.append(items[i])
                i += 1
        return found

    def newest(
        self, log: str, group: str | None, tag: str | None, since: float, limit: int
    ) -> list[Placed]:
        with self._lock:
            mine = self._logs.get(log, _Log())
            if group is None:
                items = mine.items
            elif tag is None:
                items = mine.by_group.get(group, [])
            else:
                items = mine.by_tag.get((group, tag), [])
            start = bisect.bisect_left(items, (since, 0), key=_place)
            found = items[max(start, len(items) - limit) :] if limit > 0 else []
        return found[::-1]

    def group_bytes(self, log: str, group: str) -> int:
        with self._lock:
            return self._logs[log].bytes.get(group, 0) if log in self._logs else 0


def _forget_oldest(log: _Log, placed: Placed) -> None:
    """Take ``placed``, the oldest of its group (the caller removes it from
    ``log.items``), off its group's and its tag's lists and its group's bytes."""
    item = placed.item
    tagged = log.by_tag.get((item.group, item.tag))
    if tagged and tagged[0] is placed:
        del tagged[0]
        if not tagged:
            del log.by_tag[(item.group, item.tag)]
    ours = log.by_group[item.group]
    del ours[0]
    log.bytes[item.group] -= item.size
    if not ours:
        del log.by_group[item.group], log.bytes[item.group]


def _place(placed: Placed) -> Place:
    return placed.place
