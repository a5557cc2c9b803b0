"""The run manifest (``NEFFCACHE_RUN_MANIFEST=PATH``): one JSON object per line per graph,
and the graph's telemetry event (telemetry.py), both made here from one dict, which
the host's counters in L1 (hoststats.py) count too.

Each line is written with one ``write`` on a file opened ``O_APPEND``, so the ranks of
a job (and the wrapper's processes) can share one file without interleaving lines.
Fields:

* ``time`` (UTC, ISO 8601), ``via`` (``wrapper`` or ``hook``), ``pid``, ``host``;
* ``key``, ``direct_key``, ``neuron_address``: each null when unknown;
* ``result`` (``hit``, ``miss`` or ``delegated``), ``source`` (``l1``, ``server``,
  ``compiler``, or ``wrapper`` on a ``delegated`` line);
* ``fetch_seconds``, ``compile_seconds`` (null on a hit; a failed compile's too),
  ``bytes`` (the NEFF's size, 0 when there is none);
* ``saved_seconds`` (hits: the compile time of the entry served, null when unknown);
* ``outcome`` (misses that compiled here: ``ok`` or ``failed``, else null);
* ``reason`` and ``reason_summary`` (misses: why, reasons.py; null on hits);
* ``explain_key`` (the hook's misses, when their key was computed): the key to give
  ``neffcache explain``; not ``key``, which prewarm would fetch by;
* ``compiler_version`` (null when unknown), ``exit_code`` (the wrapper's),
  ``fallback`` (why the cache could not help, or null);
* ``resolved_by`` (``delegated`` lines only): ``wrapper``;
* ``events``: this process's counters so far (hits, compiles, server errors,
  fall-backs; see ``stats.py``).

The graph event carries the same facts but ``time`` (as ``at``), ``exit_code``,
``events`` and ``reason_summary``, plus a miss's key components (``components``,
with the graph's summary when there is one), which the manifest leaves out.

A graph is one line, but when the hook's SDK compiled it through the wrapper's shim:
the shim resolved it (a hit, or the compile) and wrote the line that counts it, and
the hook's line for it says ``delegated`` (DELEGATED_FIELDS) and has no event; its
``compile_seconds``, ``bytes`` and ``outcome`` are the SDK's call through the shim.
Older clients wrote ``miss`` there; ``resolved_by`` is on both, so a reader that
skips the lines having it counts old and new files alike (docs/client.md's recipes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from neffcache.client import hoststats
from neffcache.client._log import log
from neffcache.client.config import ClientConfig

# What the hook's line for a graph the wrapper's shim resolved says in place of its own
# view (a miss and its compile): a result no reader can take for a miss, and no miss
# reason (the wrapper's line has it).
DELEGATED = "delegated"
DELEGATED_FIELDS: Mapping[str, Any] = {
    "result": DELEGATED,
    "source": "wrapper",
    "resolved_by": "wrapper",
    "reason": None,
    "reason_summary": None,
}

# Every line has these (the interception points add their own, as ``exit_code``).
_DEFAULTS: dict[str, Any] = {
    "via": None,
    "key": None,
    "direct_key": None,
    "neuron_address": None,
    "result": None,
    "source": None,
    "fetch_seconds": 0.0,
    "compile_seconds": None,
    "saved_seconds": None,
    "outcome": None,
    "reason": None,
    "reason_summary": None,
    "bytes": 0,
    "fallback": None,
    "compiler_version": None,
}


def _utc(now: float) -> str:
    """ISO 8601 UTC with milliseconds (``datetime`` costs an import the wrapper skips)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    return f"{stamp}.{int(now % 1 * 1000):03d}+00:00"


def graph(
    config: ClientConfig,
    components: Mapping[str, Any] | None = None,
    *,
    event: bool = True,
    also: Mapping[str, Any] | None = None,
    **fields: Any,
) -> None:
    """One graph resolved: its run-manifest line (when ``NEFFCACHE_RUN_MANIFEST`` is
    set) and its telemetry event (unless ``NEFFCACHE_TELEMETRY=0``, or ``event`` is
    false: the hook's line for a compile the wrapper's line already counts).
    ``components`` and ``also`` go into the event alone: the hook's miss lines name
    their graph by its stock address only (prewarm reads them so), while its event
    has the keys the explanation computed. A graph with an event (whether sent or
    not) is also added to the host's counters in L1 (hoststats.py), so that
    ``neffcache stats`` counts what the run manifest says."""
    if event:
        hoststats.count(config.local_dir, fields)
    if not config.run_manifest and not (config.telemetry and event):
        return
    now = time.time()
    line = _line(now, fields)
    _append(config.run_manifest, line)
    if config.telemetry and event:
        from neffcache.client import telemetry

        try:
            facts = {**line, **also} if also else line
            telemetry.send(config, telemetry.graph_event(config, facts, now, components))
        except Exception:  # telemetry's trouble is never the job's
            log.exception("neffcache: could not queue a telemetry event")


def record(path: str | None, **fields: Any) -> None:
    """A run-manifest line alone, no event (``fields`` as given, no defaults)."""
    if path:
        _append(path, _line(time.time(), fields, defaults={}))


def _line(
    now: float, fields: Mapping[str, Any], defaults: Mapping[str, Any] = _DEFAULTS
) -> dict[str, Any]:
    from neffcache.client.stats import STATS

    return {
        "time": _utc(now),
        **defaults,
        **fields,
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "events": STATS.snapshot(),
    }


def _append(path: str | None, line: Mapping[str, Any]) -> None:
    if not path:
        return
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("neffcache: cannot write the run manifest %s: %s", path, exc)


def saved_seconds(manifest: dict[str, Any] | None) -> float | None:
    """What a hit saved: the served entry's compile time, when its manifest says."""
    value = None if manifest is None else manifest.get("compile_seconds")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 7 * 86400:
        return float(value)
    return None
