"""Prewarm: put every graph a previous run used into L1 before a job starts.

``neffcache prewarm --manifest RUN_MANIFEST`` reads a run manifest (``runlog.py``),
groups its lines into graphs (lines that share a canonical key, direct key or stock
address are one graph) and, on ``parallel`` threads (each with its own connection, as
``Remote`` keeps one per thread), for every graph:

1. finds its manifest: in L1 by canonical or direct key, else on the server by
   canonical key (``entry``), direct key or stock address (``alias``). An entry found
   by address counts only when it was compiled under this process's environment, as
   for the hook (``proxy.same_environment``);
2. fetches every blob the manifest names that L1 lacks into L1's blob store, under
   the per-blob lock the wrapper takes, so a rank starting meanwhile waits for this
   download instead of doing its own (``Remote.fetch`` verifies, then renames);
3. records the manifest in L1 under its canonical and direct keys: what the compiler
   wrapper looks up;
4. when the manifest has a stock address and was compiled under this environment,
   writes the stock entry the hook serves, under the per-entry lock the hook takes,
   with ``proxy.write_entry`` (every file verified, ``model.done`` last);
   an entry whose ``model.done`` exists is left alone.

Nothing is ever half written, so a job may start while prewarm runs. Nothing here
writes run-manifest lines or publishes. A graph ends as ``in_l1`` (nothing to do),
``fetched``, ``missing`` (not on the server: the job will compile it) or ``failed``
(server trouble, bytes that do not match their digest, an L1 that cannot be written).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from neffcache.client._log import log
from neffcache.client.config import ClientConfig
from neffcache.client.local import LocalStore, atomic_write
from neffcache.client.proxy import DONE, NEFF, entry_lock_name, same_environment, write_entry
from neffcache.client.remote import Manifest, Remote
from neffcache.client.stats import STATS
from neffcache.keying import KeyingError, parse_neuron_address

HEX64 = re.compile(r"[0-9a-f]{64}")
# Which run-manifest fields name a graph, in the order they are looked up: the
# canonical key (the most general), the direct key, the stock address.
ID_FIELDS = ("key", "direct_key", "neuron_address")
# Counters Remote raises when an answer of None was trouble rather than a miss.
_TROUBLE = ("server_errors", "server_skipped", "auth_errors")
STATUSES = ("in_l1", "fetched", "missing", "failed")

Ident = tuple[str, str]  # (field, value), a field of ID_FIELDS


class Graph(NamedTuple):
    """One graph of a run: every identifier its run-manifest lines named."""

    ids: tuple[Ident, ...]  # in ID_FIELDS order, then first appearance


class RunManifest(NamedTuple):
    graphs: list[Graph]
    lines: int  # non-blank lines
    malformed: int  # not a JSON object naming a graph by valid identifiers


class Outcome(NamedTuple):
    status: str  # one of STATUSES
    bytes: int  # downloaded by this process


class Summary(NamedTuple):
    lines: int
    malformed: int
    graphs: int
    in_l1: int
    fetched: int
    missing: int
    failed: int
    bytes: int
    seconds: float

    def line(self) -> str:
        return (
            f"{self.graphs} graphs ({self.lines} lines, {self.malformed} malformed): "
            f"{self.in_l1} already in L1, {self.fetched} fetched, "
            f"{self.missing} missing on the server, {self.failed} failed; "
            f"{size_text(self.bytes)} in {self.seconds:.1f} s"
        )

    def as_json(self) -> dict[str, Any]:
        return {**self._asdict(), "seconds": round(self.seconds, 3)}


# -- the run manifest --------------------------------------------------------------------


def read_run_manifest(path: str | Path) -> RunManifest:
    """The graphs named in a run manifest; blank lines are skipped, malformed ones
    counted. Raises OSError when the file cannot be read."""
    lines = malformed = 0
    named: list[list[Ident]] = []
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            lines += 1
            ids = line_ids(raw)
            if ids is None:
                malformed += 1
            elif ids:
                named.append(ids)
    return RunManifest(group(named), lines, malformed)


def line_ids(raw: bytes) -> list[Ident] | None:
    """The identifiers one line names ([] when all are null, as for a graph the
    wrapper could not key), or None when the line is not a run-manifest line."""
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(record, dict) or not any(f in record for f in ID_FIELDS):
        return None
    ids: list[Ident] = []
    for field in ID_FIELDS:
        value = record.get(field)
        if value is None:
            continue
        if not valid_id(field, value):
            return None
        ids.append((field, value))
    return ids


def valid_id(field: str, value: object) -> bool:
    """Checked before a value goes into a URL or, for an address, a path in L1."""
    if not isinstance(value, str):
        return False
    if field != "neuron_address":
        return HEX64.fullmatch(value) is not None
    try:
        parse_neuron_address(value)
    except KeyingError:
        return False
    return True


def group(named: Iterable[list[Ident]]) -> list[Graph]:
    """Lines that share any identifier are one graph (union-find), in the order of
    their first appearance."""
    parent: dict[Ident, Ident] = {}

    def root(node: Ident) -> Ident:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for ids in named:
        for node in ids:
            parent.setdefault(node, node)
        for node in ids[1:]:
            parent[root(node)] = root(ids[0])
    members: dict[Ident, list[Ident]] = {}
    for node in parent:
        members.setdefault(root(node), []).append(node)
    return [
        Graph(tuple(sorted(nodes, key=lambda n: ID_FIELDS.index(n[0]))))
        for nodes in members.values()
    ]


# -- one graph ---------------------------------------------------------------------------


class Prewarmer:
    """Puts graphs into L1; ``graph`` is safe to call from many threads at once."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.root = Path(config.local_dir)
        self.local = LocalStore(config.local_dir)
        self.remote = Remote(config)

    def graph(self, graph: Graph) -> Outcome:
        """Every identifier of the graph not already covered by a manifest found for
        another one is looked up; the worst outcome wins (failed, fetched, in L1,
        missing)."""
        covered: set[str] = set()
        outcomes: list[Outcome] = []
        for field, value in graph.ids:
            if value in covered:
                continue
            outcome, manifest = self._one(field, value)
            outcomes.append(outcome)
            covered.add(value)
            if manifest is not None:
                covered.update(v for f in ID_FIELDS if isinstance(v := manifest.get(f), str))
        return combine(outcomes)

    def _one(self, field: str, value: str) -> tuple[Outcome, Manifest | None]:
        if field == "neuron_address":
            if (self.root / value / DONE).exists():
                return Outcome("in_l1", 0), None  # the hook serves it as it is
            address: str | None = value
        else:
            address = None
            local = self.local.manifest(value)
            if local is not None and blob_refs(local) is not None:
                return self._complete(local, None), local
        before = trouble()
        if field == "key":
            manifest = self.remote.entry(value)
        elif field == "direct_key":
            manifest = self.remote.alias(value)
        else:
            manifest = same_environment(self.remote.alias(value))
        if manifest is None:
            failed = trouble() > before or not self.remote.available()
            return Outcome("failed" if failed else "missing", 0), None
        return self._complete(manifest, address), manifest

    def _complete(self, manifest: Manifest, address: str | None) -> Outcome:
        """Blobs, then the manifest by key, then the stock entry; ``in_l1`` when all
        of it was there already."""
        refs = blob_refs(manifest)
        if refs is None:
            log.warning("neffcache: the manifest of %s is unusable", manifest.get("key"))
            return Outcome("failed", 0)
        fetched = 0
        for digest, size in refs:
            got = self._blob(digest, size)
            if got is None:
                return Outcome("failed", fetched)
            fetched += got
        remembered = self._remember(manifest)
        if remembered is None:
            return Outcome("failed", fetched)
        address = address or manifest.get("neuron_address")
        written: bool | None = False
        if isinstance(address, str) and valid_id("neuron_address", address):
            written = self._stock_entry(address, manifest)
            if written is None:
                return Outcome("failed", fetched)
        wrote = fetched > 0 or remembered or written
        return Outcome("fetched" if wrote else "in_l1", fetched)

    def _blob(self, digest: str, size: int) -> int | None:
        """Bytes downloaded (0: L1 has it), None when it could not be had. One
        download per blob per host: the wrapper's ranks take the same lock."""
        source = self.remote.fetch_into(self.local, digest, size)
        return None if source is None else size if source == "server" else 0

    def _remember(self, manifest: Manifest) -> bool | None:
        """The manifest in L1 under its canonical and direct keys, where the wrapper
        looks; True when written, False when there already, None when it could not be."""
        wrote = False
        for field in ("key", "direct_key"):
            key = manifest.get(field)
            if not isinstance(key, str) or not HEX64.fullmatch(key):
                continue
            if self.local.manifest(key) == manifest:
                continue
            if not self.local.put_manifest(key, manifest):
                return None
            wrote = True
        return wrote

    def _stock_entry(self, address: str, manifest: Manifest) -> bool | None:
        """Write ``<L1>/<address>/`` for the hook; True when written, False when
        there was nothing to do (another environment's, or present), None on failure."""
        if same_environment(manifest) is None:
            return False  # the hook would not serve it here (facts §4.4)
        entry = self.root / address
        with self.local.lock(entry_lock_name(address), f"entry {address}"):
            if (entry / DONE).exists():
                return False  # a rank (or the SDK) made it meanwhile
            try:
                written = write_entry(self.local, self.remote, entry, manifest, _mark_done)
            except OSError as exc:
                STATS.count("local_errors")
                log.warning("neffcache: cannot write %s: %s", entry, exc)
                return None
        return True if written else None


