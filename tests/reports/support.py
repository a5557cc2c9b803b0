"""Events as the index stores them, for the report tests (``reports.support``)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

from neffcache.server.index.base import Event

HOUR = 3600.0
DAY = 86400.0


def key(n: int | str) -> str:
    return hashlib.sha256(f"key {n}".encode()).hexdigest()


def utc(text: str) -> float:
    """Epoch seconds of an ISO time, UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def graph(at: float, namespace: str = "team-a", **fields: Any) -> Event:
    """A stored ``graph`` event: its fields as a client sends them, stamped ``at``."""
    body = {"kind": "graph", "namespace": namespace, **fields, "at": at}
    return Event(at, namespace, "graph", fields.get("key", ""), json.dumps(body, sort_keys=True))


def hit(at: float, saved: float, **fields: Any) -> Event:
    return graph(at, result="hit", saved_seconds=saved, **fields)


def miss(at: float, compiled: float | None = None, **fields: Any) -> Event:
    """A miss; with ``compiled``, one that compiled for that long (ok unless told)."""
    if compiled is not None:
        fields = {"compile_seconds": compiled, "outcome": "ok", **fields}
    return graph(at, result="miss", source="compiler", **fields)
