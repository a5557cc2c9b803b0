"""``Catalogs``, the primitive the entries role (entries.py) is written once over:
immutable rows (an ``Entry``: its manifest, ``created_at`` and writer), one catalog per
namespace, each row with the facts stored beside it and its use, and names (aliases)
that name a row's key within its catalog.

Cells, logs, maps and sequences (primitives.py, sequences.py) cannot stand in, because
of what a lookup and a publish must cost: a publish stores the row, its facts and its
names in one transaction (one Lua script on Redis), conditional on the row's absence
and, for each name, on the row the name holds being gone, a condition across keys that
no single-key primitive expresses; a deletion takes the row's names with it, found by
key; and a lookup is one read. So each call here is one atomic backend action, and
what is the same on every backend (deriving the facts, telling SAME from CONFLICT,
batching touches) is the role's.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence
from typing import Protocol

from .base import Entry, EntryFacts, EntryStats, Touch


class Catalogs(Protocol):
    """Rows keyed by (catalog, key) in key order, and names. Each call is atomic
    against every other on any handle to the same store (every replica's); misses
    return None, False or ``[]``. A row is never rewritten; only ``delete_if``
    removes one."""

    def put_new(self, row: Entry, facts: EntryFacts, names: Sequence[str]) -> Entry | None:
        """If catalog ``row.namespace`` holds no row under ``row.key``: store it with
        ``facts`` and a use of ``last_access`` = ``created_at`` and no hits, make each
        of ``names`` that names nothing, or a key with no row, name ``row.key``, and
        return None. Else return the row held; nothing changes but a backend's own
        bookkeeping (Redis lists a row a server older than its listing wrote)."""

    def get(self, catalog: str, key: str) -> Entry | None:
        """The row, or None: one backend read."""

    def resolve(self, catalog: str, name: str) -> str | None:
        """The key ``name`` names, or None: one backend read."""

    def names_of(self, catalog: str, key: str) -> list[str]:
        """Every name naming ``key``, sorted."""

    def claim(self, catalog: str, name: str, key: str) -> tuple[bool, str] | None:
        """If (catalog, key) holds a row: make ``name`` name ``key`` when it names
        nothing or a key with no row; return whether it was written and the key it
        names now. None, and nothing written, when there is no row under ``key``."""

    def rows(self, catalog: str, after: str | None, limit: int) -> list[Entry]:
        """Up to ``limit`` (>= 1) rows whose keys sort after ``after`` (from the
        first, for None), in ascending key order."""

    def stats(self, catalog: str, after: str | None, limit: int) -> list[EntryStats]:
        """As ``rows``, each row's facts and use instead of its manifest."""

    def touch(self, touches: Sequence[Touch]) -> None:
        """For each touch of a row there: ``last_access`` becomes the later of itself
        and ``at``, and ``hits`` grows by ``hits``; others create nothing. One
        transaction (one script) per call: the caller bounds its size."""

    def delete_if(self, catalog: str, key: str, created_at: float) -> bool:
        """Remove the row, its facts and use, and every name naming its key, if its
        ``created_at`` is ``created_at``; True when removed."""

    def catalogs(self) -> list[str]:
        """Every catalog holding a row, sorted; it may also list catalogs whose rows
        were all deleted."""


class MemoryCatalogs:
    """Catalogs in dicts, for the in-memory index."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], Entry] = {}
        # (catalog, name) -> key; the in-memory index names it ``_aliases`` too.
        self.names: dict[tuple[str, str], str] = {}
        self._facts: dict[tuple[str, str], EntryFacts] = {}
        self._use: dict[tuple[str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def put_new(self, row: Entry, facts: EntryFacts, names: Sequence[str]) -> Entry | None:
        where = (row.namespace, row.key)
        with self._lock:
            held = self._rows.get(where)
            if held is not None:
                return held
            self._rows[where] = row
            self._facts[where] = facts
            self._use[where] = (row.created_at, 0)
            for name in names:
                if self._free(row.namespace, name):
                    self.names[(row.namespace, name)] = row.key
            return None

    def _free(self, catalog: str, name: str) -> bool:
        # Caller holds _lock. A name left naming a deleted row is free.
        named = self.names.get((catalog, name))
        return named is None or (catalog, named) not in self._rows

    def get(self, catalog: str, key: str) -> Entry | None:
        with self._lock:
            return self._rows.get((catalog, key))

    def resolve(self, catalog: str, name: str) -> str | None:
        with self._lock:
            return self.names.get((catalog, name))

    def names_of(self, catalog: str, key: str) -> list[str]:
        with self._lock:
            return sorted(n for (c, n), k in self.names.items() if c == catalog and k == key)

    def claim(self, catalog: str, name: str, key: str) -> tuple[bool, str] | None:
        with self._lock:
            if (catalog, key) not in self._rows:
                return None
            named = self.names.get((catalog, name))
            if named != key and self._free(catalog, name):
                self.names[(catalog, name)] = key
                return True, key
            return False, key if named is None else named

    def rows(self, catalog: str, after: str | None, limit: int) -> list[Entry]:
        with self._lock:
            # A scan per page: this is the fake, and a sorted copy would cost every put.
            keys = [k for c, k in self._rows if c == catalog and k > (after or "")]
            return [self._rows[(catalog, k)] for k in heapq.nsmallest(limit, keys)]

    def stats(self, catalog: str, after: str | None, limit: int) -> list[EntryStats]:
        found = []
        with self._lock:
            keys = [k for c, k in self._rows if c == catalog and k > (after or "")]
            for key in heapq.nsmallest(limit, keys):
                row, facts = self._rows[(catalog, key)], self._facts[(catalog, key)]
                last, hits = self._use[(catalog, key)]
                found.append(
                    EntryStats(catalog, key, row.created_at, row.writer, facts, last, hits)
                )
        return found

    def touch(self, touches: Sequence[Touch]) -> None:
        with self._lock:
            for touch in touches:
                use = self._use.get((touch.namespace, touch.key))
                if use is not None:
                    last, hits = use
                    self._use[(touch.namespace, touch.key)] = (
                        max(last, touch.at),
                        hits + touch.hits,
                    )

    def delete_if(self, catalog: str, key: str, created_at: float) -> bool:
        with self._lock:
            row = self._rows.get((catalog, key))
            if row is None or row.created_at != created_at:
                return False
            del self._rows[(catalog, key)], self._facts[(catalog, key)]
            del self._use[(catalog, key)]
            for where in [w for w, k in self.names.items() if w[0] == catalog and k == key]:
                del self.names[where]  # in place: the dict is shared (see __init__)
            return True

    def catalogs(self) -> list[str]:
        with self._lock:
            return sorted({catalog for catalog, _ in self._rows})
