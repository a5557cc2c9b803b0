"""What a compiler upgrade will recompile, per namespace: pure folding of entry stats
and graph events, page by page.

A compiler version is part of every key, so after an upgrade to V every graph misses
once. What matters is the graphs in use: entries the server served within the active
window (by default the namespace's TTL, else 30 days). The version now in use is the
compiler version of the most recently served of those (or the one asked for); its
active entries are the graphs that will miss under V, unless that version is V
already, or the graph is built under V already: an entry of a version matching V, in
the namespace or one it reads through, holds the same graph (``programs.py``). Those
are done; the rest are to rebuild. Their compile seconds (as published) are the
hours to rebuild them; money is those hours at the hourly price of the instance type
the namespace's jobs reported for that model (else for any model), from the events
of the window.

The prewarm plan orders the graphs by value, hits x compile seconds: compiling the
most valuable first means that an upgrade started before the plan is done still finds
the graphs that save most. Graphs whose compile time is unknown come last.
"""

from __future__ import annotations

import heapq
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neffcache.server.eviction.pins import version_matches
from neffcache.server.index import EntryStats
from neffcache.server.index.base import Event
from neffcache.server.reports.figures import HOUR, HOUR_DIGITS, MONEY_DIGITS, graph_of, hours, money
from neffcache.server.reports.prices import PriceTable

DEFAULT_ACTIVE_SECONDS = 30 * 86400.0
MAX_VERSIONS = 1000
MAX_MODELS = 10_000
MAX_TYPE_COUNTS = 10_000
# Graphs built under the target version remembered per namespace (a digest each, about
# 100 bytes of memory): past it, graphs whose build is not remembered count as to
# rebuild, and the report says so.
MAX_BUILT = 2_000_000


@dataclass(slots=True)
class _Model:
    graphs: int = 0  # to rebuild
    done: int = 0  # built under the target version already
    seconds: float = 0.0  # known compile seconds
    unknown: int = 0  # graphs without a compile time
    value: float = 0.0  # sum of hits x compile seconds


@dataclass
class _Version:
    """The active entries of one compiler version."""

    entries: int = 0
    done: int = 0  # built under the target version already
    last_served: float = 0.0  # latest served or, never served, published
    last_hit: float = 0.0  # latest served of those served at least once; 0: none
    models: dict[str | None, _Model] = field(default_factory=dict)
    # The most valuable graphs: a min-heap of (known, value, hits, key, stats).
    best: list[tuple[bool, float, int, str, EntryStats]] = field(default_factory=list)


