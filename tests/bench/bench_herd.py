"""The thundering herd, measured: N client processes, each playing one host
with its own L1, compile one cold graph at once through the compiler wrapper against
``neffcache serve`` on embedded defaults. The stand-in compile (not the real
compiler) takes ``--compile-seconds``.

Peer, in the same run: the same herd with compile leases off (``NEFFCACHE_LEASES=0``),
which is what the stock cache and every peer cache do: every host compiles.

Printed: process start-up (not part of the herd), compiles and compile-seconds for
both, when the first compile started, how long after the compile ended each client
held the NEFF (goal: all within 2 s), the server's CPU while the herd waited, and
the same after SIGKILLing the holder half-way (goal: exactly one more compile,
starting within the lease TTL).

    python tests/bench/bench_herd.py [--clients 64] [--compile-seconds 10] [--ttl 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from herd import Herd, run_herd
from results import record


def _after_end(herd: Herd) -> list[float]:
    end = max(herd.compile_ends)
    return sorted(r["done"] - end for r in herd.results)


def _report(name: str, herd: Herd, compile_seconds: float) -> None:
    after = _after_end(herd)
    print(f"  {name}:")
    print(f"    start-up of {herd.clients} processes (not counted): {herd.startup_seconds:.2f} s")
    print(
        f"    compiles: {herd.compiles} ({herd.compiles * compile_seconds:.0f} compile-seconds); "
        f"first started {herd.compile_starts[0] - herd.go:.2f} s after the go"
    )
    if herd.compiles > 2:  # each host held its own NEFF when its own compile ended
        print(f"    server CPU while the herd waited: {100 * herd.server_cpu_while_waiting:.1f} %")
        return
    print(
        "    NEFF held after the compile ended: "
        f"min {after[0]:.3f} s, median {statistics.median(after):.3f} s, max {after[-1]:.3f} s"
        f" ({sum(1 for a in after if a <= 2.0)}/{len(after)} within 2 s)"
    )
    print(f"    server CPU while the herd waited: {100 * herd.server_cpu_while_waiting:.1f} %")
    print(f"    exit codes: {sorted({r['code'] for r in herd.results})}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--compile-seconds", type=float, default=10.0)
    parser.add_argument("--ttl", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="16 clients, a 3 s compile")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.compile_seconds = 16, 3.0
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-herd-") as tmp:
        root = Path(tmp)
        leases = run_herd(root / "leases", clients=args.clients, delay=args.compile_seconds)
        plain = run_herd(
            root / "every-host",
            clients=args.clients,
            delay=args.compile_seconds,
            client_env={"NEFFCACHE_LEASES": "0"},
        )
        killed = run_herd(
            root / "killed",
            clients=args.clients,
            delay=args.compile_seconds,
            ttl=args.ttl,
            kill_holder_after=args.compile_seconds / 2,
        )
    print(f"cold herd: {args.clients} hosts, one graph, a {args.compile_seconds:.0f} s compile")
    _report("neffcache (compile leases)", leases, args.compile_seconds)
    _report("peer: every host compiles (leases off)", plain, args.compile_seconds)
    print(f"  ratio of compile-seconds, neffcache / peer: {leases.compiles / plain.compiles:.3f}")
    record(
        "herd",
        f"compile-seconds of {args.clients} hosts on one cold graph",
        leases.compiles * args.compile_seconds,
        "every host compiles (leases off)",
        plain.compiles * args.compile_seconds,
        "s",
        better="lower",
    )
    record(
        "herd",
        f"go to the last of {args.clients} hosts holding the NEFF",
        max(r["done"] for r in leases.results) - leases.go,
        "every host compiles (leases off)",
        max(r["done"] for r in plain.results) - plain.go,
        "s",
        better="lower",
        note="on 2 cores the peer's compiles are stand-in sleeps, so they overlap for free",
    )
    assert killed.killed_at is not None
    print(
        f"holder killed {killed.killed_at - killed.go:.2f} s after the go (lease TTL {args.ttl} s):"
    )
    _report("neffcache", killed, args.compile_seconds)
    for start in killed.compile_starts[1:]:
        print(f"    next compile started {start - killed.killed_at:.2f} s after the kill")


if __name__ == "__main__":
    main()
