"""Failure records written once over ``Logs``: the records of (namespace, key) are the
log ``failures:{namespace}:{key}``, each item ``"<created_at> <nonce> <record JSON>"``
scored by its ``expires_at``. Expired items go by score and trimming keeps the
highest-scored, the longest-lived: with one TTL setting, the newest. (The Redis layout
is the one earlier servers wrote, so replicas of both can share a database.)
"""

from __future__ import annotations

import secrets

from .base import Failure
from .primitives import Logs


def failures_log(namespace: str, key: str) -> str:
    # Escaped as lease names are (leases.py): "a:b"/"c" and "a"/"b:c" stay apart.
    escaped = namespace.replace("%", "%25").replace(":", "%3A")
    return f"failures:{escaped}:{key}"


def failure_item(failure: Failure) -> str:
    # The nonce keeps two identical records of one instant two items.
    return f"{failure.created_at!r} {secrets.token_hex(8)} {failure.record}"


class LogFailures:
    """The ``Failures`` role over any ``Logs``."""

    def __init__(self, logs: Logs) -> None:
        self._logs = logs

    def put_failure(self, failure: Failure, keep: int) -> None:
        log = failures_log(failure.namespace, failure.key)
        item = failure_item(failure)
        self._logs.add(log, item, failure.expires_at, keep, failure.created_at)

    def failures(self, namespace: str, key: str, now: float) -> list[Failure]:
        records = []
        for item, expires_at in self._logs.read(failures_log(namespace, key), now):
            created_at, _nonce, record = item.split(" ", 2)
            records.append(Failure(namespace, key, record, float(created_at), expires_at))
        records.sort(key=lambda f: f.created_at, reverse=True)  # newest first
        return records
