"""Pins: entries that are never evicted nor expired.

A pin names one entry (``key``), the entry a stock Neuron address or direct key names
(``address``, resolved whenever eviction runs, so it follows a republished entry), or
every entry of a model label (``model``) or of compiler versions (``compiler-version``,
an exact version or a shell pattern such as ``2.21.*``). Pins are index records (kind
``pin``) of their namespace.

A label is what the publisher wrote, so a label pin protects only the entries of
trusted writers (``Pinned``); ``Pinned.coverage`` counts, per pin, what it protects now
and what it matches without protecting, so that an admin is told rather than finding
out from an eviction.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

from neffcache.protocol import ALIAS
from neffcache.server.errors import BadRequest
from neffcache.server.index import EntryStats, Index, Record
from neffcache.server.manifest import HEX64, canonical_json

PIN = "pin"
KINDS = ("key", "address", "model", "compiler-version")
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
    # An address: a direct key or a stock address, as the alias routes take.
    pattern = {"key": HEX64, "address": ALIAS}.get(kind, _TEXT)
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


@dataclass
class Coverage:
    """What one pin covers now."""

    protects: int = 0
    # Matched by a label pin but not protected (written by a writer not trusted), and
    # named by no key or address pin either.
    unprotected: int = 0

    def view(self, pin: Pin) -> dict[str, Any]:
        return {"protects": self.protects, "unprotected": self.unprotected, "note": self.note(pin)}

    def note(self, pin: Pin) -> str:
        """What an admin should know of this coverage, in plain words; "" when the
        count says it all."""
        if pin.kind in ("key", "address") and not self.protects:
            if pin.kind == "key":
                what = "no entry has this key"
            else:
                what = "no entry is published at this address"
            return (
                f"{what} in {pin.namespace} now: the pin protects the one published under "
                "it (unpin it if the value is a typo)"
            )
        if self.unprotected:
            some = "entry it matches is" if self.unprotected == 1 else "entries it matches are"
            return (
                f"{self.unprotected} {some} not protected: written by tokens that are not "
                "trusted, and a label is only its writer's word (pin those by key or address, "
                "or publish them with a trusted token)"
            )
        if not self.protects:
            label = "model label" if pin.kind == "model" else "compiler version"
            return f"no entry in {pin.namespace} has this {label} now"
        return ""


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
        # The pins naming each entry key now: a key pin's value, an address pin's
        # entry (none while nothing answers to the address).
        self._named: dict[str, list[str]] = {}
        for pin in self.pins:
            key = pin.value if pin.kind == "key" else None
            if pin.kind == "address":
                key = index.resolve_alias(namespace, pin.value)
            if key is not None:
                self._named.setdefault(key, []).append(pin.name)
        self._models = {p.value for p in self.pins if p.kind == "model"}
        self._versions = [p.value for p in self.pins if p.kind == "compiler-version"]

    def __contains__(self, stats: object) -> bool:
        assert isinstance(stats, EntryStats)
        if stats.key in self._named:
            return True
        if not self._trusts(stats):
            return False
        facts = stats.facts
        return (bool(facts.model) and facts.model in self._models) or any(
            version_matches(spec, facts.compiler_version) for spec in self._versions
        )

    def coverage(self, entries: Iterable[EntryStats]) -> dict[str, Coverage]:
        """Per pin name, how many of ``entries`` (the namespace's, as eviction reads
        them) the pin protects, and how many it matches by label without protecting.
        One pass, as a plan makes."""
        found = {pin.name: Coverage() for pin in self.pins}
        for stats in entries:
            for name in self._named.get(stats.key, ()):
                found[name].protects += 1
            trusted = self._trusts(stats)
            for name in self._labelled(stats):
                if trusted:
                    found[name].protects += 1
                elif stats.key not in self._named:  # else a key or address pin keeps it
                    found[name].unprotected += 1
        return found

    def _trusts(self, stats: EntryStats) -> bool:
        return self._trusted is None or stats.writer in self._trusted

    def _labelled(self, stats: EntryStats) -> list[str]:
        """The names of the label pins an entry matches."""
        facts = stats.facts
        found = [f"model:{facts.model}"] if facts.model and facts.model in self._models else []
        found += [
            f"compiler-version:{spec}"
            for spec in self._versions
            if version_matches(spec, facts.compiler_version)
        ]
        return found
