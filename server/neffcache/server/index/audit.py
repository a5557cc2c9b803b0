"""The audit log (``AuditLog``), written once over ``Sequences`` (sequences.py) for
every backend: one log, ``audit-log``, whose items are the records, grouped by
namespace, the action as the head and ``[actor, target, detail]`` in JSON as the body.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .base import AuditRecord
from .sequences import Item, Placed, Sequences, Trim

# Not "audit": in Redis that names the sorted set earlier servers kept the log in,
# whose records move to this log once (redis_upgrade.py).
AUDIT_LOG = "audit-log"


class SequenceAudit:
    """The ``AuditLog`` role over a backend's sequences."""

    def __init__(self, sequences: Sequences) -> None:
        self._sequences = sequences

    def append_audit(self, records: Sequence[AuditRecord], keep: int) -> None:
        self._sequences.append(AUDIT_LOG, [audit_item(r) for r in records], Trim(keep))

    def audit(self, since: float, namespace: str | None, limit: int) -> list[AuditRecord]:
        found = self._sequences.newest(AUDIT_LOG, namespace, None, since, limit)
        return [_record(placed) for placed in found]


def audit_item(record: AuditRecord) -> Item:
    """The log's item of a record (also for moving records stored before the log)."""
    body = json.dumps([record.actor, record.target, record.detail], ensure_ascii=False)
    return Item(record.at, record.namespace, "", record.action, body)


def _record(placed: Placed) -> AuditRecord:
    item = placed.item
    actor, target, detail = json.loads(item.body)
    return AuditRecord(item.at, actor, item.head, item.group, target, detail)
