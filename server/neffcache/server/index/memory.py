"""An in-memory index: the shipped fake for tests, and ``memory://`` for trials."""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
from collections.abc import Sequence

from .base import (
    AuditRecord,
    Entry,
    EntryFacts,
    EntryStats,
    Event,
    PutResult,
    Touch,
    entry_facts,
    event_cursor,
    event_size,
    events_start,
)
from .primitive_roles import PrimitiveRoles
from .primitives import MemoryCells, MemoryLogs, MemoryMaps

# An event's place in the log: its time, then its sequence (order of appending).
_Place = tuple[float, int]


class MemoryIndex(PrimitiveRoles):
    # Answers come from this machine: the server may call it on its event loop.
    local = True

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], Entry] = {}
        self._aliases: dict[tuple[str, str], str] = {}
        # Leases, failures, tokens and records: written once over the primitives.
        super().__init__(MemoryCells(), MemoryLogs(), MemoryMaps())
        # Each entry's facts, and its use: [last_access, hits].
        self._facts: dict[tuple[str, str], EntryFacts] = {}
        self._use: dict[tuple[str, str], list[float]] = {}
        self._audit: list[AuditRecord] = []  # oldest first
        # The events log, sorted by place (oldest first), and each (namespace, key)'s
        # events in the same order, so events_for_key reads no other key's; each
        # namespace's too, and their bytes, so its byte bound drops its oldest without
        # walking the log.
        self._events: list[tuple[_Place, Event]] = []
        self._events_by_key: dict[tuple[str, str], list[tuple[_Place, Event]]] = {}
        self._events_by_ns: dict[str, list[tuple[_Place, Event]]] = {}
        self._event_bytes: dict[str, int] = {}
        self._event_seq = itertools.count(1)
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

    # --- audit

    def append_audit(self, records: Sequence[AuditRecord], keep: int) -> None:
        with self._lock:
            self._audit.extend(records)
            if len(self._audit) > keep:
                del self._audit[: len(self._audit) - keep]

    def audit(self, since: float, namespace: str | None, limit: int) -> list[AuditRecord]:
        with self._lock:
            kept = list(self._audit)
        found = [
            r
            for r in reversed(kept)  # newest appended first
            if r.at >= since and (namespace is None or r.namespace == namespace)
        ]
        # Stable: records of one instant stay in reverse order of appending.
        found.sort(key=lambda r: r.at, reverse=True)
        return found[:limit]

    # --- telemetry events

    def append_events(
        self, events: Sequence[Event], keep: int, before: float, max_bytes: int | None = None
    ) -> None:
        with self._lock:
            for event in events:
                item = ((event.at, next(self._event_seq)), event)
                # Nearly always appended at the end: stamps are taken at receipt.
                bisect.insort(self._events, item, key=_place)
                if event.key:
                    mine = self._events_by_key.setdefault((event.namespace, event.key), [])
                    bisect.insort(mine, item, key=_place)
                ns = event.namespace
                bisect.insort(self._events_by_ns.setdefault(ns, []), item, key=_place)
                self._event_bytes[ns] = self._event_bytes.get(ns, 0) + event_size(event)
            old = bisect.bisect_left(self._events, (before, 0), key=_place)
            drop = max(old, len(self._events) - max(keep, 0))
            for place, event in self._events[:drop]:
                self._forget_oldest(place, event)
            del self._events[:drop]
            if max_bytes is not None:
                for namespace in {event.namespace for event in events}:
                    self._trim_namespace(namespace, max_bytes)

    def _trim_namespace(self, namespace: str, max_bytes: int) -> None:
        # Caller holds _lock. The namespace's oldest first, as the log is trimmed.
        while self._event_bytes.get(namespace, 0) > max_bytes:
            place, event = self._events_by_ns[namespace][0]
            self._forget_oldest(place, event)
            del self._events[bisect.bisect_left(self._events, place, key=_place)]

    def _forget_oldest(self, place: _Place, event: Event) -> None:
        # Caller holds _lock. The oldest of its namespace goes (the log's oldest is),
        # so the oldest of its key too.
        where = (event.namespace, event.key)
        mine = self._events_by_key.get(where)
        if mine and mine[0][0] == place:
            del mine[0]
            if not mine:
                del self._events_by_key[where]
        ours = self._events_by_ns[event.namespace]
        del ours[0]
        self._event_bytes[event.namespace] -= event_size(event)
        if not ours:
            del self._events_by_ns[event.namespace], self._event_bytes[event.namespace]

    def events(
        self,
        since: float,
        until: float,
        namespaces: Sequence[str] | None,
        after: str | None,
        limit: int,
    ) -> tuple[list[Event], str | None]:
        start: _Place = events_start(since, after, limit)
        if namespaces is not None and not namespaces:
            return [], None  # of no namespace: nothing to read through the whole log
        wanted = None if namespaces is None else set(namespaces)
        page: list[tuple[_Place, Event]] = []
        with self._lock:
            # bisect_right: an event at the cursor's place itself was read already;
            # no event has sequence 0, so (since, 0) excludes nothing at ``since``.
            i = bisect.bisect_right(self._events, start, key=_place)
            while i < len(self._events) and len(page) <= limit:
                place, event = self._events[i]
                if event.at >= until:
                    break
                if wanted is None or event.namespace in wanted:
                    page.append((place, event))
                i += 1
        more = len(page) > limit
        page = page[:limit]
        cursor = event_cursor(*page[-1][0]) if more else None
        return [event for _, event in page], cursor

    def events_for_key(self, namespace: str, key: str, limit: int) -> list[Event]:
        with self._lock:
            mine = list(self._events_by_key.get((namespace, key), []))
        return [event for _, event in reversed(mine[-limit:])] if limit > 0 else []

    def events_bytes(self, namespace: str) -> int:
        with self._lock:
            return self._event_bytes.get(namespace, 0)


def _place(item: tuple[_Place, Event]) -> _Place:
    return item[0]
