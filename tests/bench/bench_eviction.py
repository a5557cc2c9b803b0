"""Eviction benchmark: the ``value`` ranking against ``lru`` on a synthetic
month of a team's traffic, under a quota.

    python tests/bench/bench_eviction.py [--seed 1] [--scale 1.0] [--quota-share 0.3]

The real eviction code decides what leaves: a ``MemoryIndex`` holds the entries, the
namespace's policy record (``store_fields``) sets the quota and the ranking, and an
``Evictor`` on a simulated clock plans and applies every 5 simulated minutes, as the
server's background pass does (blob collection is left out: it frees bytes of no
entry and changes no lookup). A lookup is ``index.get_entry``; a hit is recorded with
``index.touch_entries`` (what the server's access log flushes) and credits the
entry's compile seconds as saved; a miss is a compile (its compile seconds spent)
followed by a publish (``index.put_entry`` of a manifest validated by the API's
``parse_manifest``: key, one ``model.neff`` file with its digest and size, compile
seconds, compiler version, model label). Both policies replay the same trace, made
once from the seed, in two processes.

The traffic model (one namespace, a team's training jobs over 30 days):

* Models: 12 (times ``--scale``), each of a size class: 40 % small (BERT/ViT-sized),
  35 % medium (7-8B, sharded), 25 % large (70B-class). Each has 20 to 200 graphs
  (log-uniform): the training step and its parts, eval graphs, bucketed shapes.
* Compile time per graph: log-normal, sigma 1.0 around a per-model median (30-50 s
  small, ~2.5 min medium, ~8 min large, each model's times 0.3 sigma off its class),
  clipped to 5 s .. 90 min: most graphs compile in under a few minutes, a few of a
  big model's take 30-40 minutes, as neuronx-cc does on real training steps.
* NEFF size: log-normal, sigma 1.0 around a per-model median (10 MB small, 25 MB
  medium, 60 MB large, 0.5 sigma off its class; a NEFF holds one rank's shard, so it
  grows less with the model than the compile time does), clipped to 1 MB .. 800 MB.
  Within a model the log size correlates with the log compile time at only 0.3 (a big
  NEFF is often a big but simple graph; a slow compile is often a small graph the
  scheduler struggles with); across models both grow with the model. The realised
  correlations are printed.
* Popularity: Zipf (s = 1.1) over the models, ranks shuffled against size classes; a
  third of the models are not active all month (a project that starts, or ends,
  within it). Jobs arrive as a Poisson process, 48 a day (times ``--scale``: launches,
  restarts, sweeps), each for an active model chosen by popularity.
* A job looks up each graph it runs once (the hosts of a job share one compile
  through the compile lease, and their hits are the same whatever the ranking, so a
  job counts as one lookup per graph; a real server counts a hit per host, so its
  entries' hit counts are larger than here). Half of a model's graphs run in every job (the
  training step); each of the others runs in a job with its own probability, 5-90 %
  (eval, other sequence lengths, debug configurations).
* Code changes: per model, change events arrive at 0.3-3 a week (log-uniform; a
  model under active development changes more than a mature one); each replaces
  5-30 % of the model's graphs with new versions (new keys; compile time and size
  within 20 % and 10 % of the old). 20 % of jobs run code up to a week old (resumed
  runs, branches), the rest the latest.
* A compiler upgrade on day 15: every key changes (compile times within 20 %, sizes
  within 10 % of the old compiler's). It rolls out over 2 days; after that 5 % of jobs
  still run the old compiler (images pinned to it).

The quota is ``--quota-share`` (default 30 %) of the bytes of every distinct entry
the month publishes, so the working set of the month does not fit; the default TTL
(30 days) never fires within the month, and no compiler retention is set. The value
ranking's half-life is the server's setting (``NEFFCACHE_VALUE_HALF_LIFE_SECONDS`` in
the environment changes it; the figure used is printed). A pass can remove nothing
while the namespace is within its quota (the TTL cannot fire yet): such passes are
skipped, which gives the same figures as planning every 5 minutes (``--every-pass``)
many times faster.

Printed, for each policy side by side: lookups, hits, hit rate, compile-hours spent
(on misses) and saved (on hits), re-compile hours (misses of entries published
before, so evicted), evictions, bytes evicted, and the ratio value / LRU of compile-
hours saved; then the hours saved week by week. "no quota" is the bound no ranking
can pass: every entry kept (computed from the trace, no evictor). No assertion: the
figures are the result.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.server.audit import AuditLog
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.blobuse import BlobUse
from neffcache.server.eviction.evictor import Evictor
from neffcache.server.index import Entry, PutResult, Touch
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.manifest import parse_manifest
from neffcache.server.namespaces import Policies, store_fields
from neffcache.server.settings import ServerSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import record

DAY = 86400.0
WEEK = 7 * DAY
MB = 1_000_000
NAMESPACE = "team"
PASS_SECONDS = 300.0  # the server's eviction_interval_seconds default
COMPILERS = ("2.20.1.0", "2.21.0.0")  # before and after the upgrade

# Size classes: share of the models, median compile seconds, median NEFF size.
CLASSES = (
    ("small", 0.40, 40.0, 10 * MB),
    ("medium", 0.35, 150.0, 25 * MB),
    ("large", 0.25, 480.0, 60 * MB),
)
COMPILE_SIGMA = 1.0
SIZE_SIGMA = 1.0
SIZE_COMPILE_RHO = 0.3  # within a model, on the log scale
COMPILE_CLIP = (5.0, 90 * 60.0)
SIZE_CLIP = (1 * MB, 800 * MB)
ZIPF_S = 1.1
CORE_SHARE = 0.5  # graphs every job of the model runs
OLD_CODE_SHARE = 0.2  # jobs running code up to OLD_CODE_DAYS old
OLD_CODE_DAYS = 7.0
RAMP_DAYS = 2.0
OLD_COMPILER_TAIL = 0.05


@dataclass(frozen=True)
class Graph:
    """One version of one graph under one compiler: one cache key."""

    key: str
    digest: str
    model: str
    compiler: str
    compile_seconds: float
    size: int


@dataclass(frozen=True)
class Job:
    at: float
    graphs: tuple[Graph, ...]


@dataclass
class Slot:
    """A graph of a model across its code versions: (since, compile seconds, size)."""

    use: float  # probability that a job of the model runs it
    versions: list[tuple[float, float, int]]


@dataclass
class Model:
    name: str
    kind: str
    weight: float
    start: float
    end: float
    slots: list[Slot]


@dataclass
class Trace:
    jobs: list[Job]
    models: list[Model]
    keys: dict[str, Graph]  # every distinct key looked up


@dataclass
class Result:
    ranking: str
    lookups: int = 0
    hits: int = 0
    spent: float = 0.0  # compile seconds
    saved: float = 0.0
    recompiled: float = 0.0  # compile seconds of misses of keys published before
    evictions: int = 0
    bytes_evicted: int = 0
    passes: int = 0
    skipped: int = 0  # passes that could find nothing to do (see replay)
    peak_bytes: int = 0
    saved_by_week: list[float] = field(default_factory=list)
    wall: float = 0.0


def _clip(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _hex(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


# --- the trace


def make_models(rng: random.Random, count: int, days: float) -> list[Model]:
    ranks = list(range(1, count + 1))
    rng.shuffle(ranks)
    # Each class's share of the models, rounded; the last class takes the remainder.
    counts = [round(share * count) for _, share, _, _ in CLASSES[:-1]]
    classes = [
        c for c, n in zip(CLASSES, [*counts, count - sum(counts)], strict=True) for _ in range(n)
    ]
    models = []
    for i, (kind, _, compile_median, size_median) in enumerate(classes):
        mu_c = math.log(compile_median) + rng.gauss(0.0, 0.3)
        mu_s = math.log(size_median) + rng.gauss(0.0, 0.5)
        start, end = 0.0, days * DAY
        window = rng.random()
        if window < 1 / 6:
            start = rng.uniform(0.0, 0.66 * days) * DAY  # a project that starts
        elif window < 1 / 3:
            end = rng.uniform(0.33 * days, days) * DAY  # one that ends
        churn_per_week = math.exp(rng.uniform(math.log(0.3), math.log(3.0)))
        slots = []
        for _ in range(int(math.exp(rng.uniform(math.log(20), math.log(201))))):
            z_c = rng.gauss(0.0, 1.0)
            z_s = SIZE_COMPILE_RHO * z_c + math.sqrt(1 - SIZE_COMPILE_RHO**2) * rng.gauss(0.0, 1.0)
            seconds = _clip(math.exp(mu_c + COMPILE_SIGMA * z_c), COMPILE_CLIP)
            size = int(_clip(math.exp(mu_s + SIZE_SIGMA * z_s), SIZE_CLIP))
            use = 1.0 if rng.random() < CORE_SHARE else rng.uniform(0.05, 0.9)
            slots.append(Slot(use, [(-math.inf, seconds, size)]))
        t = start
        while True:
            t += rng.expovariate(churn_per_week / WEEK)
            if t >= end:
                break
            changed = rng.sample(slots, max(1, round(rng.uniform(0.05, 0.3) * len(slots))))
            for slot in changed:
                _, seconds, size = slot.versions[-1]
                seconds = _clip(seconds * rng.lognormvariate(0.0, 0.2), COMPILE_CLIP)
                size = int(_clip(size * rng.lognormvariate(0.0, 0.1), SIZE_CLIP))
                slot.versions.append((t, seconds, size))
        models.append(Model(f"model-{i:02d}-{kind}", kind, ranks[i] ** -ZIPF_S, start, end, slots))
    return models


def make_trace(seed: int, scale: float, days: float, upgrade_day: float) -> Trace:
    rng = random.Random(seed)
    models = make_models(rng, max(2, round(12 * scale)), days)
    rate = 48 * scale / DAY
    upgrade = upgrade_day * DAY
    keys: dict[str, Graph] = {}
    # Each graph version's compile time and size under the new compiler, drawn once.
    upgraded: dict[tuple[str, int, int], tuple[float, int]] = {}
    jobs = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= days * DAY:
            break
        active = [m for m in models if m.start <= t < m.end]
        if not active:
            continue
        model = rng.choices(active, [m.weight for m in active])[0]
        new_share = _clip((t - upgrade) / (RAMP_DAYS * DAY), (0.0, 1.0 - OLD_COMPILER_TAIL))
        new = t >= upgrade and rng.random() < new_share
        code = t - rng.uniform(0.0, OLD_CODE_DAYS * DAY) if rng.random() < OLD_CODE_SHARE else t
        graphs = []
        for s, slot in enumerate(model.slots):
            if slot.use < 1.0 and rng.random() >= slot.use:
                continue
            v = bisect.bisect_right([since for since, _, _ in slot.versions], code) - 1
            _, seconds, size = slot.versions[v]
            if new:
                where = (model.name, s, v)
                if where not in upgraded:
                    upgraded[where] = (
                        _clip(seconds * rng.lognormvariate(0.0, 0.2), COMPILE_CLIP),
                        int(_clip(size * rng.lognormvariate(0.0, 0.1), SIZE_CLIP)),
                    )
                seconds, size = upgraded[where]
            compiler = COMPILERS[new]
            key = _hex("key", model.name, s, v, compiler)
            graph = keys.get(key)
            if graph is None:
                graph = Graph(key, _hex("blob", key), model.name, compiler, seconds, size)
                keys[key] = graph
            graphs.append(graph)
        jobs.append(Job(t, tuple(graphs)))
    return Trace(jobs, models, keys)


# --- the replay


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now


def manifest(graph: Graph) -> str:
    body = {
        "key": graph.key,
        "files": {"model.neff": {"digest": graph.digest, "size": graph.size}},
        "compile_seconds": graph.compile_seconds,
        "components": {"compiler_version": graph.compiler},
        "model": graph.model,
    }
    _, canonical = parse_manifest(json.dumps(body).encode(), graph.key)
    return canonical


def replay(ranking: str, jobs: Sequence[Job], quota: int, days: float, every_pass: bool) -> Result:
    """Both policies' run: the same trace through the real index and evictor."""
    started = time.perf_counter()
    index = MemoryIndex()
    blobs = MemoryBlobStore()
    settings = ServerSettings(index_url="memory://", blob_url="memory://")
    store_fields(index, NAMESPACE, {"quota_bytes": quota, "ranking": ranking}, create=True)
    policies = Policies(index, settings)
    ttl = policies.get(NAMESPACE).ttl_seconds
    clock = SimClock()
    evictor = Evictor(
        index,
        blobs,
        policies,
        AuditLog(index, settings.audit_keep),
        settings,
        BlobUse(),
        clock=clock.time,
    )
    result = Result(ranking, saved_by_week=[0.0] * math.ceil(days / 7))
    published: set[str] = set()
    held = 0

    def evict(always: bool) -> None:
        nonlocal held
        # A pass finds nothing to do while the namespace is within its quota and no
        # entry can have outlived the TTL yet: skipped unless ``always``.
        if not always and held <= quota and (ttl is None or clock.now < ttl):
            result.skipped += 1
            return
        plans = evictor.plan()
        applied = evictor.apply([v for plan in plans for v in plan.victims], "bench-evictor")
        result.passes += 1
        result.evictions += len(applied.removed)
        result.bytes_evicted += applied.bytes
        held -= applied.bytes

    next_pass = PASS_SECONDS
    for job in jobs:
        while next_pass <= job.at:
            clock.now = next_pass
            evict(every_pass)
            next_pass += PASS_SECONDS
        clock.now = now = job.at
        touches = []
        for graph in job.graphs:
            result.lookups += 1
            if index.get_entry(NAMESPACE, graph.key) is not None:
                result.hits += 1
                result.saved += graph.compile_seconds
                result.saved_by_week[int(now // WEEK)] += graph.compile_seconds
                touches.append(Touch(NAMESPACE, graph.key, now, 1))
                continue
            result.spent += graph.compile_seconds
            if graph.key in published:
                result.recompiled += graph.compile_seconds
            entry = Entry(NAMESPACE, graph.key, manifest(graph), now, "bench")
            if index.put_entry(entry, ()) is not PutResult.CREATED:
                raise AssertionError(f"publish of {graph.key} was not created")
            published.add(graph.key)
            held += graph.size
            result.peak_bytes = max(result.peak_bytes, held)
        index.touch_entries(touches)
    while next_pass <= days * DAY:
        clock.now = next_pass
        evict(every_pass)
        next_pass += PASS_SECONDS
    blobs.close()
    result.wall = time.perf_counter() - started
    return result


def unbounded(jobs: Sequence[Job], days: float) -> Result:
    """Every entry kept: a miss only for a key's first lookup."""
    result = Result("no quota", saved_by_week=[0.0] * math.ceil(days / 7))
    seen: set[str] = set()
    for job in jobs:
        for graph in job.graphs:
            result.lookups += 1
            if graph.key in seen:
                result.hits += 1
                result.saved += graph.compile_seconds
                result.saved_by_week[int(job.at // WEEK)] += graph.compile_seconds
            else:
                seen.add(graph.key)
                result.spent += graph.compile_seconds
    return result


# --- the report


def _describe(trace: Trace, quota: int, args: argparse.Namespace, half_life: float) -> None:
    graphs = list(trace.keys.values())
    total = sum(g.size for g in graphs)
    seconds = sorted(g.compile_seconds for g in graphs)
    sizes = sorted(g.size for g in graphs)

    def pct(values: list[float] | list[int], p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    kinds = {k: sum(1 for m in trace.models if m.kind == k) for k, *_ in CLASSES}
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        f"seed {args.seed}, scale {args.scale}: {len(trace.models)} models "
        f"({', '.join(f'{n} {k}' for k, n in kinds.items())}), "
        f"{sum(len(m.slots) for m in trace.models)} graphs, "
        f"{len(trace.jobs)} jobs in {args.days:g} days, "
        f"compiler upgrade on day {args.upgrade_day:g}"
    )
    print(
        f"distinct entries looked up: {len(graphs)}, {total / 1e9:.1f} GB; "
        f"quota {quota / 1e9:.1f} GB ({100 * args.quota_share:.0f} %); "
        f"value half-life {half_life / 3600:g} h"
    )
    print(
        "compile seconds p5/p50/p95/max: "
        + "/".join(f"{pct(seconds, p):.0f}" for p in (0.05, 0.5, 0.95))
        + f"/{seconds[-1]:.0f}; NEFF MB p5/p50/p95/max: "
        + "/".join(f"{pct(sizes, p) / MB:.1f}" for p in (0.05, 0.5, 0.95))
        + f"/{sizes[-1] / MB:.0f}"
    )

    def corr(entries: Sequence[Graph]) -> float:
        logs = [math.log(g.compile_seconds) for g in entries]
        return statistics.correlation(logs, [math.log(g.size) for g in entries])

    within = statistics.median(
        corr([g for g in graphs if g.model == m.name])
        for m in trace.models
        if sum(1 for g in graphs if g.model == m.name) > 2
    )
    print(
        f"correlation of log compile time and log size: {corr(graphs):.2f} over all entries, "
        f"{within:.2f} within a model (median)"
    )


def _table(results: Sequence[Result]) -> None:
    head = (
        f"{'policy':<9} {'lookups':>8} {'hits':>7} {'hit rate':>8} {'compile-h':>10} "
        f"{'compile-h':>10} {'re-compile':>10} {'evictions':>9} {'GB':>8}"
    )
    print(head)
    print(
        f"{'':<9} {'':>8} {'':>7} {'':>8} {'spent':>10} {'saved':>10} {'hours':>10} {'':>9} "
        f"{'evicted':>8}"
    )
    for r in results:
        print(
            f"{r.ranking:<9} {r.lookups:>8} {r.hits:>7} {100 * r.hits / r.lookups:>7.1f}% "
            f"{r.spent / 3600:>10.1f} {r.saved / 3600:>10.1f} {r.recompiled / 3600:>10.1f} "
            f"{r.evictions:>9} {r.bytes_evicted / 1e9:>8.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale", type=float, default=1.0, help="models and jobs per day")
    parser.add_argument("--quota-share", type=float, default=0.3, help="of the bytes published")
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--upgrade-day", type=float, default=15.0)
    parser.add_argument("--serial", action="store_true", help="replay in this process only")
    parser.add_argument(
        "--every-pass", action="store_true", help="plan every 5 minutes, also when nothing can go"
    )
    args = parser.parse_args()

    started = time.perf_counter()
    trace = make_trace(args.seed, args.scale, args.days, args.upgrade_day)
    quota = int(args.quota_share * sum(g.size for g in trace.keys.values()))
    half_life = ServerSettings().value_half_life_seconds
    _describe(trace, quota, args, half_life)
    rankings = ("lru", "value")
    if args.serial:
        results = [replay(r, trace.jobs, quota, args.days, args.every_pass) for r in rankings]
    else:
        with ProcessPoolExecutor(max_workers=2) as pool:
            futures = [
                pool.submit(replay, r, trace.jobs, quota, args.days, args.every_pass)
                for r in rankings
            ]
            results = [f.result() for f in futures]
    lru, value = results
    bound = unbounded(trace.jobs, args.days)
    print()
    _table([*results, bound])
    print(
        f"value / LRU, compile-hours saved: {value.saved / lru.saved:.3f} "
        f"({(value.saved - lru.saved) / 3600:+.1f} h); "
        f"share of the no-quota bound: LRU {100 * lru.saved / bound.saved:.1f} %, "
        f"value {100 * value.saved / bound.saved:.1f} %"
    )
    print(
        f"peak bytes held between passes (GB): LRU {lru.peak_bytes / 1e9:.1f}, "
        f"value {value.peak_bytes / 1e9:.1f}; passes planned: LRU {lru.passes}, value "
        f"{value.passes} of {lru.passes + lru.skipped} (the rest were within the quota)"
    )
    weeks = [f"d{7 * w:g}-{min(args.days, 7 * w + 7):g}" for w in range(len(lru.saved_by_week))]
    print("compile-hours saved by week:")
    print(f"  {'':<9}" + "".join(f"{w:>9}" for w in weeks))
    for r in (*results, bound):
        print(f"  {r.ranking:<9}" + "".join(f"{s / 3600:>9.1f}" for s in r.saved_by_week))
    verdict = (
        "MORE" if value.saved > lru.saved else "FEWER" if value.saved < lru.saved else "AS MANY"
    )
    print(f"the value ranking saves {verdict} compile-hours than LRU on this trace")
    record(
        "eviction",
        "compile-hours saved under the quota, value ranking",
        value.saved / 3600,
        "LRU ranking, same trace and quota",
        lru.saved / 3600,
        "h",
        better="higher",
        note=f"no-quota bound {bound.saved / 3600:.1f} h",
    )
    record(
        "eviction",
        "recompile hours (evicted, then needed again), value ranking",
        value.recompiled / 3600,
        "LRU ranking, same trace and quota",
        lru.recompiled / 3600,
        "h",
        better="lower",
    )
    print(
        f"replay wall time: LRU {lru.wall:.1f} s, value {value.wall:.1f} s; "
        f"total {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
