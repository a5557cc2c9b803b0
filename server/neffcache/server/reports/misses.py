"""The most expensive missed graphs: one tally per (namespace, key), bounded.

Ordered by compile-hours spent on the graph's misses, then by how often it missed,
then by namespace and key (money would rank the same hours differently by instance
type, and some hours have no price). Up to ``limit`` graphs are tallied exactly; past
that the cheapest half is dropped and the ranking becomes approximate (the report
says so): a graph dropped early and missed again later starts a new tally.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neffcache.server.reports.figures import Graph, Priced, hours

DEFAULT_LIMIT = 20_000


@dataclass(slots=True)
class _Tally:
    namespace: str
    key: str
    misses: int = 0
    spent: Priced = field(default_factory=lambda: Priced())
    model: str | None = None
    reason: str = "unknown"
    last_at: float = 0.0

    def rank(self) -> tuple[float, int]:
        return (self.spent.seconds, self.misses)

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "key": self.key,
            "model": self.model,
            "reason": self.reason,
            "misses": self.misses,
            "compile_hours": hours(self.spent.seconds),
            "cost": self.spent.money(),
            "last_at": self.last_at,
        }


class TopMisses:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = max(2, limit)
        self._tallies: dict[tuple[str, str], _Tally] = {}
        self.approximate = False

    def add(self, graph: Graph, price: float | None) -> None:
        if graph.hit or not graph.key:
            return
        where = (graph.namespace, graph.key)
        tally = self._tallies.get(where)
        if tally is None:
            if len(self._tallies) >= self._limit:
                self._prune()
            tally = self._tallies[where] = _Tally(graph.namespace, graph.key)
        tally.misses += 1
        tally.spent.add(graph.compile_seconds, price)
        # Events come oldest first: the latest miss names the graph's current state.
        if graph.at >= tally.last_at:
            tally.last_at = graph.at
            tally.reason = graph.reason
            tally.model = graph.model or tally.model

    def _prune(self) -> None:
        kept = sorted(self._tallies.values(), key=_Tally.rank, reverse=True)
        self._tallies = {(t.namespace, t.key): t for t in kept[: self._limit // 2]}
        self.approximate = True

    def top(self, count: int) -> list[dict[str, Any]]:
        ordered = sorted(
            self._tallies.values(), key=lambda t: (-t.spent.seconds, -t.misses, t.namespace, t.key)
        )
        return [tally.as_json() for tally in ordered[:count]]
