"""Server benchmark, per core: ``neffcache serve`` against nginx serving the same bytes.

    apt-get install wrk   # the load generator (without it: Python worker processes)
    python tests/bench/bench_server.py [--quick] [--client auto|wrk|python] [--pin auto|on|off]

Both servers run on 127.0.0.1 on random free ports, from one temporary directory that
is removed at the end, also on Ctrl-C or an error; both processes are stopped then (and
killed by the kernel if this script dies first). ``neffcache serve`` runs on its
embedded defaults (file blobs and a SQLite index under the data dir) as it ships: one
uvicorn process (uvloop, httptools), access log off (its default), plus
``accel_redirect_prefix``, which changes only the answer to requests the nginx front
marks. nginx runs from a generated minimal config with ``worker_processes 1``: the
neffcache server is one process with one event loop, so one nginx worker is the
like-for-like peer. Also ``sendfile on``, ``access_log off``, and
``keepalive_requests`` raised so that, like uvicorn, nginx never closes a busy
keep-alive connection. Every test blob is uploaded with ``PUT /v1/blobs/{digest}`` and
the same bytes are written as files to nginx's root; each is read once from both
before timing, so both serve from the page cache.

**Per core** (``--pin``, on by default with two usable cores): every server runs on one
core and the client on another, the same cores for both servers, so each ratio
compares what one core of each does and holds from one machine to the next (on a
shared 2-core machine the same code once measured 0.80x and 0.37x nginx in two quiet
runs). wrk then runs one thread. Each GET figure is measured against both servers
with the same client code, nginx first, in 5 alternating rounds; the median round's
pair is the figure, and the lowest and highest ratios are its spread: ``wrk``
(Debian's package) when installed, else worker processes of this script running
httpx clients in threads (on one core, that client is the bottleneck: use wrk).
Throughput counts every byte received during a fixed duration (wrk counts header
bytes too, the Python client only bodies), so a large response still in flight at the
deadline counts for what arrived. Server and client CPU (in cores busy) are printed
beside each run, and a run where the client's core was full, or (pinned) the server's
was not, is flagged: then the ratio is a bound, not the server's capacity.

1. GET throughput of a 1 MiB blob with 1 and with 16 connections. Goal with 16:
   >= 0.7x nginx.
2. GET throughput of a 256 MiB blob with 1 and with 16 connections. Goal: >= 0.9x nginx.
3. Entry lookup: requests/s of ``GET /v1/ns/bench/entries/{key}`` (one published
   manifest, a small JSON) against nginx's requests/s for a 4 KiB file, 16 connections.
   Goal: >= 0.2x.
4. Through the nginx front (``deploy/nginx/nginx.conf``, one worker, its ports and
   paths filled in) with the neffcache server behind it, both on the server core:
   GET of the 1 MiB and the 256 MiB blob, 16 connections, against nginx serving the
   files directly on that core. The server answers a verified blob with
   ``X-Accel-Redirect`` and nginx sends the file. Goal: >= 0.95x.
5. PUT throughput of 256 MiB (distinct blobs, so each is stored: 201; the server fsyncs
   a blob before it answers). nginx serves static files and cannot accept PUT without a
   module, so the peer is nginx's GET of the same size, both timed with the same plain
   socket client (one connection, 1 MiB sends and receives; httpx would be the
   bottleneck); the output says so. No goal.
6. Peak RSS of the server process during 8 concurrent 1 GiB uploads, each body a stream
   of 1 MiB chunks of a fixed pattern (never the whole body in memory) whose digest is
   hashed beforehand from the same stream. VmHWM is reset (``clear_refs``) before and
   read after, and VmRSS is sampled every 20 ms; the larger is reported. Goal: < 150 MiB.
   A probe times ``GET /healthz`` every 100 ms meanwhile: how responsive the server
   stays while it receives.

Ratios are neffcache / nginx. ``--quick`` shrinks sizes and durations to check that the
script works; its figures are not the goals' figures. No assertion (performance claims
live here, not in tests).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import grp
import importlib.metadata
import json
import os
import platform
import pwd
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import blake3
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pinning
from pinning import Cores
from results import record

MiB = 2**20
NGINX = "/usr/sbin/nginx"
NAMESPACE = "bench"
TICKS = os.sysconf("SC_CLK_TCK")
RSS_GOAL_MIB = 150
NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]


@dataclass(frozen=True)
class Plan:
    small_seconds: int  # each 1 MiB GET run, per server
    big: int  # bytes of the large blob
    big_seconds: int  # each large GET run, per server
    lookup_seconds: int  # each entry lookup / 4 KiB run, per server
    put_repeats: int  # large PUTs (and peer GETs) per server
    rounds: int  # alternating nginx/neffcache pairs per GET figure; the median counts
    uploads: int  # concurrent uploads while RSS is watched
    upload_bytes: int  # size of each


FULL = Plan(5, 256 * MiB, 8, 5, 3, 5, 8, 1024 * MiB)
QUICK = Plan(2, 32 * MiB, 2, 2, 2, 1, 8, 64 * MiB)


# --- processes --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: the kernel kills the server if this script dies without cleanup.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def cpu_seconds(pids: Iterable[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def status_kib(pid: int, key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(match[1]) if match else 0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Service:
    """A server process we started: its URL, CPU time (with its children) and stop()."""

    def __init__(self, name: str, port: int, process: subprocess.Popen[bytes], log: Path):
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.process = process
        self.log = log
        self.also: list[Service] = []  # processes serving with it (the front's upstream)

    @property
    def pid(self) -> int:
        return self.process.pid

    def pids(self) -> list[int]:
        return [self.pid, *children(self.pid)]

    def cpu(self) -> float:
        return cpu_seconds(self.pids()) + sum(other.cpu() for other in self.also)

    def wait_ready(self, path: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + path, timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer within 30 s")

    def reset_peak(self) -> bool:
        """Reset the process's VmHWM to its current RSS (Linux >= 4.0; our own child)."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def peak_mib(self) -> float:
        return status_kib(self.pid, "VmHWM") / 1024

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} died: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        workers = children(self.pid)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        for pid in workers:  # nginx workers, if the master had to be killed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            # Off by default; were it on, uvicorn would log requests to stdout.
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,  # Ctrl-C reaches us; we stop the servers in order
            preexec_fn=_die_with_parent,
        )


