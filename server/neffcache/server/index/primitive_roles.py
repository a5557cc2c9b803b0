"""``PrimitiveRoles``: every role written once over the primitives (primitives.py),
sequences (sequences.py) and catalogs (catalogs.py), for every backend to inherit:
entries and aliases (entries.py), compile leases (leases.py), failure records
(failures.py), tokens (tokens.py), records (records.py), the audit log (audit.py) and
the events log (events.py). A backend passes its own ``Cells``, ``Logs``, ``Maps``,
``Sequences`` and ``Catalogs``, and provides, of ``Index``, only ``check`` and ``close``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .audit import SequenceAudit
from .base import (
    AuditRecord,
    Entry,
    EntryStats,
    Event,
    Failure,
    Lease,
    PutResult,
    Record,
    Token,
    Touch,
)
from .catalogs import Catalogs
from .entries import CatalogEntries
from .events import SequenceEvents
from .failures import LogFailures
from .leases import CellLeases
from .primitives import Cells, Logs, Maps
from .records import MapRecords
from .roles import Index
from .sequences import Sequences
from .tokens import MapTokens


class IndexBackend(Index, Protocol):
    """An index as every backend is: its roles over primitives it exposes, so that a
    wrapper (``DurableIndex``) can write them over wrapped primitives of its own."""

    maps: Maps
    catalogs: Catalogs

    def tokens_ready(self) -> MapTokens:
        """The tokens role, once tokens stored by earlier servers have moved into
        ``maps``."""
        ...


class PrimitiveRoles:
    """``Entries``, ``Leases``, ``Failures``, ``Tokens``, ``Records``, ``AuditLog``
    and ``EventLog`` over a backend's primitives, which stay reachable as ``cells``,
    ``logs``, ``maps``, ``sequences`` and ``catalogs`` (the contract tests of
    tests/contract/test_primitives.py, test_sequences.py and test_catalogs.py use
    them)."""

    def __init__(
        self, cells: Cells, logs: Logs, maps: Maps, sequences: Sequences, catalogs: Catalogs
    ) -> None:
        self.cells = cells
        self.logs = logs
        self.maps = maps
        self.sequences = sequences
        self.catalogs = catalogs
        self._entries = CatalogEntries(catalogs)
        self._leases = CellLeases(cells)
        self._failures = LogFailures(logs)
        self._tokens = MapTokens(maps)
        self._records = MapRecords(maps)
        self._audit = SequenceAudit(sequences)
        self._events = SequenceEvents(sequences)

    def tokens_ready(self) -> MapTokens:
        """The tokens role, once the backend has moved any tokens an earlier server
        stored elsewhere (Redis does, on first use)."""
        return self._tokens

    def _audit_ready(self) -> SequenceAudit:
        """The audit role, once the backend has moved any records an earlier server
        stored elsewhere (Redis does, on first use)."""
        return self._audit

    # --- entries

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        return self._entries.put_entry(entry, aliases)

    def get_entry(self, namespace: str, key: str) -> Entry | None:
        return self._entries.get_entry(namespace, key)

    def resolve_alias(self, namespace: str, alias: str) -> str | None:
        return self._entries.resolve_alias(namespace, alias)

    def aliases_of(self, namespace: str, key: str) -> list[str]:
        return self._entries.aliases_of(namespace, key)

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        return self._entries.add_alias(namespace, alias, key)

    def list_entries(self, namespace: str, after: str | None, limit: int) -> list[Entry]:
        return self._entries.list_entries(namespace, after, limit)

    def entry_stats(self, namespace: str, after: str | None, limit: int) -> list[EntryStats]:
        return self._entries.entry_stats(namespace, after, limit)

    def touch_entries(self, touches: Sequence[Touch]) -> None:
        self._entries.touch_entries(touches)

    def delete_entry(self, namespace: str, key: str, created_at: float) -> bool:
        return self._entries.delete_entry(namespace, key, created_at)

    def namespaces(self) -> list[str]:
        return self._entries.namespaces()

    # --- failures

    def put_failure(self, failure: Failure, keep: int) -> None:
        self._failures.put_failure(failure, keep)

    def failures(self, namespace: str, key: str, now: float) -> list[Failure]:
        return self._failures.failures(namespace, key, now)

    # --- leases

    def acquire_lease(self, lease: Lease, replacing: str | None = None) -> Lease:
        return self._leases.acquire_lease(lease, replacing)

    def renew_lease(self, namespace: str, name: str, lease_id: str, expires_at: float) -> bool:
        return self._leases.renew_lease(namespace, name, lease_id, expires_at)

    def release_lease(
        self, namespace: str, name: str, lease_id: str, failed_until: float | None
    ) -> bool:
        return self._leases.release_lease(namespace, name, lease_id, failed_until)

    def get_lease(self, namespace: str, name: str, now: float) -> Lease | None:
        return self._leases.get_lease(namespace, name, now)

    # --- tokens

    def put_token(self, token: Token) -> None:
        self.tokens_ready().put_token(token)

    def token_by_hash(self, secret_hash: str) -> Token | None:
        return self.tokens_ready().token_by_hash(secret_hash)

    def tokens(self) -> list[Token]:
        return self.tokens_ready().tokens()

    def revoke_token(self, token_id: str) -> bool:
        return self.tokens_ready().revoke_token(token_id)

    # --- records

    def put_record(
        self, record: Record, *, create_only: bool = False, replacing: str | None = None
    ) -> bool:
        return self._records.put_record(record, create_only=create_only, replacing=replacing)

    def get_record(self, kind: str, namespace: str, name: str) -> Record | None:
        return self._records.get_record(kind, namespace, name)

    def delete_record(self, kind: str, namespace: str, name: str) -> bool:
        return self._records.delete_record(kind, namespace, name)

    def records(self, kind: str, namespace: str | None = None) -> list[Record]:
        return self._records.records(kind, namespace)

    # --- audit

    def append_audit(self, records: Sequence[AuditRecord], keep: int) -> None:
        self._audit_ready().append_audit(records, keep)

    def audit(self, since: float, namespace: str | None, limit: int) -> list[AuditRecord]:
        return self._audit_ready().audit(since, namespace, limit)

    # --- telemetry events

    def append_events(
        self, events: Sequence[Event], keep: int, before: float, max_bytes: int | None = None
    ) -> None:
        self._events.append_events(events, keep, before, max_bytes)

    def events_bytes(self, namespace: str) -> int:
        return self._events.events_bytes(namespace)

    def events(
        self,
        since: float,
        until: float,
        namespaces: Sequence[str] | None,
        after: str | None,
        limit: int,
    ) -> tuple[list[Event], str | None]:
        return self._events.events(since, until, namespaces, after, limit)

    def events_for_key(self, namespace: str, key: str, limit: int) -> list[Event]:
        return self._events.events_for_key(namespace, key, limit)
