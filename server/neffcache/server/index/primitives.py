"""The primitives the roles written once over every backend use, each small enough
that a backend provides it in a few dozen lines: ``Cells`` (one key that must change
atomically across replicas: get, put-if-absent with expiry, compare-and-set of the
whole value or of its head), used by leases (leases.py); ``Logs`` (many short bounded
logs, one per key: append-and-trim, read), used by failure records (failures.py); and
``Maps`` (durable named maps of fields, each listed whole: get, put-if-absent,
compare-and-set, conditional delete, items), used by tokens (tokens.py) and records
(records.py). Cells cannot stand in for maps: a listing of cells would be a scan of
every key a backend holds (Redis has no cheaper one), where a map is one hash.

Expiry is given as ``expires_at`` together with the caller's ``now``: a backend with a
clock of its own (Redis) keeps a cell ``expires_at - now`` seconds by that clock, so
replicas with skewed clocks still agree on one lifetime; the others store
``expires_at`` and compare it with the ``now`` of each call.
"""

from __future__ import annotations

import heapq
import math
import threading
from dataclasses import dataclass
from typing import Protocol

# ``get``'s ``now`` that reads a cell however long ago it expired (if still stored).
ANY_TIME = -math.inf


@dataclass(frozen=True)
class Cell:
    value: str
    expires_at: float  # on the caller's clock: for Redis, ``now`` plus the life left


class Cells(Protocol):
    """Atomic single-key operations. Each call is atomic against every other call on
    any handle to the same store (every replica's); misses return None or False."""

    def get(self, key: str, now: float) -> Cell | None:
        """The cell live at ``now`` (``expires_at > now``), or None; with ``ANY_TIME``
        also one expired but not yet reclaimed."""

    def put_new(self, key: str, value: str, now: float, expires_at: float) -> Cell | None:
        """Store the cell if ``key`` holds none live at ``now`` and return None; else
        return the live cell, unchanged (one round trip where a failed put is usually
        followed by a read). A backend may reclaim other expired cells here."""

    def swap(self, key: str, expected: str, value: str, now: float, expires_at: float) -> bool:
        """Compare-and-set: replace the cell, value and expiry, if it holds exactly
        ``expected`` (live or expired but not reclaimed); True when replaced."""

    def swap_head(
        self, key: str, head: str, new_head: str | None, now: float, expires_at: float
    ) -> bool:
        """Compare-and-set on the head of a value: if the cell (live or expired but not
        reclaimed) holds a value starting with ``head``, make it ``new_head`` followed
        by the rest, expiring at ``expires_at``; with ``new_head`` None, remove the
        cell. True when changed. One call where a read, then a ``swap``, are two."""


class Logs(Protocol):
    """Bounded logs of scored items, one per key; each call is atomic against every
    other on any handle to the same store. An item's score is the time it expires
    (the caller's clock)."""

    def add(self, log: str, item: str, score: float, keep: int, now: float) -> None:
        """Add ``item`` (items are distinct strings: an equal one is replaced), then
        drop the log's items scored ``<= now`` and all but the ``keep`` highest-scored.
        The log lasts at least until its highest score; a backend may reclaim other
        logs' expired items here, or by its own expiry."""

    def read(self, log: str, now: float) -> list[tuple[str, float]]:
        """The items scored ``> now``, with their scores, in no particular order;
        ``[]`` for none."""


class Maps(Protocol):
    """Durable maps from field to value, one per name; nothing expires. Each call is
    atomic against every other on any handle to the same store; misses return None or
    False. A map is read whole by ``items``: keep each map to what its role lists."""

    def get(self, name: str, field: str) -> str | None:
        """The field's value, or None."""

    def put_new(self, name: str, field: str, value: str) -> bool:
        """Store the field if the map has none of that name; True when stored."""

    def swap(self, name: str, field: str, expected: str, value: str) -> bool:
        """Compare-and-set: replace the field's value if it is exactly ``expected``."""

    def delete_if(self, name: str, field: str, expected: str) -> bool:
        """Remove the field if its value is exactly ``expected``; True when removed."""

    def items(self, name: str) -> dict[str, str]:
        """Every field of the map with its value; ``{}`` for none."""


