"""Headline figures of a benchmark, for ``run_all.py`` to gather into docs/benchmarks.md.

Each benchmark prints its full report as before, and calls :func:`record` once per
headline figure: a value measured in this run beside the value of its peer measured in
the same run. When ``NEFFCACHE_BENCH_RESULTS`` names a file (``run_all.py`` sets it),
each figure is appended to it as one JSON line; otherwise :func:`record` does nothing,
so a benchmark run by hand behaves as it always did.

The ratio is always ``value / peer_value``; ``better`` says which way is good, so the
page can say whether a figure beat its peer without guessing from the unit.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Literal

ENV = "NEFFCACHE_BENCH_RESULTS"


def record(
    benchmark: str,
    figure: str,
    value: float,
    peer: str,
    peer_value: float,
    unit: str,
    *,
    better: Literal["higher", "lower"],
    goal: str = "",
    note: str = "",
) -> None:
    """Append one figure (``value`` of neffcache, ``peer_value`` of ``peer``, both in
    ``unit``) to the results file, if one is set."""
    target = os.environ.get(ENV)
    if not target:
        return
    ratio = value / peer_value if peer_value else math.inf
    line = {
        "benchmark": benchmark,
        "figure": figure,
        "value": value,
        "peer": peer,
        "peer_value": peer_value,
        "unit": unit,
        "ratio": ratio if math.isfinite(ratio) else None,
        "better": better,
        "goal": goal,
        "note": note,
    }
    with Path(target).open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
