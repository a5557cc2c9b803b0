"""Reports under load: the latency of ``/healthz`` and of an entry lookup while three
clients ask for cost reports, against the same requests with no report running,
measured on the same server in the same run.

    python tests/bench/bench_reports_load.py [--quick] [--events 2500]

``neffcache serve`` runs on its embedded defaults (file blobs, SQLite index), started
with ``bench_server.py``'s helpers on a random loopback port, from a temporary
directory removed at the end. It is seeded through the API as clients seed it: one
published entry (``PUT`` of a blob and of its manifest) and ``--events`` graph events
(``POST /v1/events``), every one of them large: components with a graph summary of
500 instruction shapes, about 14 KiB as stored, just under the 16 KiB the server
stores of one event (``EVENT_MAX_BYTES``; past it the shapes would be left out). That
is the worst case a report reads: it parses each event's whole body. The stored size
is read back from the index file and printed.

Then two phases, each a fixed time:

1. ``idle``: one probe thread alternates ``GET /healthz`` and ``GET
   /v1/ns/bench/entries/KEY`` (a hit on the published entry), a pause of 10 ms between
   probes, and times each one.
2. ``under reports``: the same probes while three client threads each ask for
   ``GET /v1/reports/cost?since=7d&by=namespace,model`` in a loop, one report after
   another, without pause.

It prints p50 and p99 of each probe in both phases and the ratio loaded / idle. The
goal is on the entry lookup's p99, what a cache hit waits for: at most 3x idle. Why
3x: a report runs in a worker thread, but it holds Python's GIL while it parses
events, and the event loop must take the GIL back each time it wakes (a request
arrives, an SQLite read returns), two or three times per lookup. The report's folding
pauses after every 2 ms of work (``reports/pace.py``), so each of those waits is about
2 ms at most instead of the 5 ms switch interval: a few such waits on top of a lookup
of a few ms make about twice idle at p99, and 3x leaves room for the noise of a
shared machine. Reports computed on the event loop itself (the server before reports
moved to a worker thread) held every request for a whole page of events: about 100x
idle at p99 here.

``--quick`` seeds 500 events and runs each phase a few seconds, to check that the
script works; its figures are not the goal's figures. No assertion: performance
claims live here, not in tests.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_server as peers  # the server process, blobs and manifests
from results import record

NAMESPACE = peers.NAMESPACE
REPORT = "/v1/reports/cost?since=7d&by=namespace,model&format=json"
REPORT_CLIENTS = 3
PROBE_PAUSE = 0.010  # seconds between two probes
# Shapes per event, about 26 bytes each as JSON: the stored event takes about 14 KiB,
# under the 16 KiB the server stores of one (telemetry/schema.py, EVENT_MAX_BYTES), so
# nothing is trimmed and every report parses all of it.
SHAPES = 500
# Events per POST: about 3 MiB of JSON, under BODY_MAX_BYTES (4 MiB).
BATCH = 200
GOAL = 3.0  # entry lookup p99 under reports / idle, at most


@dataclass(frozen=True)
class Plan:
    events: int
    idle_seconds: float
    loaded_seconds: float


FULL = Plan(2500, 10.0, 20.0)
QUICK = Plan(500, 3.0, 5.0)


# --- seeding ----------------------------------------------------------------------------


def shapes(rng: random.Random) -> list[str]:
    return [
        f"f32[{rng.randrange(1, 8192)},{rng.randrange(1, 8192)},{rng.randrange(1, 64)}]{{2,1,0}}"
        for _ in range(SHAPES)
    ]


def graph_event(i: int, rng: random.Random) -> dict[str, Any]:
    """A graph event as a client sends it, with components near the server's cap."""
    hit = rng.random() < 0.6
    event: dict[str, Any] = {
        "kind": "graph",
        "namespace": f"team-{rng.randrange(8)}",
        "at": time.time(),
        "key": peers.hexdigest(f"graph {rng.randrange(5000)}".encode()),
        "result": "hit" if hit else "miss",
        "source": rng.choice(("l1", "server")) if hit else "compiler",
        "job_id": f"job-{i // 50}",
        "host": f"host-{rng.randrange(64)}",
        "model": f"model-{rng.randrange(12)}",
        "via": "hook",
        "pid": rng.randrange(1 << 16),
        "instance_type": rng.choice(("trn1.32xlarge", "trn2.48xlarge", "inf2.48xlarge")),
        "compiler_version": "2.20.9961.0+0acef03a",
        "components": {
            "fingerprint": peers.hexdigest(f"fingerprint {i}".encode()),
            "compiler_version": "2.20.9961.0+0acef03a",
            "target": "trn2",
            "flags": ["--model-type=transformer", "--optlevel=2"],
            "env": {},
            "graph": {
                "structure": peers.hexdigest(f"structure {i}".encode()),
                "instructions": SHAPES,
                "shapes": shapes(rng),
            },
        },
    }
    if hit:
        event["saved_seconds"] = rng.lognormvariate(4.5, 1.0)
        event["fetch_seconds"] = rng.random()
    else:
        event["reason"] = rng.choice(("new-graph", "compiler-changed", "flags-changed"))
        event["compile_seconds"] = rng.lognormvariate(4.5, 1.0)
        event["outcome"] = "ok" if rng.random() < 0.95 else "failed"
    return event


