"""Namespace policies: how long entries live, how much a namespace may hold, who may
write it and which other namespaces it reads through.

A namespace needs no record to be used: without one it has the defaults (the server's
``default_ttl_seconds`` and ``failure_ttl_seconds``, no quota, any writer). A record
holds only the fields an admin set, so a changed server default reaches every
namespace that never chose otherwise. Records live in the index (kind ``policy``), so
every replica applies the same rules; each replica caches them for a second or two.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from neffcache.protocol import is_namespace
from neffcache.server.index import Index, Record
from neffcache.server.manifest import canonical_json, load_json, validated
from neffcache.server.settings import ServerSettings

POLICY = "policy"
DAY = 86400.0
# Read-through is a list a person writes; a long one is a mistake, and each entry costs
# a lookup on every miss.
READ_THROUGH_MAX = 8


class PolicyFields(BaseModel):
    """The settable fields, each optional: a create or a change names only what it sets.
    ``null`` for ttl, quota, entry size and versions means "no limit"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_seconds: float | None = Field(
        None, ge=60, le=3650 * DAY, allow_inf_nan=False, description="unused this long: expired"
    )
    quota_bytes: int | None = Field(None, ge=1, description="bytes of entries kept at most")
    max_entry_bytes: int | None = Field(None, ge=1, description="largest entry accepted")
    compiler_versions: int | None = Field(
        None, ge=1, le=1000, description="compiler versions retained (most recently used)"
    )
    failure_ttl_seconds: float = Field(
        3600.0, gt=0, le=366 * DAY, allow_inf_nan=False, description="failure record life"
    )
    read_through: tuple[str, ...] = Field(
        (), max_length=READ_THROUGH_MAX, description="namespaces read after this one, in order"
    )
    trusted_writers_only: bool = Field(False, description="only trusted tokens may publish")
    ranking: Literal["value", "lru"] = Field("value", description="what a quota evicts first")

    @field_validator("read_through")
    @classmethod
    def _names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not is_namespace(name):
                raise ValueError(f"{name!r} is not a namespace name")
        if len(set(names)) != len(names):
            raise ValueError("a namespace is listed twice")
        return names


class NamespacePolicy(PolicyFields):
    """The effective policy of a namespace: its record over the server's defaults."""

    namespace: str
    created: bool = Field(False, description="whether an admin created the namespace")

    def view(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def parse_fields(body: bytes) -> tuple[PolicyFields, set[str]]:
    """A create or change request: the fields, and which of them it names."""
    raw = load_json(body, "policy") if body.strip() else {}
    fields = validated(PolicyFields, raw, "policy")
    return fields, set(fields.model_fields_set)


def defaults(settings: ServerSettings) -> dict[str, Any]:
    return {
        "ttl_seconds": settings.default_ttl_seconds,
        "failure_ttl_seconds": settings.failure_ttl_seconds,
    }


def effective(
    namespace: str, stored: dict[str, Any] | None, settings: ServerSettings
) -> NamespacePolicy:
    values = {**defaults(settings), **(stored or {})}
    return NamespacePolicy(namespace=namespace, created=stored is not None, **values)


def stored_fields(index: Index, namespace: str) -> dict[str, Any] | None:
    """The fields an admin set for a namespace, or None when it has no record."""
    record = index.get_record(POLICY, namespace, "")
    if record is None:
        return None
    value: dict[str, Any] = json.loads(record.value)
    return value


def store_fields(
    index: Index,
    namespace: str,
    fields: dict[str, Any],
    *,
    create: bool,
    replacing: str | None = None,
) -> bool:
    """Store a namespace's fields: new (``create``), or over the stored JSON
    ``replacing`` (compare-and-set); False when that is no longer what is stored."""
    record = Record(POLICY, namespace, "", canonical_json(fields))
    return index.put_record(record, create_only=create, replacing=replacing)


class Policies:
    """Effective policies, read from the index at most once per ``ttl`` seconds each.

    Publishing and every lookup miss need a namespace's policy; a change made through
    this replica applies at once (``forget``), one made through another within ``ttl``.
    """

    def __init__(self, index: Index, settings: ServerSettings, ttl: float = 2.0) -> None:
        self._index = index
        self._settings = settings
        self._ttl = ttl
        self._cache: dict[str, tuple[float, NamespacePolicy]] = {}
        self._lock = threading.Lock()

    def get(self, namespace: str) -> NamespacePolicy:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(namespace)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        policy = effective(namespace, stored_fields(self._index, namespace), self._settings)
        with self._lock:
            if len(self._cache) > 4096:  # names nobody asks for again
                self._cache.clear()
            self._cache[namespace] = (now, policy)
        return policy

    def current(self, namespace: str) -> NamespacePolicy:
        """The policy as the index holds it now (and cached from now on): for the
        decisions a stale answer would make unsafe, such as who may write."""
        self.forget(namespace)
        return self.get(namespace)

    def forget(self, namespace: str) -> None:
        with self._lock:
            self._cache.pop(namespace, None)

    def all(self) -> list[NamespacePolicy]:
        """Every namespace with a record or an entry, with its effective policy."""
        stored = {r.namespace: json.loads(r.value) for r in self._index.records(POLICY)}
        names = sorted(set(stored) | set(self._index.namespaces()))
        return [effective(name, stored.get(name), self._settings) for name in names]

    def sources(self, namespace: str) -> list[str]:
        """The namespaces a lookup in ``namespace`` reads after its own, in order. A
        namespace that takes only trusted writers reads only namespaces that do too,
        so an untrusted writer can never change what its readers receive."""
        policy = self.get(namespace)
        if not policy.trusted_writers_only:
            return list(policy.read_through)
        # Read now, not from the cache: a source opened to any writer through another
        # replica a moment ago must not be read. (Opening a namespace that a trusted
        # one reads through is refused anyway; this holds if that check is raced.)
        return [n for n in policy.read_through if self.current(n).trusted_writers_only]
