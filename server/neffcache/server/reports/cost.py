"""The cost report: graph events, fed in any number of pages, folded into totals,
rows by the chosen groupings, a series of UTC days, runs and the most expensive
misses. Only these aggregates are kept, each bounded, never the events.

>>> from neffcache.server.reports.prices import load_prices
>>> report = CostReport(0.0, 86400.0, ("namespace",), load_prices(None))
>>> report.result([], generated_at=86400.0)["totals"]["lookups"]
0
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from neffcache.server.index.base import Event
from neffcache.server.reports.figures import Figures, Graph, graph_of
from neffcache.server.reports.misses import TopMisses
from neffcache.server.reports.prices import CURRENCY, PriceTable
from neffcache.server.reports.runs import Runs
from neffcache.server.reports.window import DAY, day_index, day_name

# Rows kept apart; the events of further groups are summed in one row whose every
# group value is OTHER (totals stay exact).
MAX_GROUPS = 10_000
OTHER = "(other)"
# Longest series of days filled with empty days; a longer window (since=0) starts at
# its first event instead. Events are kept at most about three years.
MAX_FILLED_DAYS = 3 * 366 + 1
# Instance types listed as unpriced, at most (clients name them).
MAX_UNPRICED_TYPES = 100

GroupKey = tuple[str | None, ...]


class CostReport:
    def __init__(
        self,
        since: float,
        until: float,
        by: Sequence[str],
        prices: PriceTable,
        top: int = 10,
        *,
        miss_limit: int | None = None,
        job_limit: int | None = None,
    ) -> None:
        self.since, self.until, self.by, self.prices, self.top = (
            since,
            until,
            tuple(by),
            prices,
            top,
        )
        self.totals = Figures()
        self.groups: dict[GroupKey, Figures] = {}
        self.days: dict[int, Figures] = {}
        self.misses = TopMisses() if miss_limit is None else TopMisses(miss_limit)
        self.runs = Runs() if job_limit is None else Runs(job_limit)
        self.namespaces: set[str] = set()
        self.unpriced_types: set[str] = set()
        self.applied: set[str] = set()
        self.without_type = 0
        self.other_groups = False

    def add_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    def add(self, event: Event) -> None:
        graph = graph_of(event)
        if graph is None or not self.since <= graph.at < self.until:
            return
        price = self._price(graph)
        self.namespaces.add(graph.namespace)
        self.totals.add(graph, price)
        self._group(graph).add(graph, price)
        day = day_index(graph.at)
        figures = self.days.get(day)
        if figures is None:  # not setdefault: that would build a Figures per event
            figures = self.days[day] = Figures()
        figures.add(graph, price)
        self.misses.add(graph, price)
        self.runs.add(graph)

    def _price(self, graph: Graph) -> float | None:
        # Named as the price table looks it up, so that one type is listed once.
        name = (graph.instance_type or "").strip().lower()
        if not name:
            self.without_type += 1
            return None
        price = self.prices.hourly(name)
        if price is None:
            if len(self.unpriced_types) < MAX_UNPRICED_TYPES:
                self.unpriced_types.add(name)
        else:
            self.applied.add(name)
        return price

    def _group(self, graph: Graph) -> Figures:
        key = tuple(_group_value(graph, name) for name in self.by)
        found = self.groups.get(key)
        if found is None:
            if len(self.groups) >= MAX_GROUPS:
                self.other_groups = True
                key = (OTHER,) * len(self.by)
                found = self.groups.get(key)
            if found is None:
                found = self.groups[key] = Figures()
        return found

    # --- the answer

    def result(self, storage: Sequence[dict[str, Any]], generated_at: float) -> dict[str, Any]:
        """The report as JSON (docs/reports.md); ``storage`` rows are passed through."""
        return {
            "since": self.since,
            "until": self.until,
            "generated_at": generated_at,
            "by": list(self.by),
            "currency": CURRENCY,
            "totals": self.totals.as_json(),
            "rows": self._rows(),
            "days": self._days(generated_at),
            "runs": self.runs.as_json(),
            "top_misses": self.misses.top(self.top),
            "storage": list(storage),
            "prices": self._prices(),
            "notes": self._notes(),
        }

    def _rows(self) -> list[dict[str, Any]]:
        ordered = sorted(self.groups.items(), key=lambda kv: _sort_key(kv[0]))
        return [
            {"group": dict(zip(self.by, key, strict=True)), **figures.as_json()}
            for key, figures in ordered
        ]

    def _days(self, now: float) -> list[dict[str, Any]]:
        wanted = set(self.days)
        end = min(self.until, now)
        start = self.since
        if self.until - self.since > MAX_FILLED_DAYS * DAY:
            # A long window (since=0) starts at its first event's day, at most
            # MAX_FILLED_DAYS before its end, so that a chart's days stay contiguous.
            first = min(self.days, default=None)
            start = end if first is None else max(first * DAY, end - MAX_FILLED_DAYS * DAY)
        if end > start:
            # The end is exclusive: an ``until`` at midnight ends the day before.
            wanted.update(range(day_index(start), day_index(end - 1e-6) + 1))
        empty = Figures()
        return [
            {"day": day_name(day), **self.days.get(day, empty).as_json()} for day in sorted(wanted)
        ]

    def _prices(self) -> dict[str, Any]:
        applied = {name: self.prices.prices[name].as_json() for name in sorted(self.applied)}
        return {
            "table": self.prices.label,
            "shipped_checked": self.prices.shipped_checked,
            "unpriced_instance_types": sorted(self.unpriced_types),
            "events_without_instance_type": self.without_type,
            "applied": applied,
        }

    def _notes(self) -> list[str]:
        notes = []
        if self.other_groups:
            notes.append(f"more than {MAX_GROUPS} groups: the rest are summed in one row {OTHER}")
        if self.misses.approximate:
            notes.append("so many graphs missed that top_misses is approximate")
        if self.runs.over_limit:
            notes.append("so many jobs reported that runs counts only some of them")
        hint = self.runs.hint()
        if hint is not None:  # also in ``runs``; a note reaches whoever shows only notes
            notes.append(hint)
        return notes


def _group_value(graph: Graph, name: str) -> str | None:
    if name == "namespace":
        return graph.namespace
    if name == "day":
        return day_name(day_index(graph.at))
    if name == "model":
        return graph.model
    return graph.job


def _sort_key(key: GroupKey) -> tuple[tuple[bool, str], ...]:
    # None (no model, no job) after every name; OTHER last of all.
    return tuple((value is None or value == OTHER, value or "") for value in key)
