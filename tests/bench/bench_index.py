"""Publishes and lookups through the durable index, per backend, against the same calls
on the index alone.

    python tests/bench/bench_index.py [--quick] [--ops N] [--rounds R]

A server writes every entry through ``DurableIndex`` (recovery/durable.py), which keeps
each durable row's document beside the blobs: a publish is the index's row and one
document written create-only; a lookup goes straight to the index. This measures both
in one process, on SQLite and on a real ``redis-server`` (documents on the filesystem
in both, as a server keeps them), and reports each as a ratio to the same calls on the
plain index of the same backend, measured in the same run in alternating rounds (the
median round, and the spread). The plain index is the floor: what a publish costs
with no document at all.

The same script runs unchanged against any version whose ``DurableIndex`` takes
``(index, store)``, so two versions' figures compare a change's cost before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from results import record

from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.index import Entry, Index, open_index
from neffcache.server.manifest import canonical_json
from neffcache.server.recovery.durable import DurableIndex

NAMESPACE = "bench"
BLOB = "ab" * 32  # the manifests name one blob; a publish never reads it


def manifest(key: str) -> str:
    files = {"model.neff": {"digest": BLOB, "size": 1 << 20}}
    return canonical_json({"key": key, "files": files, "compile_seconds": 60.0})


def entries(run: str, count: int) -> list[Entry]:
    now = time.time()
    keys = [uuid.uuid5(uuid.NAMESPACE_URL, f"{run} {n}").hex * 2 for n in range(count)]
    return [Entry(NAMESPACE, key, manifest(key), now, "bench") for key in keys]


def publishes(index: Index, batch: list[Entry]) -> float:
    """Publishes per second of ``batch``, each a new key."""
    start = time.perf_counter()
    for entry in batch:
        index.put_entry(entry, ())
    return len(batch) / (time.perf_counter() - start)


def lookups(index: Index, batch: list[Entry]) -> float:
    """Lookups per second of every entry of ``batch`` (published before)."""
    start = time.perf_counter()
    for entry in batch:
        if index.get_entry(entry.namespace, entry.key) is None:
            raise SystemExit(f"bench_index: a lookup of {entry.key} missed: the figure is void")
    return len(batch) / (time.perf_counter() - start)


@contextlib.contextmanager
def redis_url(tmp: Path) -> Iterator[str]:
    """A ``redis-server`` of its own on 127.0.0.1, without persistence."""
    import redis

    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("bench_index: needs redis-server on PATH (apt-get install redis-server)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    server = subprocess.Popen([*argv, "--dir", str(tmp)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(redis.RedisError):
                if redis.Redis(port=port).ping():
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("bench_index: redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def measure(backend: str, url: Callable[[str], str], root: Path, ops: int, rounds: int) -> None:
    """Alternating rounds on two fresh indexes of one backend: one wrapped, one plain."""
    durable = DurableIndex(open_index(url("durable")), FsBlobStore(root / "durable"))
    plain = open_index(url("plain"))
    runs: dict[str, dict[str, list[float]]] = {"publishes": {}, "lookups": {}}
    for n in range(rounds):
        for name, index in (("durable", durable), ("plain", plain)):
            batch = entries(f"{name} {n}", ops)
            runs["publishes"].setdefault(name, []).append(publishes(index, batch))
            runs["lookups"].setdefault(name, []).append(lookups(index, batch))
    for what, by in runs.items():
        ratios = sorted(d / p for d, p in zip(by["durable"], by["plain"], strict=True))
        value, peer = statistics.median(by["durable"]), statistics.median(by["plain"])
        spread = f"{ratios[0]:.2f}-{ratios[-1]:.2f}"
        print(
            f"{backend:>7} {what:>9}: durable {value:>9,.0f}/s  plain {peer:>9,.0f}/s  "
            f"ratio {statistics.median(ratios):.3f} (rounds {spread})"
        )
        record(
            "index",
            f"{what} through DurableIndex, {backend} index, documents on the filesystem",
            value,
            f"{what} on the {backend} index alone",
            peer,
            "ops/s",
            better="higher",
            note=f"median of {rounds} alternating rounds of {ops:,}; round ratios {spread}",
        )
    durable.close()
    plain.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and smaller rounds")
    parser.add_argument("--ops", type=int, default=None, help="publishes per round")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    ops = args.ops or (300 if args.quick else 1500)
    rounds = args.rounds or (3 if args.quick else 5)
    print(f"# {ops:,} publishes, then lookups of each, per round; {rounds} rounds", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-index-") as scratch:
        tmp = Path(scratch)
        measure("sqlite", lambda name: f"sqlite:///{tmp}/{name}.db", tmp, ops, rounds)
        with redis_url(tmp) as base:
            databases = {"durable": 0, "plain": 1}
            measure("redis", lambda name: f"{base}/{databases[name]}", tmp, ops, rounds)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
