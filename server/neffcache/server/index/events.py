"""The events log (``EventLog``), written once over ``Sequences`` (sequences.py) for
every backend: one log, ``events``, whose items are the events, grouped by namespace
and tagged by key, the kind as the head and the body as the body, so a namespace's
bytes are its bodies' (``event_size``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .base import Event, event_cursor, events_start
from .sequences import Item, Placed, Sequences, Trim

EVENTS = "events"


class SequenceEvents:
    """The ``EventLog`` role over a backend's sequences."""

    def __init__(self, sequences: Sequences) -> None:
        self._sequences = sequences

    def append_events(
        self, events: Sequence[Event], keep: int, before: float, max_bytes: int | None = None
    ) -> None:
        items = [Item(e.at, e.namespace, e.key, e.kind, e.body) for e in events]
        self._sequences.append(EVENTS, items, Trim(keep, before, max_bytes))

    def events(
        self,
        since: float,
        until: float,
        namespaces: Sequence[str] | None,
        after: str | None,
        limit: int,
    ) -> tuple[list[Event], str | None]:
        start = events_start(since, after, limit)
        if namespaces is not None and not namespaces:
            return [], None  # of no namespace: nothing to read through the whole log
        # One more than the page: whether another follows.
        found = self._sequences.read(EVENTS, start, until, namespaces, limit + 1)
        more = len(found) > limit
        found = found[:limit]
        cursor = event_cursor(*found[-1].place) if more else None
        return [_event(placed) for placed in found], cursor

    def events_for_key(self, namespace: str, key: str, limit: int) -> list[Event]:
        # Events without a key belong to none.
        if not key or limit < 1:
            return []
        found = self._sequences.newest(EVENTS, namespace, key, -math.inf, limit)
        return [_event(placed) for placed in found]

    def events_bytes(self, namespace: str) -> int:
        return self._sequences.group_bytes(EVENTS, namespace)


def _event(placed: Placed) -> Event:
    item = placed.item
    return Event(item.at, item.group, item.head, item.tag, item.body)
