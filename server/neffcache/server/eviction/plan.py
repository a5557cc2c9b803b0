"""What should leave a namespace now, and why: pure functions over entry stats.

Rules, in order, none of which touches a pinned entry:

1. expiry: unused (not served, by the server's clock) for longer than the TTL;
2. compiler retention: entries of compiler versions beyond the N most recently used
   (so a rollback to the previous compiler keeps its graphs, and a compiler nobody
   runs any more leaves together);
3. quota: while the namespace holds more than its quota, the entries worth least go
   first, down to ``LOW_WATER`` of the quota so that the next publish does not
   trigger another pass. "Worth" is the ranking the namespace chose: ``lru`` (least
   recently served first) or ``value`` (below).

The value of an entry is the compile time it is expected to save per byte kept: its
compile seconds times a use factor, ``1 + log2(1 + times served)``, halved for every
``half_life`` seconds since it was last served, divided by its size. A 40-minute graph
outlives a 10-second one of the same size and use; a graph nobody has asked for in
days loses to one in use today. An entry whose compile time is unknown (imported from
a stock cache) is valued at the namespace's median.

Why the logarithm and a half-life of a day (the server's default): with a linear hit
count and a week's half-life, an entry served a hundred times outranked a fresh one
for about ``half_life * log2(101)``, some 46 days, so after a compiler upgrade (or a
code change) the old compiler's entries filled the quota and the new ones were evicted
before their second use. ``tests/bench/bench_eviction.py`` measured that as value
saving 0.85-1.0x the compile-hours of LRU; with both changes it saves more than LRU on
every seed tried (1.015-1.147x over seeds 1-40 at a 30 % quota, up to 1.23x at 20 %),
including seeds not used to choose them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

from neffcache.server.index import EntryStats
from neffcache.server.namespaces import NamespacePolicy
from neffcache.server.units import human_bytes

LOW_WATER = 0.9
# Compile seconds assumed for an entry without any, when no entry of its namespace says.
ASSUMED_COMPILE_SECONDS = 60.0


@dataclass(frozen=True)
class Victim:
    stats: EntryStats
    reason: str  # "expired", "compiler-retention", "quota", "admin-expire"
    why: str  # the same in plain words


@dataclass
class Plan:
    namespace: str
    victims: list[Victim] = field(default_factory=list)
    entries: int = 0
    bytes_before: int = 0
    pinned_bytes: int = 0
    # Set when pinned entries alone exceed the quota: nothing more can be done.
    over_quota_pinned: bool = False

    @property
    def bytes_after(self) -> int:
        return self.bytes_before - sum(v.stats.facts.size for v in self.victims)


def compile_seconds(stats: EntryStats, assumed: float) -> float:
    seconds = stats.facts.compile_seconds
    return assumed if seconds is None else seconds


def assumed_seconds(entries: Sequence[EntryStats]) -> float:
    known = [e.facts.compile_seconds for e in entries if e.facts.compile_seconds is not None]
    return statistics.median(known) if known else ASSUMED_COMPILE_SECONDS


def value(stats: EntryStats, now: float, half_life: float, assumed: float) -> float:
    """Expected compile seconds saved per byte kept (see the module's docstring)."""
    age = max(0.0, now - stats.last_access)
    decay: float = 0.5 ** (age / half_life)
    uses = 1 + math.log2(1 + stats.hits)
    return compile_seconds(stats, assumed) * uses * decay / max(1, stats.facts.size)


def plan_namespace(
    entries: Sequence[EntryStats],
    policy: NamespacePolicy,
    pinned: Container[EntryStats],
    now: float,
    half_life: float,
) -> Plan:
    plan = Plan(policy.namespace, entries=len(entries))
    plan.bytes_before = sum(e.facts.size for e in entries)
    plan.pinned_bytes = sum(e.facts.size for e in entries if e in pinned)
    kept = [e for e in entries if e not in pinned]
    gone: set[str] = set()

    def drop(entry: EntryStats, reason: str, why: str) -> None:
        plan.victims.append(Victim(entry, reason, why))
        gone.add(entry.key)

    if policy.ttl_seconds is not None:
        for entry in kept:
            unused = now - entry.last_access
            if unused > policy.ttl_seconds:
                drop(
                    entry, "expired", f"unused for {_days(unused)}; TTL {_days(policy.ttl_seconds)}"
                )
    if policy.compiler_versions is not None:
        retained = _recent_versions(entries, policy.compiler_versions)
        for entry in kept:
            version = entry.facts.compiler_version
            if entry.key not in gone and version and version not in retained:
                drop(
                    entry,
                    "compiler-retention",
                    f"compiler {version} is not among the {policy.compiler_versions} most "
                    "recently used",
                )
    if policy.quota_bytes is not None:
        used = plan.bytes_after
        if used > policy.quota_bytes:
            target = int(policy.quota_bytes * LOW_WATER)
            remaining = [e for e in kept if e.key not in gone]
            # As the admin reads sizes (100.0 KiB where they wrote 100K), not bytes.
            why = f"namespace over its quota of {human_bytes(policy.quota_bytes)}"
            for entry in _ranked(remaining, policy.ranking, now, half_life):
                if used <= target:
                    break
                drop(entry, "quota", why)
                used -= entry.facts.size
            plan.over_quota_pinned = used > policy.quota_bytes
    return plan


def _ranked(
    entries: Sequence[EntryStats], ranking: str, now: float, half_life: float
) -> list[EntryStats]:
    """Least worth first; ties by least recently served, then key (a stable order)."""
    if ranking == "lru":
        return sorted(entries, key=lambda e: (e.last_access, e.key))
    assumed = assumed_seconds(entries)
    return sorted(entries, key=lambda e: (value(e, now, half_life, assumed), e.last_access, e.key))


def _recent_versions(entries: Sequence[EntryStats], keep: int) -> set[str]:
    latest: dict[str, float] = {}
    for entry in entries:
        version = entry.facts.compiler_version
        if version:
            latest[version] = max(latest.get(version, 0.0), entry.last_access)
    ordered = sorted(latest, key=lambda v: (latest[v], v), reverse=True)
    return set(ordered[:keep])


def _days(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds:.0f} s"