def _mark_done(done: Path) -> None:
    atomic_write(done, b"")  # atomically: the hook may be looking for it


def blob_refs(manifest: Manifest) -> list[tuple[str, int]] | None:
    """The distinct (digest, size) of the manifest's files, or None when it names no
    NEFF or a reference that is not one."""
    files = manifest.get("files")
    if not isinstance(files, dict) or NEFF not in files:
        return None
    refs: dict[str, int] = {}
    for name, ref in files.items():
        if not isinstance(ref, dict) or not isinstance(name, str) or "/" in name:
            return None
        digest, size = ref.get("digest"), ref.get("size")
        if not isinstance(digest, str) or not HEX64.fullmatch(digest):
            return None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return None
        refs[digest] = size
    return sorted(refs.items())


def combine(outcomes: list[Outcome]) -> Outcome:
    total = sum(o.bytes for o in outcomes)
    for status in ("failed", "fetched", "in_l1"):
        if any(o.status == status for o in outcomes):
            return Outcome(status, total)
    return Outcome("missing", total)


def trouble() -> int:
    """How often Remote met trouble so far in this process. A None that comes with a
    rise is counted as a failure, not a miss; the count is process-wide, so a miss
    that coincides with another thread's trouble counts as failed too (the run
    fails either way)."""
    counts = STATS.snapshot()
    return sum(counts.get(name, 0) for name in _TROUBLE)


