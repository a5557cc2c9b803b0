"""What the benchmarks need beyond the test suite, said once and checked first.

The keying and client benchmarks trace real programs with JAX (``pip install -e
'.[dev,bench]'``): neffcache keys only inputs it can read, so any stand-in for a
traced module would be refused or keyed differently, and measure something else.
nginx and curl (the serving peers) and wrk (the load generator that fits on one core
beside the server's: a Python client there would be the bottleneck) are named by the
scripts that use them.
"""

from __future__ import annotations

import importlib.util
import sys

INSTALL = "pip install -e '.[dev,bench]'"
NEEDS = (
    "the benchmarks need JAX to trace the real programs they key and serve "
    f"(`{INSTALL}`), nginx and curl for the serving peers, wrk (Debian's package) to load "
    "the servers from one core, and redis-server for the replicas' benchmarks"
)


def require_jax(script: str) -> None:
    """Stop ``script`` with one line, its first, when JAX is not installed."""
    if importlib.util.find_spec("jax") is None:
        sys.exit(f"{script}: needs JAX to trace real programs: {INSTALL} (no fallback input)")