class NamespaceUpgrade:
    def __init__(
        self,
        namespace: str,
        to_compiler: str,
        active_since: float,
        top: int,
        from_compiler: str | None = None,
    ) -> None:
        self.namespace = namespace
        self.to_compiler = to_compiler
        self.active_since = active_since
        self.top = top
        self.from_compiler = from_compiler
        self.versions: dict[str, _Version] = {}
        # The graphs built under the target version (``programs.program_of``).
        self.built: set[bytes] = set()
        self.built_partial = False  # more than MAX_BUILT: some not remembered
        self.unknown_version = 0
        self.inactive = 0
        # (model, instance type) -> [compiles, lookups] reported in the window.
        self.types: dict[tuple[str | None, str], list[int]] = {}

    # --- folding

    def add_built(self, programs: Iterable[bytes], *, partial: bool = False) -> None:
        """Graphs built under the target version: entries of it, here or in a
        namespace read through. Call before ``add_entries``."""
        for program in programs:
            if len(self.built) >= MAX_BUILT:
                self.built_partial = True
                return
            self.built.add(program)
        self.built_partial |= partial

    def wants_program(self, stats: EntryStats) -> bool:
        """Whether ``add_entry`` would tell ``stats`` done or to rebuild by its graph:
        in use, of a known version other than the target, and something built."""
        version = stats.facts.compiler_version
        return (
            bool(self.built)
            and stats.last_access >= self.active_since
            and bool(version)
            and not version_matches(self.to_compiler, version)
        )

    def add_entries(
        self, page: Iterable[EntryStats], programs: Mapping[str, bytes | None] | None = None
    ) -> None:
        """``programs``: the graphs of the entries ``wants_program`` names, by key."""
        programs = programs or {}
        for stats in page:
            self.add_entry(stats, programs.get(stats.key))

    def add_entry(self, stats: EntryStats, program: bytes | None = None) -> None:
        """Fold one entry; ``program``: its graph (``programs.program_of``), if read."""
        version = self._version(stats)
        if version is None:
            return
        name = stats.facts.model or None
        model = version.models.get(name)
        if model is None and len(version.models) < MAX_MODELS:
            model = version.models[name] = _Model()
        if program is not None and program in self.built:
            version.done += 1
            if model is not None:
                model.done += 1
            return
        seconds = stats.facts.compile_seconds
        value = stats.hits * (seconds or 0.0)
        if model is not None:
            model.graphs += 1
            model.seconds += seconds or 0.0
            model.unknown += seconds is None
            model.value += value
        item = (seconds is not None, value, stats.hits, stats.key, stats)
        if len(version.best) < self.top:
            heapq.heappush(version.best, item)
        elif self.top and item[:4] > version.best[0][:4]:
            heapq.heapreplace(version.best, item)

    def _version(self, stats: EntryStats) -> _Version | None:
        """The version an entry in use counts in, its use counted; None for an entry
        not in use, of no known version, or past MAX_VERSIONS."""
        if stats.last_access < self.active_since:
            self.inactive += 1
            return None
        name = stats.facts.compiler_version
        if not name:
            self.unknown_version += 1
            return None
        version = self.versions.get(name)
        if version is None:
            if len(self.versions) >= MAX_VERSIONS:
                return None
            version = self.versions[name] = _Version()
        version.entries += 1
        version.last_served = max(version.last_served, stats.last_access)
        if stats.hits:
            version.last_hit = max(version.last_hit, stats.last_access)
        return version

    def add_events(self, events: Iterable[Event]) -> None:
        for event in events:
            graph = graph_of(event)
            if graph is None or graph.instance_type is None:
                continue
            where = (graph.model, graph.instance_type.strip().lower())
            counts = self.types.get(where)
            if counts is None:
                if len(self.types) >= MAX_TYPE_COUNTS:
                    continue
                counts = self.types[where] = [0, 0]
            counts[0] += graph.compiled
            counts[1] += 1

    # --- the answer

    def current(self) -> str | None:
        """The version now in use: the one a job was served most recently (of those
        matching ``from_compiler``, a version or a pattern such as ``2.21.*``, if
        given). An entry published and never served (a prewarm's, under the new
        compiler) is not in use yet; without any entry served, the latest published."""
        wanted = self.from_compiler
        found = [
            (version.last_hit, version.last_served, name)
            for name, version in self.versions.items()
            if wanted is None or version_matches(wanted, name)
        ]
        return max(found)[2] if found else None

    def instance_type(self, model: str | None) -> str | None:
        """The instance type the namespace's jobs compile ``model`` on: the one with the
        most compiles (then lookups) reported for it, else for any model."""
        return self._busiest(model, only_model=True) or self._busiest(model, only_model=False)

    def _busiest(self, model: str | None, *, only_model: bool) -> str | None:
        summed: dict[str, list[int]] = {}
        for (name, kind), (compiles, lookups) in self.types.items():
            if name == model or not only_model:
                counts = summed.setdefault(kind, [0, 0])
                counts[0] += compiles
                counts[1] += lookups
        if not summed:
            return None
        return max(summed.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))[0]

    def result(self, prices: PriceTable, server: str) -> dict[str, Any]:
        """The namespace's part of the upgrade report; ``server`` is the URL jobs use
        (``http://host:port``), for the commands of the plan."""
        current = self.current()
        version = self.versions.get(current) if current is not None else None
        on_target = current is not None and version_matches(self.to_compiler, current)
        rebuild = version is not None and not on_target
        models = sorted(
            (version.models.items() if rebuild and version is not None else []),
            key=lambda kv: (-kv[1].value, -kv[1].seconds, kv[0] or ""),
        )
        # A model whose every graph is built already has nothing left to run.
        models = [(name, model) for name, model in models if model.graphs]
        steps = [self._step(name, model, prices, server) for name, model in models]
        best = version.best if rebuild and version is not None else []
        graphs = sorted(best, key=lambda item: item[:4], reverse=True)
        return {
            "namespace": self.namespace,
            "from_compiler": current,
            "already_on_target": on_target,
            "active_since": self.active_since,
            "versions_in_use": {
                name: {"entries": v.entries, "last_served": v.last_served}
                for name, v in sorted(self.versions.items())
            },
            "entries_without_version": self.unknown_version,
            **_sum_steps(steps),
            "graphs_done": version.done if rebuild and version is not None else 0,
            "instance_type": self.instance_type(None),
            "prewarm": {
                "models": steps,
                "graphs": [self._graph(item[4]) for item in graphs],
            },
            "notes": self._notes(),
        }

    def _notes(self) -> list[str]:
        if not self.built_partial:
            return []
        return [
            f"more than {MAX_BUILT} graphs built under {self.to_compiler}: some graphs "
            "counted to rebuild may be built already"
        ]

    def _step(
        self, name: str | None, model: _Model, prices: PriceTable, server: str
    ) -> dict[str, Any]:
        kind = self.instance_type(name)
        hourly = prices.hourly(kind)
        return {
            "model": name,
            "graphs": model.graphs,
            "graphs_done": model.done,
            "compile_hours": hours(model.seconds),
            "unknown_compile_time": model.unknown,
            "value_hours": hours(model.value),
            "instance_type": kind,
            "cost": None if hourly is None else round(model.seconds / HOUR * hourly, MONEY_DIGITS),
            "run": self._command(name, server),
        }

    def _command(self, model: str | None, server: str) -> str:
        """What to run: the model's compile under the new compiler, publishing here."""
        url = f"NEFFCACHE_URL=neffcache+{server.rstrip('/')}/{self.namespace}"
        if model is None:
            job = "the training command of the jobs that set no NEFFCACHE_MODEL"
            return (
                f"with neuronx-cc {self.to_compiler} installed: {url} "
                f"neuron_parallel_compile <{job}>"
            )
        label = f"NEFFCACHE_MODEL={shlex.quote(model)}"
        return (
            f"with neuronx-cc {self.to_compiler} installed: {url} {label} "
            f"neuron_parallel_compile <the training command of {model}>"
        )

    def _graph(self, stats: EntryStats) -> dict[str, Any]:
        seconds = stats.facts.compile_seconds
        return {
            "key": stats.key,
            "model": stats.facts.model or None,
            "compile_seconds": seconds,
            "hits": stats.hits,
            "last_access": stats.last_access,
            "value_hours": None if seconds is None else hours(stats.hits * seconds),
        }