ACCEL_PREFIX = "/_neffcache"


@contextlib.contextmanager
def neffcache_server(tmp: Path) -> Iterator[Service]:
    """The server on its embedded defaults, plus ``accel_redirect_prefix``: that changes
    only the answer to a request the nginx front marks (``X-Neffcache-Accel``), so the
    direct figures are the server as it ships and the front's figures use the same one."""
    port = free_port()
    data = tmp / "neffcache-data"
    log = tmp / "neffcache.log"
    argv = [*NEFFCACHE, "serve", "--port", str(port), "--data-dir", str(data)]
    env = {**os.environ, "NEFFCACHE_ACCEL_REDIRECT_PREFIX": ACCEL_PREFIX}
    service = Service("neffcache", port, spawn(argv, log, env), log)
    try:
        service.wait_ready("/healthz")
        yield service
    finally:
        service.stop()


NGINX_CONF = """\
daemon off;
{user}worker_processes 1;
error_log {tmp}/nginx-error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    keepalive_requests 100000000;
    default_type application/octet-stream;
    client_body_temp_path {tmp}/nginx-tmp/body;
    proxy_temp_path {tmp}/nginx-tmp/proxy;
    fastcgi_temp_path {tmp}/nginx-tmp/fastcgi;
    uwsgi_temp_path {tmp}/nginx-tmp/uwsgi;
    scgi_temp_path {tmp}/nginx-tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
}}
"""


@contextlib.contextmanager
def nginx_server(tmp: Path, root: Path, probe: str) -> Iterator[Service]:
    port = free_port()
    user = ""
    if os.geteuid() == 0:
        # As root nginx drops its workers to nobody; name the group that exists here.
        nobody = pwd.getpwnam("nobody")
        user = f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};\n"
    (tmp / "nginx-tmp").mkdir()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(user=user, tmp=tmp, port=port, root=root))
    log = tmp / "nginx-error.log"
    argv = [NGINX, "-p", str(tmp), "-c", str(conf), "-e", str(log)]
    service = Service("nginx", port, spawn(argv, log), log)
    try:
        service.wait_ready(probe)
        yield service
    finally:
        service.stop()


FRONT_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "nginx.conf"
# What the shipped front configuration says, and what is put in its place here.
FRONT_FILL = {
    "/tmp/": "{tmp}/",  # first: the paths put in may hold /tmp/
    "worker_processes auto;": "worker_processes 1;",
    "listen 8080;": "listen 127.0.0.1:{port};",
    "server 127.0.0.1:8787;": "server 127.0.0.1:{upstream};",
    "/var/lib/neffcache/store/": "{store}/",
}


@contextlib.contextmanager
def nginx_front(tmp: Path, neff: Service, store: Path) -> Iterator[Service]:
    """deploy/nginx/nginx.conf in front of ``neff``, one worker (the per-core peer of
    one nginx), its ports and paths filled in: nginx sends the blobs' files itself."""
    port, home = free_port(), tmp / "front"
    home.mkdir()
    config = FRONT_CONFIG.read_text()
    values = {"tmp": home, "port": port, "upstream": neff.url.rsplit(":", 1)[1], "store": store}
    for token, value in FRONT_FILL.items():
        if token not in config:
            raise RuntimeError(f"deploy/nginx/nginx.conf no longer says {token!r}")
        config = config.replace(token, value.format(**values))
    conf = home / "nginx.conf"
    conf.write_text(config)
    log = home / "nginx.log"
    directives = "daemon off;" + (" user root;" if os.geteuid() == 0 else "")  # 0600 blobs
    argv = [NGINX, "-p", str(home), "-c", str(conf), "-e", str(log), "-g", directives]
    service = Service("nginx front", port, spawn(argv, log), log)
    service.also.append(neff)
    try:
        service.wait_ready("/healthz")
        yield service
    finally:
        service.stop()


