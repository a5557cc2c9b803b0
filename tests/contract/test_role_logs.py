"""The ``AuditLog`` and ``EventLog`` roles on every backend: bounded logs read in
order."""

from __future__ import annotations

import json

from support.indexes import KEY, index, store

from neffcache.server.index import AuditLog, AuditRecord, Event, EventLog
from neffcache.server.index.base import event_size

__all__ = ["index", "store"]


def audit(at: float, namespace: str = "team-a") -> AuditRecord:
    return AuditRecord(at, "admin", "pin", namespace, KEY, "{}")


def test_audit_keeps_the_newest_and_reads_newest_first(index: AuditLog) -> None:
    index.append_audit([audit(1.0), audit(2.0, "team-b"), audit(3.0)], keep=2)
    assert [r.at for r in index.audit(0.0, None, 10)] == [3.0, 2.0]
    assert [r.at for r in index.audit(0.0, "team-a", 10)] == [3.0]


def event(at: float, namespace: str = "team-a", key: str = KEY) -> Event:
    body = json.dumps({"at": at, "namespace": namespace, "key": key})
    return Event(at, namespace, "graph", key, body)


def test_events_page_in_time_order_and_per_key_newest_first(index: EventLog) -> None:
    index.append_events([event(1.0), event(2.0, "team-b"), event(3.0)], keep=10, before=0.0)
    page, cursor = index.events(0.0, 10.0, None, None, 2)
    assert [e.at for e in page] == [1.0, 2.0]
    assert cursor is not None
    rest, last = index.events(0.0, 10.0, None, cursor, 2)
    assert ([e.at for e in rest], last) == ([3.0], None)
    assert [e.at for e in index.events_for_key("team-a", KEY, 5)] == [3.0, 1.0]
    assert index.events_bytes("team-a") == event_size(event(1.0)) + event_size(event(3.0))


def test_events_are_bounded_by_age_and_count(index: EventLog) -> None:
    index.append_events([event(float(at)) for at in range(1, 6)], keep=3, before=2.0)
    page, _ = index.events(0.0, 10.0, ["team-a"], None, 10)
    assert [e.at for e in page] == [3.0, 4.0, 5.0]
