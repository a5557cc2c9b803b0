"""Cold, warm and mixed runs. A run is a job (its ``job_id``, within its namespace):
cold when every graph lookup it reported missed, warm when every one hit, mixed when
both. Lookups without a job id belong to no run. At most ``limit`` jobs are tallied;
the lookups of further jobs are left out of ``runs`` (the report says so)."""

from __future__ import annotations

from typing import Any

from neffcache.server.reports.figures import Graph, hours

DEFAULT_LIMIT = 100_000


class Runs:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        # (namespace, job) -> [hits, misses, compile seconds]: small lists, many jobs.
        self._jobs: dict[tuple[str, str], list[float]] = {}
        self.over_limit = False

    def add(self, graph: Graph) -> None:
        if graph.job is None:
            return
        where = (graph.namespace, graph.job)
        job = self._jobs.get(where)
        if job is None:
            if len(self._jobs) >= self._limit:
                self.over_limit = True
                return
            job = self._jobs[where] = [0, 0, 0.0]
        job[0 if graph.hit else 1] += 1
        job[2] += graph.compile_seconds

    def as_json(self) -> dict[str, Any]:
        counts = {"cold": 0, "warm": 0, "mixed": 0}
        seconds = {"cold": 0.0, "warm": 0.0, "mixed": 0.0}
        for hits, misses, spent in self._jobs.values():
            kind = "mixed" if hits and misses else "warm" if hits else "cold"
            counts[kind] += 1
            seconds[kind] += spent
        return {
            **counts,
            **{f"{kind}_compile_hours": hours(spent) for kind, spent in seconds.items()},
        }