# --- load clients -----------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    requests: int
    bytes: int
    errors: int
    server_cpu: float  # cores busy
    client_cpu: float
    client_threads: int  # how many cores the client can use at most
    p50_ms: float | None = None
    p99_ms: float | None = None
    peak_mib: float | None = None  # the neffcache process's peak RSS during the run
    pinned: bool = False  # server and client each held to one core

    @property
    def mib_s(self) -> float:
        return self.bytes / MiB / self.seconds

    @property
    def req_s(self) -> float:
        return self.requests / self.seconds

    def limit(self) -> str | None:
        """Why this run may say more about the client or the machine than the server."""
        return limited(self.server_cpu, self.client_cpu, self.client_threads, self.pinned)


def limited(
    server_cpu: float, client_cpu: float, client_threads: int, pinned: bool = False
) -> str | None:
    if pinned:
        # Each side has one core: the server should be the one that is full.
        if client_cpu >= 0.85:
            return f"client-bound: {client_cpu:.2f} of its 1 core busy"
        if server_cpu < 0.85:
            return f"server core not full: {server_cpu:.2f} of 1 busy"
        return None
    cores = os.cpu_count() or 1
    if client_cpu >= 0.85 * client_threads:
        return f"client-bound: {client_cpu:.2f} of its {client_threads} thread(s) busy"
    if server_cpu + client_cpu >= 0.85 * cores:
        return f"machine saturated: {server_cpu + client_cpu:.2f} of {cores} cores busy"
    return None


WRK_SCRIPT = """\
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %.0f %.0f %.0f %.0f %.0f %.0f\\n", summary.duration,
    summary.requests, summary.bytes, e.connect + e.read + e.write + e.timeout + e.status,
    latency:percentile(50), latency:percentile(99)))
end
"""


class Client:
    """Drives GET load against a URL for a fixed time; wrk or Python worker processes."""

    def __init__(self, kind: str, tmp: Path, pinned: bool) -> None:
        self.kind = kind
        self.pinned = pinned  # the caller already runs on the client's core
        self.script = tmp / "report.lua"
        self.script.write_text(WRK_SCRIPT)

    def get(self, service: Service, path: str, connections: int, seconds: int) -> Run:
        watch = service.name == "neffcache" and service.reset_peak()
        if self.kind == "wrk":
            run = self._wrk(service, path, connections, seconds)
        else:
            run = self._python(service, path, connections, seconds)
        service.check_alive()
        run.peak_mib = service.peak_mib() if watch else None
        run.pinned = self.pinned
        return run

    def _wrk(self, service: Service, path: str, connections: int, seconds: int) -> Run:
        threads = 1 if self.pinned else min(connections, 2)
        argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "300s"]
        server0, client0, wall0 = service.cpu(), children_cpu(), time.monotonic()
        done = subprocess.run(
            [*argv, "-s", str(self.script), service.url + path],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
        )
        wall = time.monotonic() - wall0
        server_cpu, client_cpu = (service.cpu() - server0) / wall, (children_cpu() - client0) / wall
        match = re.search(r"^WRK (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)$", done.stdout, re.M)
        if done.returncode != 0 or match is None:
            raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
        micros, requests, nbytes, errors, p50, p99 = (int(v) for v in match.groups())
        return Run(
            micros / 1e6, requests, nbytes, errors, server_cpu, client_cpu, threads,
            p50 / 1e3, p99 / 1e3,
        )  # fmt: skip

    def _python(self, service: Service, path: str, connections: int, seconds: int) -> Run:
        cores = 1 if self.pinned else os.cpu_count() or 1
        processes = max(1, min(connections, cores))  # one GIL each
        start_at = time.time() + 2.0  # after every worker has imported httpx
        stop_at = start_at + seconds
        workers = []
        try:
            for i in range(processes):
                threads = connections // processes + (i < connections % processes)
                job = json.dumps([service.url + path, threads, start_at, stop_at])
                workers.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--worker", job],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            # CPU over the measured window only, not the workers' start-up.
            time.sleep(max(0.0, start_at - time.time()))
            server0 = service.cpu()
            time.sleep(max(0.0, stop_at - time.time()))
            server_cpu = (service.cpu() - server0) / seconds
            results = [json.loads(w.communicate(timeout=seconds + 120)[0]) for w in workers]
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        latencies = sorted(x for r in results for x in r["latencies"])
        return Run(
            stop_at - start_at,
            sum(r["requests"] for r in results),
            sum(r["bytes"] for r in results),
            sum(r["errors"] for r in results),
            server_cpu,
            sum(r["cpu"] for r in results) / seconds,
            processes,
            latencies[len(latencies) // 2] * 1e3 if latencies else None,
            latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else None,
        )


def worker_main(job: str) -> None:
    """One Python client process: THREADS httpx clients GETting URL until STOP_AT."""
    url, threads, start_at, stop_at = json.loads(job)
    totals: list[dict[str, Any]] = []

    def loop() -> None:
        got: dict[str, Any] = {"requests": 0, "bytes": 0, "errors": 0, "latencies": []}
        with httpx.Client(timeout=300) as client:
            time.sleep(max(0.0, start_at - time.time()))
            while time.time() < stop_at:
                begin = time.perf_counter()
                try:
                    with client.stream("GET", url) as response:
                        if response.status_code != 200:
                            got["errors"] += 1
                        for chunk in response.iter_raw(MiB):
                            got["bytes"] += len(chunk)
                            if time.time() >= stop_at:
                                break
                        else:
                            got["requests"] += 1
                            got["latencies"].append(time.perf_counter() - begin)
                except httpx.HTTPError:
                    got["errors"] += 1
        totals.append(got)

    pool = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = time.process_time()
    for thread in pool:
        thread.join()
    merged: dict[str, Any] = {k: sum(t[k] for t in totals) for k in ("requests", "bytes", "errors")}
    merged["cpu"] = time.process_time() - cpu0
    merged["latencies"] = [x for t in totals for x in t["latencies"]]
    json.dump(merged, sys.stdout)


# --- neffcache calls and bodies ---------------------------------------------------------


def hexdigest(data: bytes | memoryview) -> str:
    value: str = blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()
    return value


def chunks_of(data: bytes, size: int = MiB) -> Iterator[memoryview]:
    view = memoryview(data)
    for start in range(0, len(view), size):
        yield view[start : start + size]


def put_blob(client: httpx.Client, url: str, digest: str, body: Iterable[Any], size: int) -> None:
    response = client.put(
        f"{url}/v1/blobs/{digest}", content=body, headers={"Content-Length": str(size)}
    )
    if response.status_code not in (200, 201):
        raise RuntimeError(f"PUT blob answered {response.status_code}: {response.text}")


def get_all(client: httpx.Client, url: str) -> int:
    received = 0
    with client.stream("GET", url) as response:
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}")
        for chunk in response.iter_raw(MiB):
            received += len(chunk)
    return received


