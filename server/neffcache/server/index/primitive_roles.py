"""``PrimitiveRoles``: the roles written once over the primitives (primitives.py),
for every backend to inherit: compile leases (leases.py), failure records
(failures.py), tokens (tokens.py) and records (records.py). A backend passes its own
``Cells``, ``Logs`` and ``Maps``, and provides the other roles itself.
"""

from __future__ import annotations

from .base import Failure, Lease, Record, Token
from .failures import LogFailures
from .leases import CellLeases
from .primitives import Cells, Logs, Maps
from .records import MapRecords
from .tokens import MapTokens


class PrimitiveRoles:
    """``Leases``, ``Failures``, ``Tokens`` and ``Records`` over a backend's
    primitives, which stay reachable as ``cells``, ``logs`` and ``maps`` (the contract
    tests of tests/contract/test_primitives.py use them)."""

    def __init__(self, cells: Cells, logs: Logs, maps: Maps) -> None:
        self.cells = cells
        self.logs = logs
        self.maps = maps
        self._leases = CellLeases(cells)
        self._failures = LogFailures(logs)
        self._tokens = MapTokens(maps)
        self._records = MapRecords(maps)

    def _tokens_ready(self) -> MapTokens:
        """The tokens role, once the backend has moved any tokens an earlier server
        stored elsewhere (Redis does, on first use)."""
        return self._tokens

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
        self._tokens_ready().put_token(token)

    def token_by_hash(self, secret_hash: str) -> Token | None:
        return self._tokens_ready().token_by_hash(secret_hash)

    def tokens(self) -> list[Token]:
        return self._tokens_ready().tokens()

    def revoke_token(self, token_id: str) -> bool:
        return self._tokens_ready().revoke_token(token_id)

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
