"""An in-memory index: the shipped fake for tests, and ``memory://`` for trials."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence

from .base import (
    Entry,
    EntryFacts,
    EntryStats,
    PutResult,
    Touch,
    entry_facts,
)
from .primitive_roles import PrimitiveRoles
from .primitives import MemoryCells, MemoryLogs, MemoryMaps
from .sequences import MemorySequences


class MemoryIndex(PrimitiveRoles):
    # Answers come from this machine: the server may call it on its event loop.
    local = True

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], Entry] = {}
        self._aliases: dict[tuple[str, str], str] = {}
        # Leases, failures, tokens, records, audit, events: written once over primitives.
        super().__init__(MemoryCells(), MemoryLogs(), MemoryMaps(), MemorySequences())
        # Each entry's facts, and its use: [last_access, hits].
        self._facts: dict[tuple[str, str], EntryFacts] = {}
        self._use: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> MemoryIndex:
        return cls()

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        with self._lock:
            existing = self._entries.get((entry.namespace, entry.key))
            if existing is not None:
                return PutResult.SAME if existing.manifest == entry.manifest else PutResult.CONFLICT
            self._entries[(entry.namespace, entry.key)] = entry
            self._use[(entry.namespace, entry.key)] = [entry.created_at, 0]
            self._facts[(entry.namespace, entry.key)] = entry_facts(entry.manifest)
            for alias in aliases:
                if self._alias_free(entry.namespace, alias):
                    self._aliases[(entry.namespace, alias)] = entry.key
            return PutResult.CREATED

    def _alias_free(self, namespace: str, alias: str) -> bool:
        # Caller holds _lock. An alias left naming a deleted entry is free.
        named = self._aliases.get((namespace, alias))
        return named is None or (namespace, named) not in self._entries

    def get_entry(self, namespace: str, key: str) -> Entry | None:
        with self._lock:
            return self._entries.get((namespace, key))

    def resolve_alias(self, namespace: str, alias: str) -> str | None:
        with self._lock:
            return self._aliases.get((namespace, alias))

    def aliases_of(self, namespace: str, key: str) -> list[str]:
        with self._lock:
            return sorted(a for (ns, a), k in self._aliases.items() if ns == namespace and k == key)

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        with self._lock:
            if (namespace, key) not in self._entries:
                return None
            named = self._aliases.get((namespace, alias))
            if named == key:
                return PutResult.SAME
            if self._alias_free(namespace, alias):
                self._aliases[(namespace, alias)] = key
                return PutResult.CREATED
            return PutResult.CONFLICT

    def check(self) -> None:
        return None

    def close(self) -> None:
        return None

    # --- listing

    def list_entries(self, namespace: str, after: str | None, limit: int) -> list[Entry]:
        with self._lock:
            # A scan per page: this is the fake, and a sorted copy would cost every put.
            keys = [k for ns, k in self._entries if ns == namespace and k > (after or "")]
            return [self._entries[(namespace, k)] for k in heapq.nsmallest(limit, keys)]

    # --- eviction

    def entry_stats(self, namespace: str, after: str | None, limit: int) -> list[EntryStats]:
        entries = self.list_entries(namespace, after, limit)
        found = []
        with self._lock:
            for e in entries:
                where = (e.namespace, e.key)
                if where not in self._entries:
                    continue  # deleted since the listing
                last, hits = self._use[where]
                facts = self._facts[where]
                found.append(
                    EntryStats(e.namespace, e.key, e.created_at, e.writer, facts, last, int(hits))
                )
        return found

    def touch_entries(self, touches: Sequence[Touch]) -> None:
        with self._lock:
            for touch in touches:
                use = self._use.get((touch.namespace, touch.key))
                if use is not None:
                    use[0] = max(use[0], touch.at)
                    use[1] += touch.hits

    def delete_entry(self, namespace: str, key: str, created_at: float) -> bool:
        with self._lock:
            entry = self._entries.get((namespace, key))
            if entry is None or entry.created_at != created_at:
                return False
            del self._entries[(namespace, key)]
            self._use.pop((namespace, key), None)
            self._facts.pop((namespace, key), None)
            self._aliases = {
                where: named
                for where, named in self._aliases.items()
                if not (where[0] == namespace and named == key)
            }
            return True

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted({namespace for namespace, _ in self._entries})