def transfer(
    url: str, method: str, path: str, body: Iterable[Any] = (), length: int | None = None
) -> int:
    """One request on a fresh connection, the body (if ``length`` is given) sent with
    ``sendall`` and the response body read into a reused 1 MiB buffer and dropped.

    The PUT-versus-GET figure uses this plain client for both sides: httpx reads 64 KiB
    at a time through its parser and saturates a core near nginx's GET rate.
    """
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=600) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n"
        if length is not None:
            head += f"Content-Length: {length}\r\n"
        sock.sendall(f"{head}\r\n".encode())
        for chunk in body:
            sock.sendall(chunk)
        view = memoryview(bytearray(MiB))
        received = b""
        while b"\r\n\r\n" not in received:
            n = sock.recv_into(view)
            if not n:
                raise RuntimeError(f"{method} {path}: connection closed before the headers")
            received += view[:n]
        header, _, rest = received.partition(b"\r\n\r\n")
        status = int(header.split(None, 2)[1])
        if status not in (200, 201):
            raise RuntimeError(f"{method} {path} answered {status}: {rest[:300]!r}")
        match = re.search(rb"\r\ncontent-length:\s*(\d+)", header, re.I)
        expected, got = (int(match[1]) if match else 0), len(rest)
        while got < expected:
            n = sock.recv_into(view)
            if not n:
                raise RuntimeError(f"{method} {path}: connection closed after {got} bytes")
            got += n
        return got


