"""The run manifest (``NEFFCACHE_RUN_MANIFEST=PATH``): one JSON object per line per graph.

Each line is written with one ``write`` on a file opened ``O_APPEND``, so the ranks of
a job (and the wrapper's processes) can share one file without interleaving lines.
Fields: ``time`` (UTC, ISO 8601), ``via`` (``wrapper`` or ``hook``), ``key``,
``direct_key``, ``neuron_address`` (each null when unknown), ``result`` (``hit`` or
``miss``), ``source`` (``l1``, ``server`` or ``compiler``), ``fetch_seconds``,
``compile_seconds`` (null on a hit), ``bytes`` (the NEFF's size, 0 when there is none),
``exit_code`` (the wrapper's), ``fallback`` (why the cache could not help, or null),
``pid``, ``host``, and ``events``: this process's counters so far (hits, compiles,
server errors, fall-backs; see ``stats.py``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from neffcache.client._log import log


def _utc_now() -> str:
    """ISO 8601 UTC with milliseconds (``datetime`` costs an import the wrapper skips)."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    return f"{stamp}.{int(now % 1 * 1000):03d}+00:00"


def record(path: str | None, **fields: Any) -> None:
    if not path:
        return
    from neffcache.client.stats import STATS

    line = {
        "time": _utc_now(),
        **fields,
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "events": STATS.snapshot(),
    }
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("neffcache: cannot write the run manifest %s: %s", path, exc)