def seed(url: str, count: int) -> tuple[str, int]:
    """One published entry and ``count`` large graph events; the entry's path and the
    bytes of events sent."""
    rng = random.Random(1)
    sent = 0
    with httpx.Client(base_url=url, timeout=120) as client:
        blob = b"neffcache reports-load bench neff" * 128
        digest = peers.hexdigest(blob)
        peers.put_blob(client, url, digest, [blob], len(blob))
        key = peers.hexdigest(b"reports-load bench entry")
        path = f"/v1/ns/{NAMESPACE}/entries/{key}"
        answer = client.put(path, json=peers.manifest(key, digest, len(blob)))
        if answer.status_code != 201:
            raise RuntimeError(f"PUT entry answered {answer.status_code}: {answer.text}")
        for start in range(0, count, BATCH):
            batch = [graph_event(i, rng) for i in range(start, min(count, start + BATCH))]
            request = client.build_request("POST", "/v1/events", json={"events": batch})
            sent += len(request.content)
            answer = client.send(request)
            if answer.status_code != 202:
                raise RuntimeError(f"POST events answered {answer.status_code}: {answer.text}")
    return path, sent


def stored(tmp: Path) -> str:
    """The events in the index file and their mean size as stored (read-only)."""
    uri = f"file:{tmp / 'neffcache-data' / 'index.db'}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            count, mean = db.execute(
                "SELECT count(*), avg(length(body)) FROM sequence_items WHERE log = 'events'"
            ).fetchone()
    except sqlite3.Error as exc:
        return f"stored size unknown ({exc})"
    return f"{count} stored, {(mean or 0) / 1024:.1f} KiB each"


# --- measuring --------------------------------------------------------------------------


@dataclass
class Probes:
    """Latencies in seconds of each probed path, in the order they were taken."""

    times: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0

    def add(self, name: str, seconds: float) -> None:
        self.times.setdefault(name, []).append(seconds)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def probe(url: str, paths: dict[str, str], seconds: float) -> Probes:
    """Each path in turn, one request at a time on one keep-alive connection."""
    found = Probes()
    stop_at = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < stop_at:
            for name, path in paths.items():
                begin = time.perf_counter()
                try:
                    answer = client.get(path)
                except httpx.HTTPError:
                    found.errors += 1
                    continue
                if answer.status_code != 200:
                    found.errors += 1
                    continue
                found.add(name, time.perf_counter() - begin)
                time.sleep(PROBE_PAUSE)
    return found


@dataclass
class Reports:
    seconds: list[float] = field(default_factory=list)  # of each report answered 200
    refused: int = 0  # 503: too many waiting
    failed: int = 0  # anything else


def ask_reports(url: str, stop: threading.Event, into: Reports, lock: threading.Lock) -> None:
    with httpx.Client(base_url=url, timeout=600) as client:
        while not stop.is_set():
            begin = time.perf_counter()
            try:
                answer = client.get(REPORT)
            except httpx.HTTPError:
                status = 0
            else:
                status = answer.status_code
            took = time.perf_counter() - begin
            with lock:
                if status == 200:
                    into.seconds.append(took)
                elif status == 503:
                    into.refused += 1
                else:
                    into.failed += 1
            if status == 503:
                time.sleep(float(answer.headers.get("retry-after", "1")))


@dataclass
class Phase:
    probes: Probes
    server_cpu: float  # cores busy
    seconds: float
    reports: Reports | None = None


def idle(service: peers.Service, paths: dict[str, str], seconds: float) -> Phase:
    cpu0, wall0 = service.cpu(), time.monotonic()
    found = probe(service.url, paths, seconds)
    wall = time.monotonic() - wall0
    return Phase(found, (service.cpu() - cpu0) / wall, wall)


def under_reports(service: peers.Service, paths: dict[str, str], seconds: float) -> Phase:
    stop, lock, reports = threading.Event(), threading.Lock(), Reports()
    askers = [
        threading.Thread(target=ask_reports, args=(service.url, stop, reports, lock), daemon=True)
        for _ in range(REPORT_CLIENTS)
    ]
    for thread in askers:
        thread.start()
    time.sleep(0.5)  # every asker's first report under way
    cpu0, wall0 = service.cpu(), time.monotonic()
    try:
        found = probe(service.url, paths, seconds)
    finally:
        stop.set()
    wall = time.monotonic() - wall0
    server_cpu = (service.cpu() - cpu0) / wall
    for thread in askers:  # the reports under way finish; none is started after stop
        thread.join(timeout=600)
    service.check_alive()
    return Phase(found, server_cpu, wall, reports)