def pattern_stream(pattern: bytes, total: int, abort: threading.Event) -> Iterator[bytes]:
    for _ in range(total // len(pattern)):
        if abort.is_set():
            raise RuntimeError("aborted")
        yield pattern


def manifest(key: str, digest: str, size: int) -> dict[str, Any]:
    """The shape of docs/protocol.md's example entry, naming a blob on the server."""
    return {
        "key": key,
        "direct_key": hexdigest(b"direct " + key.encode()),
        "neuron_address": "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb",
        "components": {
            "fingerprint": hexdigest(b"fingerprint"),
            "compiler_version": "2.20.9961.0+0acef03a",
            "target": "trn2",
            "flags": ["--model-type=transformer"],
            "env": {},
        },
        "files": {"model.neff": {"digest": digest, "size": size}},
        "compile_seconds": 812.4,
    }


# --- report -----------------------------------------------------------------------------


@dataclass
class Figure:
    label: str
    unit: str
    neffcache: float
    nginx: float | None
    goal: str
    met: bool | None
    notes: list[str] = field(default_factory=list)
    peak_mib: float | None = None  # neffcache's peak RSS while measured

    @property
    def ratio(self) -> float | None:
        return None if not self.nginx else self.neffcache / self.nginx


def describe(name: str, run: Run, unit: str) -> str:
    if unit == "MiB/s":
        value = f"{run.mib_s:9.1f} MiB/s {run.req_s:8.1f} req/s"
    else:
        value = f"{run.req_s:9.0f} req/s {run.bytes / max(run.requests, 1):6.0f} B/resp"
    latency = "" if run.p50_ms is None else f", p50 {run.p50_ms:.1f} ms p99 {run.p99_ms:.1f} ms"
    errors = f", ERRORS {run.errors}" if run.errors else ""
    peak = "" if run.peak_mib is None else f", peak RSS {run.peak_mib:.0f} MiB"
    limit = run.limit()
    return (
        f"    {name:<14}{value}  (server {run.server_cpu:.2f} cores, client "
        f"{run.client_cpu:.2f}{latency}{peak}{errors}){f' [{limit}]' if limit else ''}"
    )


def caveats(nginx_limit: str | None, neff_limit: str | None) -> list[str]:
    notes = []
    if nginx_limit:
        notes.append(
            f"nginx's run was {nginx_limit.split(':')[0]}: nginx may be faster than shown, "
            "so the ratio flatters neffcache"
        )
    if neff_limit:
        notes.append(f"neffcache's run was {neff_limit.split(':')[0]}: the ratio may understate it")
    return notes


def ratio_line(ratio: float, goal: float | None) -> str:
    target = f"goal >= {goal}x: {'met' if ratio >= goal else 'NOT met'}" if goal else "no goal"
    return f"    RATIO neffcache / nginx = {ratio:.2f}x ({target})"


def compare(
    client: Client,
    servers: tuple[Service, Service],
    paths: tuple[str, str],
    connections: int,
    seconds: int,
    label: str,
    unit: str,
    goal: float | None,
    rounds: int,
) -> Figure:
    """``rounds`` pairs of runs, nginx then neffcache each time; the figure is the
    median pair's, and the lowest and highest ratios are its spread. One run's ratio
    moves with whatever else the kernel did meanwhile; alternating and taking the
    median keeps a lucky or unlucky run from deciding a goal."""
    print(
        f"{label} ({client.kind}, {connections} connection(s), {seconds} s each, "
        f"{rounds} round(s))",
        flush=True,
    )
    pick: Callable[[Run], float] = (lambda r: r.mib_s) if unit == "MiB/s" else (lambda r: r.req_s)
    pairs: list[tuple[float, Run, Run]] = []
    for _ in range(rounds):
        runs = []
        for service, path in zip(servers, paths, strict=True):
            run = client.get(service, path, connections, seconds)
            print(describe(service.name, run, unit), flush=True)
            runs.append(run)
        nginx, neff = runs
        ratio = pick(neff) / pick(nginx)
        print(ratio_line(ratio, goal), flush=True)
        pairs.append((ratio, nginx, neff))
    pairs.sort(key=lambda pair: pair[0])
    ratio, nginx, neff = pairs[len(pairs) // 2]
    notes = []
    if rounds > 1:
        _, low, high = pinning.median_and_spread([r for r, _, _ in pairs])
        spread = ", ".join(f"{r:.2f}" for r, _, _ in pairs)
        print(f"    MEDIAN of {rounds}: {ratio:.2f}x (all: {spread})", flush=True)
        notes.append(f"median of {rounds} rounds, ratios {low:.2f}-{high:.2f}")
    notes += caveats(nginx.limit(), neff.limit())
    for note in notes:
        print(f"    note: {note}", flush=True)
    return Figure(
        label,
        unit,
        pick(neff),
        pick(nginx),
        f">= {goal}x" if goal else "-",
        None if goal is None else ratio >= goal,
        notes,
        neff.peak_mib,
    )


def versions(client_kind: str, cores: Cores | None) -> list[str]:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "absent"

    cpu = "?"
    with contextlib.suppress(OSError):
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = found[1] if found else cpu
    mem = mem_total_kib()
    nginx = subprocess.run([NGINX, "-v"], capture_output=True, text=True, check=False)
    lines = [
        f"machine: {platform.machine()} {cpu}, {os.cpu_count()} cores "
        f"({len(os.sched_getaffinity(0))} usable), {mem / 2**20:.1f} GiB RAM, "
        f"Linux {platform.release()}",
        f"python {platform.python_version()}, neffcache {version('neffcache')}, "
        f"fastapi {version('fastapi')}, starlette {version('starlette')}, "
        f"uvicorn {version('uvicorn')} (uvloop {version('uvloop')}, "
        f"httptools {version('httptools')}), httpx {version('httpx')}, "
        f"blake3 {version('blake3')}",
        "neffcache serve: one uvicorn process on embedded defaults (access log off); "
        f"{nginx.stderr.strip().removeprefix('nginx version: ')}: worker_processes 1 to match, "
        "sendfile on, access_log off",
    ]
    if client_kind == "wrk":
        wrk = subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False)
        name = (wrk.stdout + wrk.stderr).splitlines()[0].split(" Copyright")[0]
        lines.append(f"client: {name}, {1 if cores else 2} thread(s) at most")
    else:
        lines.append(f"client: Python worker processes with httpx {version('httpx')} threads")
    lines.append(
        cores.describe()
        if cores
        else "not pinned: servers and client share every core (figures are whole-machine)"
    )
    return lines


def mem_total_kib() -> int:
    match = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    return int(match[1]) if match else 0


def summary(figures: list[Figure]) -> None:
    print("\nSUMMARY (neffcache / nginx, same run, same client; RSS: neffcache's peak meanwhile)")
    head = (
        f"{'figure':<45}{'neffcache':>10}{'nginx':>10}{'ratio':>8}  {'goal':<11}{'met':<4}RSS MiB"
    )
    print(head)
    print("-" * len(head))
    for fig in figures:
        nginx = f"{fig.nginx:10.1f}" if fig.nginx is not None else f"{'-':>10}"
        ratio = f"{fig.ratio:7.2f}x" if fig.ratio is not None else f"{'-':>8}"
        met = "-" if fig.met is None else ("yes" if fig.met else "NO")
        rss = "-" if fig.peak_mib is None else f"{fig.peak_mib:.0f}"
        label = f"{fig.label} ({fig.unit})"
        print(f"{label:<45}{fig.neffcache:10.1f}{nginx}{ratio}  {fig.goal:<11}{met:<4}{rss:>7}")
        for note in fig.notes:
            print(f"    {note}")
        if fig.nginx:
            peer = "nginx GET of the same size" if fig.label.startswith("PUT") else "nginx"
            record(
                "server",
                fig.label,
                fig.neffcache,
                peer,
                fig.nginx,
                fig.unit,
                better="higher",
                goal="" if fig.goal == "-" else fig.goal,
                note="; ".join(fig.notes),
            )


# --- phases -----------------------------------------------------------------------------


def size_text(n: int) -> str:
    return f"{n // 2**30} GiB" if n % 2**30 == 0 else f"{n // MiB} MiB"


def disk_rate(directory: Path, data: bytes) -> float:
    """MiB/s of writing ``data`` to a new file in ``directory`` and fsyncing it."""
    path = directory / "disk-reference.bin"
    start = time.monotonic()
    try:
        with open(path, "wb") as out:
            for chunk in chunks_of(data):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        return len(data) / MiB / (time.monotonic() - start)
    finally:
        path.unlink(missing_ok=True)


def put_phase(plan: Plan, neff: Service, nginx: Service, big: bytes, tmp: Path) -> Figure:
    size_label = size_text(plan.big)
    print(
        f"PUT {size_label} to neffcache vs nginx GET {size_label} (plain socket client, "
        f"1 connection, {plan.put_repeats} requests each). nginx serves static files and "
        "cannot accept PUT without a module, so its figure here is a GET of the same size, "
        "not a PUT.",
        flush=True,
    )
    bodies = []
    for i in range(plan.put_repeats):  # distinct blobs: each PUT stores (201), none dedups
        body = i.to_bytes(8, "big") + big[8:]
        bodies.append((hexdigest(body), body))
    results: dict[str, Run] = {}

    def timed(service: Service, name: str, action: Callable[[int], int]) -> None:
        watch = service.name == "neffcache" and service.reset_peak()
        server0, client0, wall0 = service.cpu(), self_cpu(), time.monotonic()
        moved = sum(action(i) for i in range(plan.put_repeats))
        wall = time.monotonic() - wall0
        service.check_alive()
        server_cpu, client_cpu = (service.cpu() - server0) / wall, (self_cpu() - client0) / wall
        results[name] = Run(wall, plan.put_repeats, moved, 0, server_cpu, client_cpu, 1)
        results[name].peak_mib = service.peak_mib() if watch else None
        print(describe(name, results[name], "MiB/s"), flush=True)

    def put(i: int) -> int:
        digest, body = bodies[i]
        transfer(neff.url, "PUT", f"/v1/blobs/{digest}", chunks_of(body), len(body))
        return len(body)

    big_path = f"/v1/blobs/{hexdigest(big)}"
    timed(nginx, "nginx GET", lambda _: transfer(nginx.url, "GET", "/big.bin"))
    timed(neff, "neffcache PUT", put)
    timed(neff, "neffcache GET", lambda _: transfer(neff.url, "GET", big_path))
    disk = disk_rate(tmp, big)
    put_run, nginx_run = results["neffcache PUT"], results["nginx GET"]
    ratio = put_run.mib_s / nginx_run.mib_s
    print(ratio_line(ratio, None) + " [neffcache PUT against nginx GET]", flush=True)
    print(
        "    (same client, for reference: neffcache GET / nginx GET = "
        f"{results['neffcache GET'].mib_s / nginx_run.mib_s:.2f}x. A PUT is durable before "
        f"it answers: writing and fsyncing {size_label} to a file beside the data dir runs "
        f"at {disk:.1f} MiB/s here, a ceiling for any such PUT; PUT / that = "
        f"{put_run.mib_s / disk:.2f}x)",
        flush=True,
    )
    notes = [
        "nginx cannot accept PUT: its figure is a GET of the same size, same client",
        f"disk write + fsync of {size_label}: {disk:.0f} MiB/s (PUT / that = "
        f"{put_run.mib_s / disk:.2f}x)",
        *caveats(nginx_run.limit(), put_run.limit()),
    ]
    for note in notes[2:]:
        print(f"    note: {note}", flush=True)
    return Figure(
        f"PUT {size_label} vs nginx GET {size_label}",
        "MiB/s",
        put_run.mib_s,
        nginx_run.mib_s,
        "-",
        None,
        notes,
        put_run.peak_mib,
    )


def rss_phase(plan: Plan, neff: Service) -> Figure:
    size_label = size_text(plan.upload_bytes)
    print(
        f"peak RSS of the neffcache process during {plan.uploads} concurrent {size_label} "
        "uploads (streamed bodies, python httpx threads)",
        flush=True,
    )
    patterns = [
        blake3.blake3(f"neffcache-bench-upload-{k}".encode()).digest(length=MiB)
        for k in range(plan.uploads)
    ]
    never = threading.Event()
    digests = []
    for pattern in patterns:
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        for chunk in pattern_stream(pattern, plan.upload_bytes, never):
            hasher.update(chunk)
        digests.append(hasher.hexdigest())

    abort, finished = threading.Event(), threading.Event()
    samples: list[int] = []
    probes: list[float] = []
    failures: list[str] = []

    def sample() -> None:
        while not finished.is_set():
            with contextlib.suppress(OSError):
                samples.append(status_kib(neff.pid, "VmRSS"))
            time.sleep(0.02)

    def probe() -> None:
        with httpx.Client(timeout=60) as client:
            while not finished.is_set():
                begin = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    client.get(f"{neff.url}/healthz")
                    probes.append(time.perf_counter() - begin)
                time.sleep(0.1)

    def upload(k: int) -> None:
        try:
            with httpx.Client(timeout=600) as client:
                body = pattern_stream(patterns[k], plan.upload_bytes, abort)
                put_blob(client, neff.url, digests[k], body, plan.upload_bytes)
        except Exception as exc:  # reported below; the others carry on
            failures.append(f"upload {k}: {exc}")

    baseline = status_kib(neff.pid, "VmRSS") / 1024
    hwm_reset = neff.reset_peak()
    watchers = [threading.Thread(target=fn, daemon=True) for fn in (sample, probe)]
    uploaders = [
        threading.Thread(target=upload, args=(k,), daemon=True) for k in range(plan.uploads)
    ]
    server0, wall0 = neff.cpu(), time.monotonic()
    try:
        for thread in watchers + uploaders:
            thread.start()
        for thread in uploaders:
            thread.join()
    finally:
        abort.set()  # on Ctrl-C the streams stop at their next chunk
        finished.set()
    wall = time.monotonic() - wall0
    for thread in watchers:
        thread.join(timeout=5)
    neff.check_alive()
    server_cpu = (neff.cpu() - server0) / wall
    hwm = neff.peak_mib()
    sampled = max(samples, default=0) / 1024
    peak = max(sampled, hwm) if hwm_reset else sampled
    total = plan.uploads * plan.upload_bytes / MiB
    probes.sort()
    print(
        f"    baseline {baseline:.1f} MiB; peak {peak:.1f} MiB (VmHWM after reset "
        f"{hwm:.1f}{'' if hwm_reset else ' (reset refused: ignored)'}, max sampled VmRSS "
        f"{sampled:.1f})",
        flush=True,
    )
    print(
        f"    {total:.0f} MiB uploaded in {wall:.1f} s = {total / wall:.1f} MiB/s aggregate, "
        f"server {server_cpu:.2f} cores; /healthz during uploads: "
        + (
            f"p50 {probes[len(probes) // 2] * 1e3:.1f} ms, max {probes[-1] * 1e3:.1f} ms "
            f"({len(probes)} probes)"
            if probes
            else "no answer"
        ),
        flush=True,
    )
    met = peak < RSS_GOAL_MIB
    print(f"    PEAK RSS {peak:.1f} MiB (goal < {RSS_GOAL_MIB} MiB: {'met' if met else 'NOT met'})")
    for failure in failures:
        print(f"    FAILED {failure}")
    notes = [f"{plan.uploads} x {size_label} uploads, {total / wall:.0f} MiB/s aggregate"]
    if failures:
        notes.append(f"{len(failures)} upload(s) FAILED")
    goal = f"< {RSS_GOAL_MIB} MiB"
    return Figure("peak RSS during uploads", "MiB", peak, None, goal, met, notes, peak)


def run(plan: Plan, client_kind: str, quick: bool, cores: Cores | None) -> None:
    print("\n".join(versions(client_kind, cores)))
    if quick:
        print("--quick: smaller sizes and shorter runs; not the goals' figures")
    started = time.monotonic()
    figures: list[Figure] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="neffcache-bench-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        tmp.chmod(0o755)  # nginx workers run as nobody when we are root
        www = tmp / "www"
        www.mkdir()
        small, tiny = os.urandom(MiB), os.urandom(4096)
        big = os.urandom(plan.big)
        for name, data in (("small.bin", small), ("tiny.bin", tiny), ("big.bin", big)):
            (www / name).write_bytes(data)
        server_core = cores.server if cores else None
        with pinning.on(server_core):
            neff = stack.enter_context(neffcache_server(tmp))
        started_rss = status_kib(neff.pid, "VmRSS") / 1024
        with pinning.on(server_core):
            nginx = stack.enter_context(nginx_server(tmp, www, "/tiny.bin"))
            front = stack.enter_context(nginx_front(tmp, neff, tmp / "neffcache-data"))
        pinning.stay_on(cores.client if cores else None)
        client = Client(client_kind, tmp, cores is not None)
        key = hexdigest(b"neffcache bench entry")
        with httpx.Client(timeout=600) as http:
            for data in (small, tiny, big):
                put_blob(http, neff.url, hexdigest(data), chunks_of(data), len(data))
            entry = manifest(key, hexdigest(tiny), len(tiny))
            response = http.put(f"{neff.url}/v1/ns/{NAMESPACE}/entries/{key}", json=entry)
            if response.status_code != 201:
                raise RuntimeError(f"PUT entry answered {response.status_code}: {response.text}")
            for service, path in (
                (nginx, "/small.bin"),
                (nginx, "/tiny.bin"),
                (nginx, "/big.bin"),
                (neff, f"/v1/blobs/{hexdigest(small)}"),
                (neff, f"/v1/blobs/{hexdigest(big)}"),
                (neff, f"/v1/ns/{NAMESPACE}/entries/{key}"),
                (front, f"/v1/blobs/{hexdigest(small)}"),  # verified, then sent by nginx
                (front, f"/v1/blobs/{hexdigest(big)}"),
            ):
                get_all(http, service.url + path)  # page cache warm, both sides
        print(
            f"servers: neffcache pid {neff.pid} at {neff.url} (data in {tmp}, RSS "
            f"{started_rss:.1f} MiB at start), nginx pid {nginx.pid} at {nginx.url}, "
            f"nginx front (deploy/nginx/nginx.conf, 1 worker) pid {front.pid} at {front.url}\n",
            flush=True,
        )
        servers = (nginx, neff)
        small_paths = ("/small.bin", f"/v1/blobs/{hexdigest(small)}")
        big_paths = ("/big.bin", f"/v1/blobs/{hexdigest(big)}")
        big_label = f"GET {size_text(plan.big)}"
        lookup_paths = ("/tiny.bin", f"/v1/ns/{NAMESPACE}/entries/{key}")
        fronted = (nginx, front)
        # How neffcache sends each figure's bytes (server/immediate.py), on the page.
        sent_file = "neffcache sends the verified file with sendfile, as nginx does"
        streamed = (
            "neffcache sends a verified blob over 16 MiB with sendfile each time the "
            "socket has room (server/filestream.py), as nginx does"
        )
        answered = "neffcache's HTTP protocol answers the lookup itself (no ASGI task)"
        shared = (
            "the front and the server behind it share the server core: each request "
            "crosses nginx, the server and nginx again (docs/architecture.md#serving-at-the-limit)"
        )
        specs = [  # label, servers, paths, connections, seconds, unit, goal, how
            ("GET 1 MiB, 1 conn", servers, small_paths, 1, plan.small_seconds, "MiB/s", None,
             sent_file),
            ("GET 1 MiB, 16 conn", servers, small_paths, 16, plan.small_seconds, "MiB/s", 0.7,
             sent_file),
            (f"{big_label}, 1 conn", servers, big_paths, 1, plan.big_seconds, "MiB/s", 0.9,
             streamed),
            (f"{big_label}, 16 conn", servers, big_paths, 16, plan.big_seconds, "MiB/s", 0.9,
             streamed),
            ("entry lookup vs 4 KiB file, 16 conn", servers, lookup_paths, 16,
             plan.lookup_seconds, "req/s", 0.2, answered),
            ("GET 1 MiB via nginx front, 16 conn", fronted, small_paths, 16,
             plan.small_seconds, "MiB/s", 0.95, shared),
            (f"{big_label} via nginx front, 16 conn", fronted, big_paths, 16,
             plan.big_seconds, "MiB/s", 0.95, shared),
        ]  # fmt: skip
        for label, pair, paths, connections, seconds, unit, goal, how in specs:
            figure = compare(
                client, pair, paths, connections, seconds, label, unit, goal, plan.rounds
            )
            figure.notes.append(how)
            figures.append(figure)
        figures.append(put_phase(plan, neff, nginx, big, tmp))
        del big
        figures.append(rss_phase(plan, neff))
    summary(figures)
    print(f"\ntotal {time.monotonic() - started:.0f} s; servers stopped, temp dir removed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, short runs")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument(
        "--pin",
        choices=("auto", "on", "off"),
        default="auto",
        help="servers on one core, the client on another (auto: when two are usable)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one client process
    args = parser.parse_args()
    if args.worker:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the parent reports it
            worker_main(args.worker)
        return
    kind = args.client
    if kind == "auto":
        kind = "wrk" if shutil.which("wrk") else "python"
    elif kind == "wrk" and not shutil.which("wrk"):
        parser.error("wrk is not installed (apt-get install wrk), use --client python")
    if not Path(NGINX).exists():
        parser.error(f"{NGINX} is not installed")
    cores = pinning.choose(args.pin)
    until_interrupted(lambda: run(QUICK if args.quick else FULL, kind, args.quick, cores))


def until_interrupted(work: Callable[[], int | None]) -> None:
    """Run a benchmark and exit with its code. SIGTERM and SIGHUP stop it as Ctrl-C
    does: through its context managers, which stop its servers and remove its
    temporary directory; then it exits 130."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        sys.exit(work())
    except KeyboardInterrupt:
        print("\ninterrupted; processes stopped, temp dir removed", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
