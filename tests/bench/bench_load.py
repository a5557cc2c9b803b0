"""Load benchmark: 64 concurrent clients with a realistic mix against two
``neffcache serve`` replicas, and the same GET traffic against nginx serving the blobs.

    python tests/bench/bench_load.py [--seconds 60] [--clients 64] [--processes N]

Three configurations, one after the other, each for ``--seconds`` (default 60) after a
warm-up read of every file:

1. ``redis+s3``: two replicas (separate processes, ``tests/scaleout/replicas.py``) over
   one ``redis-server`` index and one S3 bucket on moto's server. moto is a Python S3
   server: every blob byte goes through it (and through boto3 in the replica), so it
   is the bottleneck here, not what a real S3 would be.
2. ``redis+fs``: the same two replicas' setup with the blobs in one shared directory
   (``file://``, as on an NFS or EFS mount) and the same Redis index: the fair
   comparison with nginx, which serves the same files from disk.
3. ``nginx``: one nginx (``bench_server.py``'s config: ``worker_processes 1``,
   sendfile, no access log) serving the same entry documents and blobs as static files
   under the same paths (``/v1/ns/bench/entries/KEY``, ``/v1/blobs/DIGEST``), with
   the GET part of the mix.

The mix, per operation, each client drawing from its own seeded generator (the same
seeds in every configuration; nginx's draws leave out publishes, so its sequence
parts from the replicas' at a client's first publish, with the same distribution):

* 85 % hits: ``GET /v1/ns/bench/entries/KEY`` then ``GET /v1/blobs/DIGEST`` of each of
  its two files (``model.neff`` of 0.5 to 4 MiB, ``model.hlo_module.pb`` a third of
  that, as NxD's entries go), every body checked against the manifest's size and
  BLAKE3 digest. Keys are drawn Zipf-like (s = 1) from ``--entries`` (default 96)
  entries published before the run.
* 10 % misses: ``GET /v1/ns/bench/entries/KEY`` of a key never published: ``404``.
* 5 % publishes: ``POST /v1/blobs/missing``, ``PUT`` of the two new blobs, ``PUT`` of
  the entry (``201`` each), as the client publishes. nginx takes no uploads: in its
  run these draws are hits and misses in the same 85:10 proportion.

Each request goes to the next replica in turn (round-robin, as a load balancer with no
affinity would send it), so the blobs of a publish and its entry usually go to
different replicas. Clients use ``write`` tokens made through the admin API; every
request carries one (nginx ignores it). The clients are ``--processes`` worker
processes (default 4, or one per core if more) of ``clients / processes`` threads
each, each thread one client with a keep-alive connection per server, over
``http.client`` (lighter than httpx: every cycle the client spends is one the servers
on this machine do not get). Threads alone would distort the figures: on the 2-core
development machine nginx's GET rate was about 20 % lower with one client process
than with four (one GIL for all 64 clients, each hashing what it receives), while the
replicas' moved only within the run-to-run noise. The clients' CPU is printed: a
process near 1.0 core is held by its GIL, its latencies including the wait for it.

Reported per configuration: operations and requests per second, MiB/s received,
p50/p99 latency of each kind of operation (a hit's latency covers its three requests),
the CPU of the servers (replicas, Redis, moto; or nginx) and of the clients; then the
ratios to nginx: GET operations per second, MiB/s and hit and miss latencies. Every
unexpected status, digest or size mismatch and exception is an error: they are counted
and shown, and the script exits 1 if there was any. No other assertion: performance
claims live here, not in tests.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import blake3
import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench_server as peers  # nginx, process and CPU helpers
import pinning
from loopback import redis_ready
from results import record
from scaleout.replicas import Replica, create_token, running_replicas

MiB = 2**20
NAMESPACE = "bench"
ADMIN = "bench-load-bootstrap-admin"
MIX = {"hit": 0.85, "miss": 0.10, "publish": 0.05}
NEFF_SIZES = [MiB // 2, MiB, 3 * MiB // 2, 2 * MiB, 4 * MiB]
# Fake credentials for moto, so nothing signs with, or sends, a developer's real ones.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def digest(data: bytes | memoryview) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def key(label: str) -> str:
    return digest(label.encode())


def files_of(n: int) -> dict[str, bytes]:
    """Entry ``n``'s two files: deterministic bytes, the NEFF's size cycling."""
    neff_size = NEFF_SIZES[n % len(NEFF_SIZES)]
    out = {}
    for name, size in (("model.neff", neff_size), ("model.hlo_module.pb", neff_size // 3)):
        seed = blake3.blake3(f"bench-load {n} {name}".encode()).digest(length=MiB)
        out[name] = (seed * (size // MiB + 1))[:size]
    return out


def manifest(entry_key: str, files: dict[str, bytes]) -> dict[str, Any]:
    return {
        "key": entry_key,
        "components": {"compiler_version": "2.20.9961.0+0acef03a", "target": "trn2"},
        "files": {
            name: {"digest": digest(data), "size": len(data)} for name, data in files.items()
        },
        "compile_seconds": 812.4,
    }


# --- the services -----------------------------------------------------------------------


@contextlib.contextmanager
def redis_service(tmp: Path) -> Iterator[peers.Service]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH (apt-get install redis-server)")
    port = peers.free_port()
    workdir = tmp / "redis"
    workdir.mkdir()
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(workdir)]
    log = workdir / "redis.log"
    service = peers.Service("redis", port, peers.spawn(argv, log), log)
    service.url = f"redis://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not redis_ready(port):
            service.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer within 30 s")
            time.sleep(0.05)
        yield service
    finally:
        service.stop()


@contextlib.contextmanager
def moto_service(tmp: Path) -> Iterator[peers.Service]:
    port = peers.free_port()
    log = tmp / "moto.log"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    service = peers.Service("moto", port, peers.spawn(argv, log), log)
    try:
        service.wait_ready("/")
        yield service
    finally:
        service.stop()


def fresh_database(redis: peers.Service, db: int) -> str:
    import redis as redis_py

    url = f"{redis.url}/{db}"
    with redis_py.Redis.from_url(url) as connection:
        connection.flushdb()
    return url


def fresh_bucket(moto: peers.Service) -> str:
    import boto3  # type: ignore[import-untyped]

    bucket = f"neffcache-load-{uuid.uuid4().hex[:12]}"
    client = boto3.session.Session(
        aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=AWS_ENV["AWS_DEFAULT_REGION"],
    ).client("s3", endpoint_url=moto.url)
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()
    return f"s3://{bucket}/prefix"


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / peers.TICKS


def all_pids(replicas: list[Replica]) -> list[int]:
    return [replica.pid for replica in replicas if replica.alive()]


# --- the load ---------------------------------------------------------------------------


@dataclass
class Job:
    """What one worker process runs (sent to it as JSON)."""

    urls: list[str]
    token: str
    threads: int
    first_client: int  # the clients' numbers (their seeds) are first_client + thread
    start_at: float
    stop_at: float
    hits: list[list[Any]]  # [key, {name: [digest, size]}]
    weights: dict[str, float]
    run: str  # unique per configuration, for the publishes' keys


@dataclass
class Tally:
    """What the clients did, merged."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, other: dict[str, Any]) -> None:
        for kind, values in other["latencies"].items():
            self.latencies.setdefault(kind, []).extend(values)
        self.requests += other["requests"]
        self.bytes_in += other["bytes_in"]
        self.bytes_out += other["bytes_out"]
        self.errors += other["errors"]
        self.samples += other["samples"][: max(0, 10 - len(self.samples))]


