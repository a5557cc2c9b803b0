"""Cold, warm and mixed runs. A run is a job (its ``job_id``, within its namespace):
cold when every graph lookup it reported missed, warm when every one hit, mixed when
both. Lookups without a job id belong to no run. At most ``limit`` jobs are tallied;
the lookups of further jobs are left out of ``runs`` (the report says so)."""

from __future__ import annotations

from typing import Any

from neffcache.server.reports.figures import Graph, hours

DEFAULT_LIMIT = 100_000
# Where clients take a job id from, in their order (the client's ``config.JOB_ID_VARIABLES``,
# which a test keeps equal): the server cannot import the client, and the hint below
# must name what a job can set.
JOB_ID_VARIABLES = (
    "SLURM_JOB_ID",
    "AWS_BATCH_JOB_ID",
    "TRAINING_JOB_NAME",
    "PBS_JOBID",
    "LSB_JOBID",
    "TORCHELASTIC_RUN_ID",
)
JOB_ID_HINT = (
    "no lookup named a job, so no run is counted: set NEFFCACHE_JOB_ID in each job's "
    "environment, or run under a scheduler that sets one of "
    + ", ".join(JOB_ID_VARIABLES)
    + " (docs/client.md)"
)


class Runs:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        # (namespace, job) -> [hits, misses, compile seconds]: small lists, many jobs.
        self._jobs: dict[tuple[str, str], list[float]] = {}
        self.over_limit = False
        self.without_job = 0  # lookups that named no job

    def add(self, graph: Graph) -> None:
        if graph.job is None:
            self.without_job += 1
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

    def hint(self) -> str | None:
        """How to get runs counted, when there were lookups and none named a job: an
        empty ``runs`` otherwise reads as "no job ran"."""
        return JOB_ID_HINT if self.without_job and not self._jobs else None

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
            "lookups_without_job": self.without_job,
            "job_id_hint": self.hint(),
        }
