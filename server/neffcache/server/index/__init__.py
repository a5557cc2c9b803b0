"""Indexes, chosen by URL scheme: ``sqlite:///path``, ``redis://host:port/db``, ``memory://``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import (
    AuditRecord,
    Entry,
    EntryFacts,
    EntryStats,
    Event,
    Failure,
    Lease,
    PutResult,
    Record,
    Token,
    Touch,
    entry_facts,
)
from .roles import AuditLog, Entries, EventLog, Failures, Index, Leases, Records, Tokens

if TYPE_CHECKING:
    from .primitive_roles import IndexBackend

__all__ = [
    "AuditLog",
    "AuditRecord",
    "Entries",
    "Entry",
    "EntryFacts",
    "EntryStats",
    "Event",
    "EventLog",
    "Failure",
    "Failures",
    "Index",
    "Lease",
    "Leases",
    "PutResult",
    "Record",
    "Records",
    "Token",
    "Tokens",
    "Touch",
    "entry_facts",
    "open_index",
]


_SCHEMES = {
    "sqlite": ("neffcache.server.index.sqlite", "SqliteIndex", "sqlite:///path"),
    "redis": ("neffcache.server.index.redis", "RedisIndex", "redis://host:port/db"),
    "rediss": ("neffcache.server.index.redis", "RedisIndex", "rediss://host:port/db"),
    "memory": ("neffcache.server.index.memory", "MemoryIndex", "memory://"),
}


def open_index(url: str) -> IndexBackend:
    """Open the index a URL names; an unknown scheme or a missing extra is a
    ConfigError that says how to fix it."""
    from neffcache.server.config_errors import open_by_scheme

    index: IndexBackend = open_by_scheme(url, "index", _SCHEMES)
    return index