# --- output -----------------------------------------------------------------------------


def describe(name: str, phase: Phase) -> list[str]:
    lines = [f"{name}: {phase.seconds:.1f} s, server {phase.server_cpu:.2f} cores"]
    for path, times in phase.probes.times.items():
        lines.append(
            f"    {path:<13} p50 {percentile(times, 0.5) * 1e3:8.1f} ms   "
            f"p99 {percentile(times, 0.99) * 1e3:8.1f} ms   max {max(times) * 1e3:8.1f} ms"
            f"   ({len(times)} probes)"
        )
    if phase.probes.errors:
        lines.append(f"    PROBE ERRORS {phase.probes.errors}")
    reports = phase.reports
    if reports is not None:
        done = reports.seconds
        took = (
            f"p50 {percentile(done, 0.5):.2f} s, max {max(done):.2f} s (queueing included)"
            if done
            else "none answered"
        )
        lines.append(
            f"    reports answered {len(done)} ({len(done) / phase.seconds:.2f}/s), {took}; "
            f"refused (503) {reports.refused}, failed {reports.failed}"
        )
    return lines


def compare(name: str, idle_phase: Phase, loaded: Phase, goal: float | None) -> list[str]:
    before, after = idle_phase.probes.times.get(name), loaded.probes.times.get(name)
    if not before or not after:
        return [f"{name}: no probe answered in a phase, no ratio"]
    lines = []
    for label, share in (("p50", 0.5), ("p99", 0.99)):
        was, now = percentile(before, share) * 1e3, percentile(after, share) * 1e3
        ratio = now / was
        headline = goal if label == "p99" else None  # the goal is on p99 only
        met = "no goal"
        if headline is not None:
            met = f"goal <= {headline:g}x: {'met' if ratio <= headline else 'NOT met'}"
        lines.append(
            f"{'RATIO' if headline else 'ratio'} {name} {label} under reports / idle = "
            f"{ratio:.2f}x ({now:.1f} ms / {was:.1f} ms) ({met})"
        )
        record(
            "reports_load",
            f"{name} {label} while {REPORT_CLIENTS} clients request cost reports",
            now,
            "the same request, no report running",
            was,
            "ms",
            better="lower",
            goal="" if headline is None else f"<= {headline:g}x",
        )
    return lines


def run(plan: Plan, quick: bool) -> None:
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores "
        f"({len(os.sched_getaffinity(0))} usable), Python {platform.python_version()}; "
        "the server, the probes and the report clients share it"
    )
    if quick:
        print("--quick: fewer events, shorter phases; not the goal's figures")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="neffcache-bench-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        service = stack.enter_context(peers.neffcache_server(tmp))
        begin = time.monotonic()
        entry, sent = seed(service.url, plan.events)
        print(
            f"seeded {plan.events} graph events ({sent / plan.events / 1024:.1f} KiB of JSON "
            f"each as sent; {stored(tmp)}) and one entry in {time.monotonic() - begin:.1f} s; "
            "neffcache serve on embedded defaults (SQLite index), one process",
            flush=True,
        )
        paths = {"/healthz": "/healthz", "entry lookup": entry}
        with httpx.Client(base_url=service.url, timeout=600) as client:
            for path in paths.values():
                client.get(path).raise_for_status()
            begin = time.monotonic()
            client.get(REPORT).raise_for_status()
            alone = time.monotonic() - begin
        print(f"one cost report alone (nothing else running): {alone:.2f} s\n", flush=True)
        quiet = idle(service, paths, plan.idle_seconds)
        print("\n".join(describe("idle", quiet)), flush=True)
        loaded = under_reports(service, paths, plan.loaded_seconds)
        print("\n".join(describe(f"under reports ({REPORT_CLIENTS} clients)", loaded)), flush=True)
        print()
        print("\n".join(compare("entry lookup", quiet, loaded, GOAL)))
        print("\n".join(compare("/healthz", quiet, loaded, None)))
    print(f"\ntotal {time.monotonic() - started:.0f} s; server stopped, temp dir removed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="500 events, short phases")
    parser.add_argument("--events", type=int, help="graph events seeded (default 2500)")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.events:
        plan = Plan(args.events, plan.idle_seconds, plan.loaded_seconds)
    peers.until_interrupted(lambda: run(plan, args.quick))


if __name__ == "__main__":
    main()