# -- all graphs --------------------------------------------------------------------------


def prewarm(
    config: ClientConfig,
    run: RunManifest,
    parallel: int,
    progress: TextIO | None = None,
) -> Summary:
    """Put every graph of ``run`` into L1 on ``parallel`` threads; ``progress`` gets a
    progress bar when it is a terminal."""
    start = time.monotonic()
    worker = Prewarmer(config)
    todo: queue.SimpleQueue[Graph | None] = queue.SimpleQueue()
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    for graph in run.graphs:
        todo.put(graph)
    threads = min(parallel, len(run.graphs))
    for _ in range(threads):
        todo.put(None)
        # Daemons: an interrupted prewarm exits at once; every write is atomic.
        threading.Thread(target=_work, args=(worker, todo, done), daemon=True).start()
    counts = dict.fromkeys(STATUSES, 0)
    fetched = 0
    bar = Progress(progress, len(run.graphs), start)
    try:
        for finished in range(len(run.graphs)):
            outcome = None
            while outcome is None:
                bar.show(finished, fetched)
                with contextlib.suppress(queue.Empty):
                    outcome = done.get(timeout=0.1)
            counts[outcome.status] += 1
            fetched += outcome.bytes
    finally:
        bar.close()  # an interrupt, too, leaves the terminal's line clean
    return Summary(
        lines=run.lines,
        malformed=run.malformed,
        graphs=len(run.graphs),
        bytes=fetched,
        seconds=time.monotonic() - start,
        **counts,
    )


def _work(
    worker: Prewarmer, todo: queue.SimpleQueue[Graph | None], done: queue.SimpleQueue[Outcome]
) -> None:
    try:
        while (graph := todo.get()) is not None:
            try:
                outcome = worker.graph(graph)
            except Exception as exc:  # one graph's trouble is not the others'
                log.warning("neffcache: prewarming %s failed: %s", graph.ids[0][1], exc)
                outcome = Outcome("failed", 0)
            done.put(outcome)
    finally:
        worker.remote.close()  # this thread's connection


class Progress:
    """A one-line bar on ``stream``, redrawn at most ten times a second, only when
    the stream is a terminal (a log file gets the summary alone). The client's
    warnings erase it first, so they do not run on from the bar's line."""

    WIDTH = 24

    def __init__(self, stream: TextIO | None, total: int, start: float) -> None:
        self.stream = stream if stream is not None and stream.isatty() else None
        self.total = total
        self.start = start
        self._drawn = 0.0
        self._length = 0
        if self.stream is not None:
            logging.getLogger("neffcache.client").addFilter(self._before_log)

    def show(self, done: int, fetched: int) -> None:
        now = time.monotonic()
        if self.stream is None or now - self._drawn < 0.1:
            return
        self._drawn = now
        filled = self.WIDTH * done // max(self.total, 1)
        text = (
            f"neffcache prewarm [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
            f"{done}/{self.total} graphs, {size_text(fetched)}, {now - self.start:.1f} s"
        )
        self.stream.write("\r" + text.ljust(self._length))
        self.stream.flush()
        self._length = len(text)

    def close(self) -> None:
        if self.stream is not None:
            logging.getLogger("neffcache.client").removeFilter(self._before_log)
            self._erase()

    def _erase(self) -> None:
        if self.stream is not None and self._length:
            self.stream.write("\r" + " " * self._length + "\r")
            self.stream.flush()
            self._length = 0

    def _before_log(self, record: logging.LogRecord) -> bool:
        self._erase()
        return True


def size_text(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, units = n / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:.1f} {units[0]}"
