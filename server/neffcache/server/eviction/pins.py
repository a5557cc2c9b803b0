"""Pins: entries that are never evicted nor expired.

A pin names one entry (``key``), the entry a stock Neuron address or direct key names
(``address``, resolved whenever eviction runs, so it follows a republished entry), or
every entry of a model label (``model``) or of compiler versions (``compiler-version``,
an exact version or a shell pattern such as ``2.21.*``). Pins are index records (kind
``pin``) of their namespace.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from neffcache.server.errors import BadRequest
from neffcache.server.index import EntryStats, Index, Record
from neffcache.server.manifest import HEX64, canonical_json

PIN = "pin"
KINDS = ("key", "address", "model", "compiler-version")
# A direct key or a stock address; the same shapes the alias routes take.
_ADDRESS = rf"{HEX64}|neuronxcc-[0-9][0-9A-Za-z.+]*/MODULE_[0-9A-Za-z]{{1,128}}\+[0-9a-f]{{8}}"
_TEXT = r"[^\x00-\x1f\x7f]{1,200}"


@dataclass(frozen=True)
class Pin:
    namespace: str
    kind: str
    value: str
    reason: str
    actor: str
    at: float

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.value}"

    def view(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "kind": self.kind,
            "value": self.value,
            "reason": self.reason,
            "actor": self.actor,
            "at": self.at,
        }

    def record(self) -> Record:
        fields = {k: v for k, v in self.view().items() if k != "namespace"}
        return Record(PIN, self.namespace, self.name, canonical_json(fields))


def check_pin(kind: str, value: str) -> None:
    """BadRequest unless ``value`` is a well-formed pin of ``kind``."""
    if kind not in KINDS:
        raise BadRequest(f"pin kind {kind!r} is not one of {', '.join(KINDS)}")
    pattern = {"key": HEX64, "address": _ADDRESS}.get(kind, _TEXT)
    if not re.fullmatch(pattern, value):
        what = {"key": "a 64-hex key", "address": "a Neuron address or direct key"}
        raise BadRequest(f"{value[:80]!r} is not {what.get(kind, 'a name of 1-200 characters')}")


def pins(index: Index, namespace: str) -> list[Pin]:
    found = []
    for record in index.records(PIN, namespace):
        fields = json.loads(record.value)
        found.append(
            Pin(
                namespace=record.namespace,
                kind=fields["kind"],
                value=fields["value"],
                reason=fields.get("reason", ""),
                actor=fields.get("actor", ""),
                at=float(fields.get("at", 0.0)),
            )
        )
    return found


def version_matches(spec: str, version: str) -> bool:
    """Whether a compiler version matches an exact version or a shell pattern."""
    return bool(version) and (spec == version or fnmatch.fnmatchcase(version, spec))


class Pinned:
    """The pins of one namespace, ready to test entries against.

    A model label and a compiler version are what the publisher wrote in its
    manifest: a pin by label protects only the entries of ``trusted_writers`` (token
    ids; None: every writer), or any write token could label its entries to put them
    beyond the quota. A pin by key or address names the entry itself.
    """

    def __init__(
        self, index: Index, namespace: str, trusted_writers: Container[str] | None = None
    ) -> None:
        self._trusted = trusted_writers
        self.pins = pins(index, namespace)
        self._keys = {p.value for p in self.pins if p.kind == "key"}
        for pin in self.pins:
            if pin.kind == "address":
                key = index.resolve_alias(namespace, pin.value)
                if key is not None:
                    self._keys.add(key)
        self._models = {p.value for p in self.pins if p.kind == "model"}
        self._versions = [p.value for p in self.pins if p.kind == "compiler-version"]

    def __contains__(self, stats: object) -> bool:
        assert isinstance(stats, EntryStats)
        if stats.key in self._keys:
            return True
        if self._trusted is not None and stats.writer not in self._trusted:
            return False
        facts = stats.facts
        return (bool(facts.model) and facts.model in self._models) or any(
            version_matches(spec, facts.compiler_version) for spec in self._versions
        )