class MemoryCells:
    """Cells in a dict, for the in-memory index."""

    # Cells held before a put_new sweeps the expired ones (keys nobody asks for again).
    SWEEP_AT = 1024

    def __init__(self) -> None:
        self._cells: dict[str, Cell] = {}
        self._lock = threading.Lock()

    def get(self, key: str, now: float) -> Cell | None:
        with self._lock:
            cell = self._cells.get(key)
        return cell if cell is not None and cell.expires_at > now else None

    def put_new(self, key: str, value: str, now: float, expires_at: float) -> Cell | None:
        with self._lock:
            if len(self._cells) > self.SWEEP_AT:
                self._cells = {k: c for k, c in self._cells.items() if c.expires_at > now}
            current = self._cells.get(key)
            if current is not None and current.expires_at > now:
                return current
            self._cells[key] = Cell(value, expires_at)
            return None

    def swap(self, key: str, expected: str, value: str, now: float, expires_at: float) -> bool:
        with self._lock:
            current = self._cells.get(key)
            if current is None or current.value != expected:
                return False
            self._cells[key] = Cell(value, expires_at)
            return True

    def swap_head(
        self, key: str, head: str, new_head: str | None, now: float, expires_at: float
    ) -> bool:
        with self._lock:
            current = self._cells.get(key)
            if current is None or not current.value.startswith(head):
                return False
            if new_head is None:
                del self._cells[key]
            else:
                self._cells[key] = Cell(new_head + current.value[len(head) :], expires_at)
            return True


class MemoryLogs:
    """Logs in a dict, for the in-memory index: a heap of (score, log), one per item
    added, lets every add reclaim the expired items of every log without a scan."""

    def __init__(self) -> None:
        self._logs: dict[str, dict[str, float]] = {}
        self._expiries: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def add(self, log: str, item: str, score: float, keep: int, now: float) -> None:
        with self._lock:
            self._drop_expired(now)
            items = self._logs.setdefault(log, {})
            items[item] = score
            if len(items) > keep:
                # Stable: of equal scores the earlier added go first, as in Redis.
                kept = sorted(items.items(), key=lambda pair: pair[1])[len(items) - keep :]
                self._logs[log] = items = dict(kept)
            if not items:
                del self._logs[log]
            heapq.heappush(self._expiries, (score, log))
            live = sum(len(kept) for kept in self._logs.values())
            if len(self._expiries) > 2 * live + 64:
                # Trimmed items leave their heap entries behind: rebuild from what is
                # kept, so the heap grows with the items, not with the writes.
                self._expiries = [(s, k) for k, v in self._logs.items() for s in v.values()]
                heapq.heapify(self._expiries)

    def _drop_expired(self, now: float) -> None:
        # Caller holds _lock.
        while self._expiries and self._expiries[0][0] <= now:
            _, log = heapq.heappop(self._expiries)
            live = {i: s for i, s in self._logs.get(log, {}).items() if s > now}
            if live:
                self._logs[log] = live
            else:
                self._logs.pop(log, None)

    def read(self, log: str, now: float) -> list[tuple[str, float]]:
        with self._lock:
            return [(i, s) for i, s in self._logs.get(log, {}).items() if s > now]


class MemoryMaps:
    """Maps in a dict of dicts, for the in-memory index."""

    def __init__(self) -> None:
        self._maps: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def get(self, name: str, field: str) -> str | None:
        with self._lock:
            return self._maps.get(name, {}).get(field)

    def put_new(self, name: str, field: str, value: str) -> bool:
        with self._lock:
            fields = self._maps.setdefault(name, {})
            if field in fields:
                return False
            fields[field] = value
            return True

    def swap(self, name: str, field: str, expected: str, value: str) -> bool:
        with self._lock:
            fields = self._maps.get(name, {})
            if fields.get(field) != expected:
                return False
            fields[field] = value
            return True

    def delete_if(self, name: str, field: str, expected: str) -> bool:
        with self._lock:
            fields = self._maps.get(name, {})
            if fields.get(field) != expected:
                return False
            del fields[field]
            return True

    def items(self, name: str) -> dict[str, str]:
        with self._lock:
            return dict(self._maps.get(name, {}))
