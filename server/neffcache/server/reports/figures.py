"""FIGURES: what one set of graph lookups cost and saved (docs/reports.md).

A hit is credited with ``saved_seconds``, the compile time of the entry it served; a
miss costs its ``compile_seconds``, failed compiles included. Money is hours times the
hourly price of the event's own instance type; hours of an instance type without a
price are counted apart (``unpriced_hours_*``), never priced by a guess.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from neffcache.server.explain.reasons import reason_label
from neffcache.server.index.base import Event

HOUR = 3600.0
# Rounded in the JSON to about a millisecond and a millionth of a dollar: beyond the
# precision of what clients measure, short of float noise.
HOUR_DIGITS = 9
MONEY_DIGITS = 6


class Graph(NamedTuple):
    """The facts of one ``graph`` event that reports use."""

    at: float  # server clock
    namespace: str
    key: str
    hit: bool
    source: str | None  # l1, server, compiler
    reason: str  # a known reason code, else "unknown" (misses only)
    compile_seconds: float  # 0 when the miss did not compile
    compiled: bool
    failed: bool
    saved_seconds: float  # hits: the served entry's compile time
    instance_type: str | None
    model: str | None
    job: str | None


def graph_of(event: Event) -> Graph | None:
    """The graph event's facts; None for other kinds and for a body that cannot be
    read (stored events were validated, so that means a newer or damaged record)."""
    if event.kind != "graph":
        return None
    try:
        body = json.loads(event.body)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("result") not in ("hit", "miss"):
        return None
    hit = body["result"] == "hit"
    compile_seconds = _seconds(body.get("compile_seconds"))
    outcome = body.get("outcome")
    return Graph(
        at=event.at,
        namespace=event.namespace,
        key=event.key,
        hit=hit,
        source=_text(body.get("source")),
        reason="" if hit else reason_label(body.get("reason") or "unknown"),
        compile_seconds=0.0 if hit else compile_seconds,
        compiled=not hit and (outcome in ("ok", "failed") or _number(body.get("compile_seconds"))),
        failed=not hit and outcome == "failed",
        saved_seconds=_seconds(body.get("saved_seconds")) if hit else 0.0,
        instance_type=_text(body.get("instance_type")),
        model=_text(body.get("model")),
        job=_text(body.get("job_id")),
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds(value: Any) -> float:
    if not _number(value):
        return 0.0
    return float(value) if math.isfinite(value) and value > 0 else 0.0


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


@dataclass(slots=True)
class Priced:
    """Compile seconds, what their instance types' hourly prices make of them, and the
    seconds no price applied to."""

    seconds: float = 0.0
    cost: float = 0.0
    unpriced: float = 0.0  # seconds
    priced: bool = False  # some seconds (more than none) had a price

    def add(self, seconds: float, price: float | None) -> None:
        self.seconds += seconds
        if price is None:
            self.unpriced += seconds
        else:
            self.cost += seconds / HOUR * price
            # Priced hours, not a priced event: a lookup that took or saved none
            # (a hit of a 0 s compile, a miss that never compiled) prices none.
            self.priced |= seconds > 0

    def money(self) -> float | None:
        return money(self.cost, self.priced, self.unpriced)


@dataclass(slots=True)
class Figures:
    lookups: int = 0
    hits: int = 0
    hits_l1: int = 0
    hits_server: int = 0
    misses: int = 0
    compiles: int = 0
    failed_compiles: int = 0
    spent: Priced = field(default_factory=lambda: Priced())
    saved: Priced = field(default_factory=lambda: Priced())
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, graph: Graph, price: float | None) -> None:
        self.lookups += 1
        if graph.hit:
            self.hits += 1
            self.hits_l1 += graph.source == "l1"
            self.hits_server += graph.source == "server"
            self.saved.add(graph.saved_seconds, price)
            return
        self.misses += 1
        self.reasons[graph.reason] = self.reasons.get(graph.reason, 0) + 1
        self.compiles += graph.compiled
        self.failed_compiles += graph.failed
        self.spent.add(graph.compile_seconds, price)

    def as_json(self) -> dict[str, Any]:
        return {
            "lookups": self.lookups,
            "hits": self.hits,
            "hits_l1": self.hits_l1,
            "hits_server": self.hits_server,
            "misses": self.misses,
            "compiles": self.compiles,
            "failed_compiles": self.failed_compiles,
            "hit_rate": round(self.hits / self.lookups, 6) if self.lookups else None,
            "compile_hours_spent": hours(self.spent.seconds),
            "compile_hours_saved": hours(self.saved.seconds),
            "cost_spent": self.spent.money(),
            "cost_saved": self.saved.money(),
            "unpriced_hours_spent": hours(self.spent.unpriced),
            "unpriced_hours_saved": hours(self.saved.unpriced),
            "miss_reasons": dict(sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        }


def hours(seconds: float) -> float:
    return round(seconds / HOUR, HOUR_DIGITS)


def money(amount: float, priced: bool, unpriced_seconds: float) -> float | None:
    """The priced part of a sum, or None when there were hours and none had a price:
    nothing is known then, and 0 would claim it cost nothing."""
    if not priced and unpriced_seconds > 0:
        return None
    return round(amount, MONEY_DIGITS)