@functools.cache
def publish_base() -> bytes:
    """The bytes publishes are made of (each with its own first 64 bytes), one copy
    per client process."""
    return blake3.blake3(b"bench-load publish").digest(length=max(NEFF_SIZES))


class Unexpected(Exception):
    """An answer the mix did not expect (status, size or digest)."""


class Client:
    """One simulated client: a keep-alive connection per server, requests round-robin."""

    def __init__(self, job: Job, number: int) -> None:
        self.job = job
        self.rng = random.Random(number)
        self.number = number
        self.turn = number
        self.connections: list[http.client.HTTPConnection] = []
        for url in job.urls:
            parts = urlsplit(url)
            assert parts.hostname is not None
            self.connections.append(
                http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
            )
        self.headers = {"Authorization": f"Bearer {job.token}"} if job.token else {}
        self.got: dict[str, Any] = {
            "latencies": {kind: [] for kind in MIX},
            "requests": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "errors": 0,
            "samples": [],
        }
        self.published = 0
        kinds = list(job.weights)
        self.kinds, self.weights = kinds, [job.weights[k] for k in kinds]
        ranks = range(1, len(job.hits) + 1)
        self.popularity = [1.0 / r for r in ranks]  # Zipf, s = 1

    def request(
        self, method: str, path: str, expect: tuple[int, ...], body: bytes | None = None
    ) -> bytes:
        conn = self.connections[self.turn % len(self.connections)]
        self.turn += 1
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Length"] = str(len(body))
            if method == "POST":
                headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()  # the next request reconnects
            raise
        self.got["requests"] += 1
        self.got["bytes_in"] += len(data)
        self.got["bytes_out"] += len(body or b"")
        if response.status not in expect:
            raise Unexpected(f"{method} {path[:40]}... answered {response.status}: {data[:200]!r}")
        return data

    def hit(self) -> None:
        ((entry_key, files),) = self.rng.choices(self.job.hits, weights=self.popularity)
        found = json.loads(self.request("GET", f"/v1/ns/{NAMESPACE}/entries/{entry_key}", (200,)))
        for name, (blob, size) in files.items():
            listed = found["files"][name]
            if (listed["digest"], listed["size"]) != (blob, size):
                raise Unexpected(f"entry {entry_key[:12]} names {listed} for {name}")
            data = self.request("GET", f"/v1/blobs/{blob}", (200,))
            if len(data) != size or digest(data) != blob:
                raise Unexpected(f"blob {blob[:12]}: {len(data)} bytes, not the right ones")

    def miss(self) -> None:
        unknown = key(f"never published {self.number} {self.rng.random()}")
        self.request("GET", f"/v1/ns/{NAMESPACE}/entries/{unknown}", (404,))

    def publish(self) -> None:
        self.published += 1
        label = f"{self.job.run} {self.number} {self.published}"
        neff_size = self.rng.choice(NEFF_SIZES)
        files = {}
        for name, size in (("model.neff", neff_size), ("model.hlo_module.pb", neff_size // 3)):
            files[name] = f"{label} {name}".encode().ljust(64) + publish_base()[64:size]
        body = manifest(key(label), files)
        digests = [f["digest"] for f in body["files"].values()]
        asked = json.dumps({"digests": digests}).encode()
        missing = json.loads(self.request("POST", "/v1/blobs/missing", (200,), asked))
        if sorted(missing["missing"]) != sorted(digests):
            raise Unexpected(f"fresh blobs not all missing: {missing}")
        for data in files.values():
            self.request("PUT", f"/v1/blobs/{digest(data)}", (201,), data)
        entry = json.dumps(body).encode()
        self.request("PUT", f"/v1/ns/{NAMESPACE}/entries/{body['key']}", (201,), entry)

    def loop(self) -> dict[str, Any]:
        actions = {"hit": self.hit, "miss": self.miss, "publish": self.publish}
        time.sleep(max(0.0, self.job.start_at - time.time()))
        while time.time() < self.job.stop_at:
            (kind,) = self.rng.choices(self.kinds, weights=self.weights)
            begin = time.perf_counter()
            try:
                actions[kind]()
            except (OSError, http.client.HTTPException, Unexpected, ValueError, KeyError) as exc:
                self.got["errors"] += 1
                if len(self.got["samples"]) < 10:
                    self.got["samples"].append(f"{kind}: {type(exc).__name__}: {exc}"[:400])
                continue
            if time.time() <= self.job.stop_at:  # completed within the window
                self.got["latencies"][kind].append(time.perf_counter() - begin)
        for conn in self.connections:
            conn.close()
        return self.got


def worker_main(text: str) -> None:
    """One client process: ``threads`` clients until ``stop_at``; JSON on stdout."""
    job = Job(**json.loads(text))
    results: list[dict[str, Any]] = []
    clients = [Client(job, job.first_client + t) for t in range(job.threads)]
    threads = [
        threading.Thread(target=lambda c=c: results.append(c.loop()), daemon=True) for c in clients
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tally = Tally()
    for got in results:
        tally.add(got)
    out = {
        "latencies": tally.latencies,
        "requests": tally.requests,
        "bytes_in": tally.bytes_in,
        "bytes_out": tally.bytes_out,
        "errors": tally.errors + (job.threads - len(results)),  # a thread that died
        "samples": tally.samples,
    }
    json.dump(out, sys.stdout)


@dataclass
class Result:
    name: str
    seconds: float
    tally: Tally
    server_cpu: float  # cores busy
    client_cpu: float
    machine_cpu: float  # the whole machine's busy cores, other tenants included
    processes: int
    notes: list[str] = field(default_factory=list)

    def count(self, *kinds: str) -> int:
        return sum(len(self.tally.latencies.get(k, [])) for k in kinds)

    def rate(self, *kinds: str) -> float:
        return self.count(*kinds) / self.seconds

    def pct(self, kind: str, q: float) -> float | None:
        values = sorted(self.tally.latencies.get(kind, []))
        if not values:
            return None
        return values[min(len(values) - 1, int(len(values) * q))] * 1e3

    @property
    def mib_s(self) -> float:
        return self.tally.bytes_in / MiB / self.seconds


def drive(
    name: str,
    urls: list[str],
    tokens: list[str],
    hits: list[list[Any]],
    weights: dict[str, float],
    args: argparse.Namespace,
    server_pids: list[int],
) -> Result:
    processes = args.processes
    start_at = time.time() + 3.0  # every worker has started its threads by then
    stop_at = start_at + args.seconds
    workers = []
    first = 0
    try:
        for i in range(processes):
            threads = args.clients // processes + (i < args.clients % processes)
            job = Job(
                urls=urls,
                token=tokens[i % len(tokens)],
                threads=threads,
                first_client=first,
                start_at=start_at,
                stop_at=stop_at,
                hits=hits,
                weights=weights,
                run=f"{name} {uuid.uuid4().hex[:8]}",
            )
            first += threads
            workers.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", json.dumps(job.__dict__)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        time.sleep(max(0.0, start_at - time.time()))
        client_pids = [w.pid for w in workers]
        server0, client0, machine0 = (
            peers.cpu_seconds(server_pids),
            peers.cpu_seconds(client_pids),
            machine_cpu(),
        )
        time.sleep(max(0.0, stop_at - time.time()))
        server_cpu = (peers.cpu_seconds(server_pids) - server0) / args.seconds
        client_cpu = (peers.cpu_seconds(client_pids) - client0) / args.seconds
        busy = (machine_cpu() - machine0) / args.seconds
        tally = Tally()
        for worker in workers:
            out, _ = worker.communicate(timeout=args.seconds + 300)
            if worker.returncode != 0 or not out:
                tally.errors += 1
                tally.samples.append(f"a client process exited with {worker.returncode}")
                continue
            tally.add(json.loads(out))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return Result(name, args.seconds, tally, server_cpu, client_cpu, busy, processes)


# --- a configuration --------------------------------------------------------------------


def seed_entries(replicas: list[Replica], token: str, count: int) -> list[list[Any]]:
    """Publish ``count`` entries (round-robin over the replicas) and return the hit list."""
    hits = []
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(r.client(token, timeout=300)) for r in replicas]
        for n in range(count):
            files = files_of(n)
            body = manifest(key(f"bench-load entry {n}"), files)
            for i, data in enumerate(files.values()):
                stored = clients[(n + i) % len(clients)].put(
                    f"/v1/blobs/{digest(data)}", content=data
                )
                if stored.status_code not in (200, 201):
                    raise RuntimeError(f"seeding a blob answered {stored.status_code}")
            put = clients[(n + 1) % len(clients)].put(
                f"/v1/ns/{NAMESPACE}/entries/{body['key']}", json=body
            )
            if put.status_code not in (200, 201):
                raise RuntimeError(f"seeding an entry answered {put.status_code}: {put.text}")
            files_view = {name: [f["digest"], f["size"]] for name, f in body["files"].items()}
            hits.append([body["key"], files_view])
    return hits


def warm(urls: list[str], token: str, hits: list[list[Any]]) -> None:
    """Read every entry and blob once through every server (caches and page cache)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for url in urls:
        with httpx.Client(base_url=url, headers=headers, timeout=300, trust_env=False) as http:
            for entry_key, files in hits:
                got = http.get(f"/v1/ns/{NAMESPACE}/entries/{entry_key}")
                if got.status_code != 200:
                    raise RuntimeError(f"warm-up: entry {entry_key} answered {got.status_code}")
                for blob, _ in files.values():
                    if http.get(f"/v1/blobs/{blob}").status_code != 200:
                        raise RuntimeError(f"warm-up: blob {blob} not served by {url}")


def replicas_run(
    name: str,
    tmp: Path,
    index_url: str,
    blob_url: str,
    env: dict[str, str],
    extra_pids: list[int],
    args: argparse.Namespace,
) -> tuple[Result, list[list[Any]], dict[str, bytes]]:
    """Two replicas over the given stores, seeded, warmed and driven; also the hit list
    and each entry's document as served (for nginx's files)."""
    print(f"{name}: starting 2 replicas (index {index_url}, blobs {blob_url})", flush=True)
    settings = {"NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN": ADMIN}
    with contextlib.ExitStack() as stack:
        with pinning.on(args.server_core):
            replicas = stack.enter_context(
                running_replicas(
                    tmp / f"replicas-{name}",
                    index_url=index_url,
                    blob_url=blob_url,
                    settings=settings,
                    env=env,
                )
            )
        tokens = [
            create_token(replicas[0], ADMIN, "write", [NAMESPACE], f"load client {i}")[1]
            for i in range(args.processes)
        ]
        started = time.monotonic()
        hits = seed_entries(replicas, tokens[0], args.entries)
        urls = [r.url for r in replicas]
        warm(urls, tokens[0], hits)
        documents = {}
        with replicas[0].client(tokens[0]) as http:
            for entry_key, _ in hits:
                documents[entry_key] = http.get(f"/v1/ns/{NAMESPACE}/entries/{entry_key}").content
        print(f"    seeded and warmed in {time.monotonic() - started:.1f} s", flush=True)
        pids = all_pids(replicas) + extra_pids
        result = drive(name, urls, tokens, hits, MIX, args, pids)
        for replica in replicas:
            if not replica.alive():
                result.tally.errors += 1
                result.tally.samples.append(f"{replica!r} died: {replica.tail(500)}")
        logged = "".join(r.tail(10**8) for r in replicas).splitlines()
        troubles = [line for line in logged if line.startswith(("WARNING", "ERROR", "Traceback"))]
        if troubles:
            result.notes.append(
                f"{len(troubles)} warning or error lines in the replicas' logs, the first: "
                f"{troubles[0][:300]}"
            )
    report(result)
    return result, hits, documents


def nginx_run(
    tmp: Path, hits: list[list[Any]], documents: dict[str, bytes], args: argparse.Namespace
) -> Result:
    """nginx serving the same documents and blobs as files, with the GET part of the mix."""
    www = tmp / "www"
    entries = www / "v1" / "ns" / NAMESPACE / "entries"
    blobs = www / "v1" / "blobs"
    entries.mkdir(parents=True)
    blobs.mkdir(parents=True)
    for n, (entry_key, _) in enumerate(hits):
        (entries / entry_key).write_bytes(documents[entry_key])
        for data in files_of(n).values():
            (blobs / digest(data)).write_bytes(data)
    for path in (www, *www.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)  # nginx's workers may run as nobody
    probe = f"/v1/ns/{NAMESPACE}/entries/{hits[0][0]}"
    print("nginx: serving the same files", flush=True)
    with contextlib.ExitStack() as stack:
        with pinning.on(args.server_core):
            nginx = stack.enter_context(peers.nginx_server(tmp, www, probe))
        warm([nginx.url], "", hits)
        weights = {"hit": MIX["hit"], "miss": MIX["miss"]}
        result = drive("nginx", [nginx.url], [""], hits, weights, args, nginx.pids())
    report(result)
    return result


# --- report -----------------------------------------------------------------------------


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(result: Result) -> None:
    t = result.tally
    ops = result.rate("hit", "miss", "publish")
    print(
        f"    {ops:8.1f} ops/s  {t.requests / result.seconds:8.1f} req/s  "
        f"{result.mib_s:7.1f} MiB/s in  {t.bytes_out / MiB / result.seconds:5.1f} MiB/s out  "
        f"errors {t.errors}",
        flush=True,
    )
    for kind in MIX:
        if result.count(kind):
            print(
                f"    {kind:<8}{result.count(kind):7d} ops {result.rate(kind):8.1f}/s  "
                f"p50 {ms(result.pct(kind, 0.5)):>8} ms  p99 {ms(result.pct(kind, 0.99)):>8} ms",
                flush=True,
            )
    limit = peers.limited(result.server_cpu, result.client_cpu, result.processes)
    other = max(0.0, result.machine_cpu - result.server_cpu - result.client_cpu)
    cores = os.cpu_count() or 1
    print(
        f"    CPU (cores): servers {result.server_cpu:.2f}, clients {result.client_cpu:.2f} "
        f"({result.processes} process(es)), the rest {other:.2f} (the kernel's loopback "
        f"traffic, other processes); machine {result.machine_cpu:.2f} of {cores}"
        f"{f' [{limit}]' if limit else ''}",
        flush=True,
    )
    if result.machine_cpu >= 0.9 * cores:
        result.notes.append(
            "the machine was saturated: the servers' figures are a floor, not their capacity"
        )
    for note in result.notes:
        print(f"    note: {note}", flush=True)
    for sample in t.samples:
        print(f"    ERROR {sample}", flush=True)


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def summary(results: list[Result]) -> None:
    nginx = next(r for r in results if r.name == "nginx")
    print(
        "\nSUMMARY: two replicas / nginx (same clients, same GET draws; latency ratios > 1 "
        "are slower, rate ratios < 1 are less)"
    )
    head = (
        f"{'configuration':<18}{'GET ops/s':>10}{'MiB/s':>8}{'hit p50':>9}{'hit p99':>9}"
        f"{'miss p50':>9}{'miss p99':>9}{'pub p50':>9}{'pub p99':>9}{'errors':>8}"
    )
    print(head + "   (latencies in ms)")
    print("-" * len(head))
    for r in results:
        print(
            f"{r.name:<18}{r.rate('hit', 'miss'):10.1f}{r.mib_s:8.1f}"
            f"{ms(r.pct('hit', 0.5)):>9}{ms(r.pct('hit', 0.99)):>9}"
            f"{ms(r.pct('miss', 0.5)):>9}{ms(r.pct('miss', 0.99)):>9}"
            f"{ms(r.pct('publish', 0.5)):>9}{ms(r.pct('publish', 0.99)):>9}{r.tally.errors:8d}"
        )
    for r in results:
        if r is nginx:
            continue
        print(
            f"{r.name + ' / nginx':<18}"
            f"{ratio(r.rate('hit', 'miss'), nginx.rate('hit', 'miss')):>10}"
            f"{ratio(r.mib_s, nginx.mib_s):>8}"
            f"{ratio(r.pct('hit', 0.5), nginx.pct('hit', 0.5)):>9}"
            f"{ratio(r.pct('hit', 0.99), nginx.pct('hit', 0.99)):>9}"
            f"{ratio(r.pct('miss', 0.5), nginx.pct('miss', 0.5)):>9}"
            f"{ratio(r.pct('miss', 0.99), nginx.pct('miss', 0.99)):>9}"
        )
    for r in results:
        if r is nginx:
            continue
        record(
            "load",
            f"GET ops/s (hits and misses), two replicas over {r.name}",
            r.rate("hit", "miss"),
            "nginx, same clients and draws",
            nginx.rate("hit", "miss"),
            "ops/s",
            better="higher",
            note="; ".join(r.notes),
        )
        hit, peer_hit = r.pct("hit", 0.5), nginx.pct("hit", 0.5)
        if hit is not None and peer_hit:
            record(
                "load",
                f"hit p50 latency, two replicas over {r.name}",
                hit,
                "nginx, same clients and draws",
                peer_hit,
                "ms",
                better="lower",
            )
    print(
        "(a replica run's GET ops/s leave out its publishes, which nginx cannot take: its "
        "clients spent part of the time on them)"
    )


def machine() -> str:
    return (
        f"machine: {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
        f"{peers.mem_total_kib() / 2**20:.1f} GiB RAM; python {sys.version.split()[0]}"
    )


def run(args: argparse.Namespace) -> int:
    print(machine())
    cores = pinning.choose(args.pin)
    print(cores.describe() if cores else "not pinned: servers and clients share every core")
    args.server_core = cores.server if cores else None
    # The client processes start from here: on the client core. Every server (the
    # replicas with Redis and moto beside them, or nginx) starts on the server core.
    pinning.stay_on(cores.client if cores else None)
    print(
        f"{args.clients} clients in {args.processes} process(es), {args.seconds} s per "
        f"configuration, {args.entries} entries, mix {MIX}",
        flush=True,
    )
    started = time.monotonic()
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(name, None)
    results = []
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="neffcache-load-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        tmp.chmod(0o755)
        with pinning.on(args.server_core):
            redis = stack.enter_context(redis_service(tmp))
        configs = []
        if "redis+s3" in args.only:
            with pinning.on(args.server_core):
                moto = stack.enter_context(moto_service(tmp))
            env = {**AWS_ENV, "AWS_ENDPOINT_URL_S3": moto.url}
            configs.append(
                ("redis+s3", fresh_database(redis, 1), fresh_bucket(moto), env, [redis, moto])
            )
        if "redis+fs" in args.only:
            shared = tmp / "shared-blobs"
            configs.append(("redis+fs", fresh_database(redis, 2), shared.as_uri(), {}, [redis]))
        hits: list[list[Any]] = []
        documents: dict[str, bytes] = {}
        for name, index_url, blob_url, env, services in configs:
            pids = [pid for service in services for pid in service.pids()]
            result, hits, documents = replicas_run(name, tmp, index_url, blob_url, env, pids, args)
            results.append(result)
        if hits:
            results.append(nginx_run(tmp, hits, documents, args))
            summary(results)
    errors = sum(r.tally.errors for r in results)
    print(f"\ntotal {time.monotonic() - started:.0f} s; errors: {errors}; servers stopped")
    return 1 if errors else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="per configuration")
    parser.add_argument("--quick", action="store_true", help="10 s per configuration")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument(
        "--processes",
        type=int,
        default=max(4, os.cpu_count() or 1),
        help="client processes (default: 4, or one per core if more)",
    )
    parser.add_argument("--entries", type=int, default=96, help="entries the hits draw from")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=("redis+s3", "redis+fs"),
        default=["redis+s3", "redis+fs"],
        help="replica configurations to run (nginx always runs)",
    )
    parser.add_argument(
        "--pin",
        choices=("auto", "on", "off"),
        default="auto",
        help="every server on one core, the clients on another (auto: when two are usable)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one client process
    args = parser.parse_args()
    if args.worker:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the parent reports it
            worker_main(args.worker)
        return
    if args.quick:
        args.seconds = 10
    if not Path(peers.NGINX).exists():
        parser.error(f"{peers.NGINX} is not installed")
    if args.clients < 1 or args.processes < 1 or args.seconds < 1 or args.entries < 1:
        parser.error("--clients, --processes, --seconds and --entries must be at least 1")
    args.processes = min(args.processes, args.clients)
    peers.until_interrupted(lambda: run(args))


if __name__ == "__main__":
    main()
