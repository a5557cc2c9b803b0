"""The host's counters of graph outcomes, kept in L1 for ``neffcache stats``.

``stats.py`` counts per process and dies with it (the wrapper is a process per graph);
these counters outlive processes and add up every rank of the host. Each graph a
process resolves appends one record to ``.neffcache/stats/log``, in the one place that
writes its run-manifest line and telemetry event (``runlog.graph``), so the counters
agree with the run manifest: the hook's line for a graph the wrapper resolved (which
has no event) is not counted, the wrapper's is.

Why an append-only log and not a file of counters: a counter file must be read,
changed and written back under a lock that every rank of the host takes on every
graph, and a rank killed while holding it, or a torn write, loses every count. An
append is one ``write`` on a file opened ``O_APPEND``, which the kernel makes atomic
against other appends to a local file (the run manifest relies on the same), so
concurrent ranks need no lock among themselves and a killed rank loses at most its
own record. A record is a line of about 35 bytes; ``hosttally.py`` folds the log into
``summary.json`` once it passes ``FOLD_AT`` (and whenever ``neffcache stats`` runs),
which bounds its size.

A record (version 1; the kinds are persisted ids, never renamed)::

    1 <kind> <reason> <fetch seconds> <seconds> <bytes>\\n

``kind``: ``l1`` or ``server`` (a hit, by where the NEFF's bytes came from),
``compiled`` (a miss the compiler ran for), ``failed`` (its compile failed),
``replayed`` (a miss that did not compile here: a rank replaying the failure of the
compile it waited for); ``reason``: a miss's reason code (reasons.py), ``-`` for a hit;
``seconds``: a hit's ``saved_seconds`` (the served entry's compile time), a miss's
``compile_seconds``, 0 when unknown; ``bytes``: the NEFF's size.

Folding and appending meet through ``flock``: an appender holds a shared lock on the
log while it writes (never waiting: a log it cannot lock is being folded and has been
renamed away, so it opens the path again); the folder renames the log away, then
takes an exclusive lock on it, which waits out the appenders that opened it before
the rename. An appender that finds its file unlinked (folded meanwhile) opens the path
again. Nothing here raises: a record that cannot be written (a read-only or full L1)
is counted in this process (``host_stats_errors``) and dropped.
"""

from __future__ import annotations

import fcntl
import math
import os
from collections.abc import Mapping
from typing import Any

from neffcache.client.hostlog import (
    CAP,
    LOG,
    MAX_BYTES,
    MAX_SECONDS,
    VERSION,
    is_code,
    stats_dir,
)
from neffcache.client.l1access import refuse_if_read_only
from neffcache.client.stats import STATS
from neffcache.protocol.counters import ClientCounter

# A log this long is folded by the process that made it so: about 900 records, folded
# in about 3 ms, once per 900 graphs of the host (a longer log costs the one graph
# that folds it proportionally more: 25 ms at 256 KiB).
FOLD_AT = 32 << 10
_MISS_KINDS = {"ok": "compiled", "failed": "failed"}


def count(local_dir: str, fields: Mapping[str, Any]) -> None:
    """Add one graph's outcome (a run-manifest line's fields) to L1's counters."""
    try:
        refuse_if_read_only(local_dir)  # a declared read-only L1, as an unwritable one
        record = encode(fields)
        size = 0 if record is None else append(stats_dir(local_dir), record)
    except Exception:  # OSError, or a bug: the counters' trouble is never the job's
        STATS.count(ClientCounter.HOST_STATS_ERRORS)
        return
    if size >= FOLD_AT:
        from neffcache.client.hosttally import fold_quietly

        fold_quietly(local_dir)


def encode(fields: Mapping[str, Any]) -> bytes | None:
    """The record of a run-manifest line's fields; None for a line that is no graph's
    outcome."""
    result = fields.get("result")
    if result == "hit":
        kind = fields.get("source")
        if kind not in ("l1", "server"):
            return None
        reason, seconds = "-", fields.get("saved_seconds")
    elif result == "miss":
        kind = _MISS_KINDS.get(fields.get("outcome") or "", "replayed")
        given = fields.get("reason")
        reason = given if isinstance(given, str) and is_code(given) else "unknown"
        seconds = fields.get("compile_seconds")
    else:
        return None
    fetch = _figure(fields.get("fetch_seconds"), MAX_SECONDS)
    size = fields.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < MAX_BYTES:
        size = 0
    figure = _figure(seconds, MAX_SECONDS)
    return f"{VERSION} {kind} {reason} {fetch:.6f} {figure:.3f} {size}\n".encode()


def _figure(value: Any, bound: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return 0.0
    return float(value) if math.isfinite(value) and 0 <= value < bound else 0.0


def append(directory: str, record: bytes) -> int:
    """Append ``record`` to the log in ``directory`` with one ``write``; the log's size
    after it. OSError when it cannot (see the module docstring for the lock)."""
    path = os.path.join(directory, LOG)
    for _attempt in range(4):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being folded: renamed away, the path is a new log by now
            status = os.fstat(fd)
            if status.st_nlink == 0:
                continue  # folded and removed since we opened it
            if status.st_size >= CAP:
                raise OSError(f"{path} is over {CAP} bytes: it is not being folded")
            if os.write(fd, record) != len(record):
                raise OSError(f"a short write to {path}")  # a full disk: the line is skipped
            return status.st_size + len(record)
        finally:
            os.close(fd)  # releases the lock
    raise OSError(f"{path} kept moving")
