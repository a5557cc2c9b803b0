"""Records (policies, pins, and the server's own marks) written once over ``Maps``:
the records of a kind are the map ``records:{kind}``, each field the JSON
``[namespace, name]`` (no separator a namespace or name could contain makes two
records meet) holding the record's value. (In Redis that is the hash earlier servers
wrote, ``neffcache:records:{kind}``, so replicas of both can share a database.)
"""

from __future__ import annotations

import json

from neffcache.server.errors import StoreError

from .base import Record
from .primitives import Maps

# Rounds of read, then put-if-absent or compare-and-set, before an unconditional
# write or delete gives up: each lost round means another writer changed the record
# in between, which settles within a couple of rounds under any real contention.
ROUNDS = 16


_MAP = "records:"


def records_map(kind: str) -> str:
    return f"{_MAP}{kind}"


def record_field(namespace: str, name: str) -> str:
    return json.dumps([namespace, name])


def documented_kind(map_name: str, kinds: frozenset[str]) -> str | None:
    """The kind whose records ``map_name`` holds, if it is one of ``kinds``."""
    kind = map_name.removeprefix(_MAP)
    return kind if kind != map_name and kind in kinds else None


class MapRecords:
    """The ``Records`` role over any ``Maps``."""

    def __init__(self, maps: Maps) -> None:
        self._maps = maps

    def put_record(
        self, record: Record, *, create_only: bool = False, replacing: str | None = None
    ) -> bool:
        where = records_map(record.kind)
        field = record_field(record.namespace, record.name)
        if create_only:
            return self._maps.put_new(where, field, record.value)
        if replacing is not None:
            return self._maps.swap(where, field, replacing, record.value)
        for _ in range(ROUNDS):
            current = self._maps.get(where, field)
            if current is None:
                if self._maps.put_new(where, field, record.value):
                    return True
            elif self._maps.swap(where, field, current, record.value):
                # Also when equal: a write of the value, as a retry's must be (a
                # documented map writes the record's document after it).
                return True
        raise StoreError(f"record {where} {field}: still contended after {ROUNDS} rounds")

    def get_record(self, kind: str, namespace: str, name: str) -> Record | None:
        value = self._maps.get(records_map(kind), record_field(namespace, name))
        return None if value is None else Record(kind, namespace, name, value)

    def delete_record(self, kind: str, namespace: str, name: str) -> bool:
        where, field = records_map(kind), record_field(namespace, name)
        for _ in range(ROUNDS):
            current = self._maps.get(where, field)
            if current is None:
                return False
            if self._maps.delete_if(where, field, current):
                return True
        raise StoreError(f"record {where} {field}: still contended after {ROUNDS} rounds")

    def records(self, kind: str, namespace: str | None = None) -> list[Record]:
        # One map per kind, read whole: policies and pins are a handful per namespace.
        found = []
        for field, value in self._maps.items(records_map(kind)).items():
            ns, name = json.loads(field)
            if namespace is None or ns == namespace:
                found.append(Record(kind, ns, name, value))
        return sorted(found, key=lambda r: (r.namespace, r.name))
