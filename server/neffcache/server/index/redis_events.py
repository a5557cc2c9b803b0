"""The events log in Redis (``EventLog``, for redis.py): a sorted set of every event,
each key's newest in a list, each namespace's in a sorted set with their bytes, kept
in step by one script per append (redis_scripts.py). Key layout: redis.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence

import redis
from redis.typing import EncodableT

from .base import Event, event_cursor, events_start
from .redis_primitives import PREFIX, as_str, escaped, lifetime_ms
from .redis_scripts import APPEND_EVENTS, READ_EVENTS

EVENTS = PREFIX + "events"
EVENTS_SEQ = PREFIX + "events-seq"
EVENT_LISTS = PREFIX + "events:"  # then "{ns}:{key}"
EVENTS_BY_NS = PREFIX + "events-ns:"  # then "{ns}"
EVENTS_BYTES = PREFIX + "events-bytes"

# Events per append script: each call holds Redis for its whole batch.
EVENTS_BATCH = 500
# Events read per round trip when only some namespaces are wanted (picked out in Python).
EVENTS_PAGE = 500
# Events kept per (namespace, key) for events_for_key: explanations read a few.
EVENTS_PER_KEY = 100
# Events dropped from the log per script call at most (a lowered events_keep drops
# many at once): each call holds Redis for its whole batch.
TRIM_BATCH = 5000


def _events_key(namespace: str, key: str) -> str:
    # The append script builds the same name from EVENT_LISTS, escaping as escaped() does.
    return f"{EVENT_LISTS}{escaped(namespace)}:{key}"


class RedisEvents:
    """The ``EventLog`` role over one Redis database."""

    def __init__(
        self, client: redis.Redis, mapped: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> None:
        self._redis = client
        self._mapped = mapped
        self._append_events = client.register_script(APPEND_EVENTS)
        self._read_events = client.register_script(READ_EVENTS)

    def append_events(
        self, events: Sequence[Event], keep: int, before: float, max_bytes: int | None = None
    ) -> None:
        # Every call bounds every namespace of the whole append: a later call may
        # still owe an earlier one's trimming.
        bounded = sorted({e.namespace for e in events}) if max_bytes is not None else []
        more = True
        for start in range(0, len(events), EVENTS_BATCH):
            batch = events[start : start + EVENTS_BATCH]
            more = self._append_event_batch(batch, keep, before, max_bytes, bounded)
        while more:  # trimming left for later calls: each drops at most TRIM_BATCH
            more = self._append_event_batch([], keep, before, max_bytes, bounded)

    def _append_event_batch(
        self,
        events: Sequence[Event],
        keep: int,
        before: float,
        max_bytes: int | None,
        bounded: Sequence[str],
    ) -> bool:
        """Append (up to EVENTS_BATCH) events and trim, the ``bounded`` namespaces to
        ``max_bytes`` too; True when more trimming is due."""
        keys = [EVENTS, EVENTS_SEQ, EVENTS_BYTES]
        slots: dict[tuple[str, str], int] = {}
        records: list[EncodableT] = []
        for event in events:
            slot = 0
            if event.key:
                where = (event.namespace, event.key)
                if where not in slots:
                    keys.append(_events_key(*where))
                    slots[where] = len(keys)  # 1-based in Lua
                slot = slots[where]
            records += [repr(event.at), _event_text(event), slot]
        # The lists outlive the newest event of the batch by no more than its retention.
        life_ms = lifetime_ms(max((e.at for e in events), default=before) - before)
        args: list[EncodableT] = [
            keep,
            repr(before),
            EVENTS_PER_KEY,
            life_ms,
            EVENT_LISTS,
            TRIM_BATCH,
            "" if max_bytes is None else max_bytes,
            EVENTS_BY_NS,
            len(bounded),
            *bounded,
            *records,
        ]
        with self._mapped():
            return bool(self._append_events(keys=keys, args=args))

    def events(
        self,
        since: float,
        until: float,
        namespaces: Sequence[str] | None,
        after: str | None,
        limit: int,
    ) -> tuple[list[Event], str | None]:
        at, seq = events_start(since, after, limit)
        if namespaces is not None and not namespaces:
            return [], None  # of no namespace: nothing to read through the whole log
        wanted = None if namespaces is None else set(namespaces)
        # With no filter every event read is kept: read one more than the page.
        page = EVENTS_PAGE if wanted is not None else min(limit + 1, EVENTS_PAGE)
        found: list[tuple[tuple[float, int], Event]] = []
        while len(found) <= limit:
            args: list[EncodableT] = [repr(at), f"{seq:020d}", f"({until!r}", page]
            with self._mapped():
                rows = self._read_events(keys=[EVENTS], args=args)
            members = [as_str(member) for member in rows]
            for member in members:
                place, event = _event_from(member)
                at, seq = place  # read: the next page starts after it
                if wanted is None or event.namespace in wanted:
                    found.append((place, event))
            if len(members) < page:
                break
        more = len(found) > limit
        found = found[:limit]
        cursor = event_cursor(*found[-1][0]) if more else None
        return [event for _, event in found], cursor

    def events_for_key(self, namespace: str, key: str, limit: int) -> list[Event]:
        if limit < 1 or not key:
            return []
        with self._mapped():
            items = self._redis.lrange(_events_key(namespace, key), 0, -1)
        assert isinstance(items, list), type(items)
        # Pushed in order of appending, which replicas' clocks may not quite follow.
        found = [_event_from(as_str(item)) for item in items]
        found.sort(key=lambda pair: pair[0], reverse=True)
        return [event for _, event in found[:limit]]

    def events_bytes(self, namespace: str) -> int:
        with self._mapped():
            value = self._redis.hget(EVENTS_BYTES, namespace)
        return int(as_str(value)) if value is not None else 0


def _event_text(event: Event) -> str:
    # JSON has no raw newline: the body starts after the first one.
    header = json.dumps([event.namespace, event.kind, event.key], ensure_ascii=False)
    return f"{event.at!r} {header}\n{event.body}"


def _event_from(member: str) -> tuple[tuple[float, int], Event]:
    """An events-log member: its place in the log (time, sequence) and its event."""
    seq, at, rest = member.split(" ", 2)
    header, body = rest.split("\n", 1)
    namespace, kind, key = json.loads(header)
    return (float(at), int(seq)), Event(float(at), namespace, kind, key, body)
