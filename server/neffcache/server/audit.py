"""The audit log: every eviction, expiry, pin, policy and token change, with who did
it, when and why. Stored in the index (so every replica writes one log), bounded to
the ``audit_keep`` newest records.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from typing import Any

from neffcache.server.errors import StoreError
from neffcache.server.index import AuditRecord, Index, Token
from neffcache.server.manifest import canonical_json

log = logging.getLogger("neffcache.server.audit")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def record(
    actor: str, action: str, namespace: str = "", target: str = "", **detail: Any
) -> AuditRecord:
    """One audit record stamped now; ``detail`` says why and how much."""
    return AuditRecord(
        at=time.time(),
        actor=actor,
        action=action,
        namespace=namespace,
        target=target,
        detail=canonical_json(detail),
    )


def token_created(actor: str, token: Token) -> AuditRecord:
    return record(
        actor,
        "token.create",
        "",
        token.token_id,
        scope=token.scope,
        namespaces=list(token.namespaces),
        name=token.name,
        trusted=token.trusted,
    )


class AuditLog:
    def __init__(self, index: Index, keep: int) -> None:
        self._index = index
        self._keep = keep

    def write(self, records: Sequence[AuditRecord]) -> None:
        """Append records. The action they record has happened: if the index cannot
        take them, they go to the server's log instead of failing the request (a
        token whose secret was never shown, a removal reported as an error)."""
        if not records:
            return
        try:
            self._index.append_audit(records, self._keep)
        except StoreError as exc:
            for lost in records:
                log.error("audit log unavailable (%s); record: %s", exc, lost.as_json())
            return
        # Also a line each in the server's log: every admin change and removal passes
        # here, and an operator reads the log before thinking of `admin audit`.
        if log.isEnabledFor(logging.INFO):
            for done in records:
                log.info("%s", log_line(done))

    def add(
        self, actor: str, action: str, namespace: str = "", target: str = "", **detail: Any
    ) -> None:
        self.write([record(actor, action, namespace, target, **detail)])

    def query(self, since: float, namespace: str | None, limit: int) -> list[AuditRecord]:
        return self._index.audit(since, namespace, limit)


def log_line(done: AuditRecord) -> str:
    """One record as one line: ``audit: ACTION NS/TARGET by ACTOR DETAIL``. Actors
    carry token names, which an admin chose: control characters are escaped."""
    where = "/".join(part for part in (done.namespace, done.target) if part) or "*"
    line = f"audit: {done.action} {where} by {done.actor} {done.detail or '{}'}"
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", line)
