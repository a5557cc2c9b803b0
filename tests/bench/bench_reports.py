"""Cost-report benchmark: how long a report over N stored events takes,
against the floor of reading the same events and parsing their JSON.

    python tests/bench/bench_reports.py [--events 200000] [--namespaces 8]

Events are graph events as clients send them (hits and misses over 30 days, several
namespaces, models, jobs and instance types, miss reasons; misses carry components),
appended through ``Index.append_events`` into a fresh SQLite index and a fresh
in-memory one. For each index it times:

* ``report``: the server's own ``build_cost_report`` (``reports/collect.py``), a page of
  1,000 events at a time in the calling thread, folded into every figure, by
  namespace and model;
* ``floor``: the same pages read with ``Index.events`` and each body parsed with
  ``json.loads``, nothing folded: what any report over these events must spend.

It prints seconds per million events for both and their ratio (report / floor): the
cost of the aggregation itself. Each figure is the best of three runs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for part in ("keying", "client", "server"):
    sys.path.insert(0, str(ROOT / part))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import record  # noqa: E402

from neffcache.server.auth import TokenPresence  # noqa: E402
from neffcache.server.blobs.memory import MemoryBlobStore  # noqa: E402
from neffcache.server.deps import Backends  # noqa: E402
from neffcache.server.index import Index  # noqa: E402
from neffcache.server.index.base import Event  # noqa: E402
from neffcache.server.index.memory import MemoryIndex  # noqa: E402
from neffcache.server.index.sqlite import SqliteIndex  # noqa: E402
from neffcache.server.manifest import canonical_json  # noqa: E402
from neffcache.server.reports.collect import EVENT_PAGE, build_cost_report  # noqa: E402
from neffcache.server.settings import ServerSettings  # noqa: E402

DAY = 86400.0
REASONS = ("new-graph", "compiler-changed", "flags-changed", "evicted", "shapes-changed")
TYPES = ("trn1.32xlarge", "trn2.48xlarge", "inf2.48xlarge", None)


def make_events(count: int, namespaces: int, now: float, seed: int = 1) -> list[Event]:
    rng = random.Random(seed)
    events = []
    for i in range(count):
        at = now - rng.random() * 30 * DAY
        namespace = f"team-{rng.randrange(namespaces)}"
        hit = rng.random() < 0.8
        key = f"{rng.randrange(20_000):064x}"
        body: dict[str, Any] = {
            "kind": "graph",
            "namespace": namespace,
            "at": at,
            "client_at": at - rng.random(),
            "key": key,
            "result": "hit" if hit else "miss",
            "source": rng.choice(("l1", "server")) if hit else "compiler",
            "job_id": f"job-{i // 50}",
            "host": f"host-{rng.randrange(64)}",
            "model": f"model-{rng.randrange(12)}",
            "via": "hook",
            "pid": rng.randrange(1 << 16),
            "compiler_version": "2.20.9961.0+0acef03a",
        }
        instance = rng.choice(TYPES)
        if instance:
            body["instance_type"] = instance
        if hit:
            body["saved_seconds"] = rng.lognormvariate(4.5, 1.0)
            body["fetch_seconds"] = rng.random()
            body["bytes"] = rng.randrange(1 << 20, 1 << 28)
        else:
            body["reason"] = rng.choice(REASONS)
            body["compile_seconds"] = rng.lognormvariate(4.5, 1.0)
            body["outcome"] = "ok" if rng.random() < 0.95 else "failed"
            body["components"] = {
                "fingerprint": f"{rng.randrange(1 << 60):064x}",
                "compiler_version": "2.20.9961.0+0acef03a",
                "target": "trn2",
                "flags": ["--model-type=transformer", "--optlevel=2"],
                "env": {},
                "graph": {"structure": f"{rng.randrange(1 << 60):064x}", "instructions": 118},
            }
        events.append(Event(at, namespace, "graph", key, canonical_json(body)))
    events.sort(key=lambda e: e.at)
    return events


def best_of(runs: int, fn: Any) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def floor(index: Index, since: float, until: float) -> int:
    seen = 0
    after: str | None = None
    while True:
        page, after = index.events(since, until, None, after, EVENT_PAGE)
        for event in page:
            json.loads(event.body)
        seen += len(page)
        if after is None:
            return seen


def measure(name: str, index: Index, events: list[Event], now: float) -> tuple[float, float]:
    for start in range(0, len(events), 5000):
        index.append_events(events[start : start + 5000], keep=len(events) + 1, before=0.0)
    settings = ServerSettings(eviction_interval_seconds=0)
    backends = Backends(settings, MemoryBlobStore(), index, TokenPresence(index))
    since, until = now - 31 * DAY, now + 1

    def report() -> None:
        result = build_cost_report(backends, since, until, ("namespace", "model"), None, 10)
        assert result["totals"]["lookups"] == len(events), result["totals"]

    def read() -> None:
        assert floor(index, since, until) == len(events)

    report_s = best_of(3, report)
    floor_s = best_of(3, read)
    per_million = 1e6 / len(events)
    print(
        f"{name:8} report {report_s * per_million:6.1f} s/M events   "
        f"floor (read + json.loads) {floor_s * per_million:6.1f} s/M   "
        f"ratio {report_s / floor_s:5.2f}x"
    )
    record(
        "reports",
        f"cost report over {len(events):,} events, {name} index",
        report_s * per_million,
        "reading the same events and json.loads of each",
        floor_s * per_million,
        "s per million events",
        better="lower",
    )
    return report_s, floor_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--namespaces", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="20,000 events")
    args = parser.parse_args()
    if args.quick:
        args.events = 20_000
    now = time.time()
    events = make_events(args.events, args.namespaces, now)
    print(f"{len(events)} graph events, {args.namespaces} namespaces, 30 days")
    measure("memory", MemoryIndex(), events, now)
    with tempfile.TemporaryDirectory() as tmp:
        index = SqliteIndex.from_url(f"sqlite:///{tmp}/index.db")
        try:
            measure("sqlite", index, events, now)
        finally:
            index.close()


if __name__ == "__main__":
    main()