def _sum_steps(steps: list[dict[str, Any]]) -> dict[str, Any]:
    spent = sum(s["compile_hours"] for s in steps)
    unpriced = sum(s["compile_hours"] for s in steps if s["cost"] is None)
    priced = any(s["cost"] is not None and s["compile_hours"] > 0 for s in steps)
    return {
        "graphs": sum(s["graphs"] for s in steps),
        "compile_hours": round(spent, HOUR_DIGITS),
        "unknown_compile_time": sum(s["unknown_compile_time"] for s in steps),
        "cost": _money([s["cost"] for s in steps], priced, unpriced),
        "unpriced_hours": round(unpriced, HOUR_DIGITS),
    }


def totals(namespaces: list[dict[str, Any]]) -> dict[str, Any]:
    """Every namespace's graphs, hours and money together (each kind summed apart)."""
    spent = sum(n["compile_hours"] for n in namespaces)
    unpriced = sum(n["unpriced_hours"] for n in namespaces)
    # A namespace priced some hours when it has more hours than unpriced ones.
    priced = any(
        n["cost"] is not None and n["compile_hours"] > n["unpriced_hours"] for n in namespaces
    )
    return {
        "graphs": sum(n["graphs"] for n in namespaces),
        "graphs_done": sum(n["graphs_done"] for n in namespaces),
        "compile_hours": round(spent, HOUR_DIGITS),
        "unknown_compile_time": sum(n["unknown_compile_time"] for n in namespaces),
        "cost": _money([n["cost"] for n in namespaces], priced, unpriced),
        "unpriced_hours": round(unpriced, HOUR_DIGITS),
    }


def _money(costs: list[float | None], priced: bool, unpriced_hours: float) -> float | None:
    """The priced costs summed, under the cost report's rule (``figures.money``): None
    when there were hours and none had a price, as 0 would claim they cost nothing."""
    return money(sum(cost for cost in costs if cost is not None), priced, unpriced_hours)
