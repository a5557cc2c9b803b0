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
   download instead of doing its own (``Remote.fetch`` verifies, then renames). Not
   for a graph the run named by stock address alone (the hook's lines): the hook
   never reads the blob store, so its files go straight into the stock entry (4.);
3. records the manifest in L1 under its canonical and direct keys, and under every
   key and direct key of the graph's lines linked to those (``names``): what the
   wrapper looks up, for this run's trace too when the server's entry came from
   another trace of the same program;
4. when the manifest was compiled under this environment, writes the stock entry the
   hook serves at every address of those lines, at the address it was found by and
   at the manifest's own (not for a graph named by address alone: another trace's
   address would cost a second download), under the per-entry lock the hook takes,
   with ``proxy.write_entry`` (every file verified, ``model.done`` last); an entry
   whose ``model.done`` exists is left alone.

Lines are linked through keys only. A key covers the compile-affecting environment
and an address does not, so two lines that share only an address may name two
compiles (another ``XLA_FLAGS``): neither's manifest is recorded under the other's key.

The server is never skipped on a timer and no host-wide "down" mark is read or
written (``PrewarmRemote``): a job's back-off lets its graphs compile meanwhile, while
prewarm has nothing to do but ask, and the job that follows must not skip the server
because prewarm met a hiccup. Its first request, made by the first graph not whole in
L1, asks whether the server can answer (``GET /readyz``); when it cannot, prewarm stops
and raises ``Unanswered``. A graph that fails is tried once more; after ``GIVE_UP``
graphs in a row have failed the rest count as failed without being tried.
Ctrl-C (``KeyboardInterrupt``) stops the threads, cuts their downloads (each removes
its temporary file), waits for them up to ``STOP_WAIT`` seconds and raises
``Interrupted`` with the counts so far. Temporary download files more than an hour
old, which only a killed process leaves, are removed when prewarm starts.

Every file is written under a temporary name and renamed, so a job may start while
prewarm runs. Nothing here writes run-manifest lines or publishes. A graph ends as
``in_l1`` (nothing to do), ``fetched``, ``missing`` (not on the server: the job will
compile it) or ``failed`` (server trouble, bytes that do not match their digest, an L1
that cannot be written).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from neffcache.client._log import log
from neffcache.client.config import ClientConfig
from neffcache.client.http import Connection, HttpError, error_detail
from neffcache.client.l1limit import entry_lock_name, grew
from neffcache.client.local import LocalStore, atomic_write
from neffcache.client.manifests import BadManifest, Manifest, check, is_digest
from neffcache.client.proxy import DONE, NEFF, same_environment, write_entry
from neffcache.client.remote import Remote
from neffcache.client.stats import STATS
from neffcache.keying import KeyingError, parse_neuron_address
from neffcache.protocol.counters import ClientCounter

# Which run-manifest fields name a graph, in the order they are looked up: the
# canonical key (the most general), the direct key, the stock address.
ID_FIELDS = ("key", "direct_key", "neuron_address")
KEY_FIELDS = ID_FIELDS[:2]
# Counters Remote raises when an answer of None was trouble rather than a miss.
_TROUBLE = ("server_errors", "server_skipped", "auth_errors")
STATUSES = ("in_l1", "fetched", "missing", "failed")
RETRY_PAUSE = 1.0  # seconds before a failed graph's second try
GIVE_UP = 5  # graphs failed in a row (each tried twice) before the rest are not tried
STOP_WAIT = 10.0  # seconds an interrupted prewarm waits for its threads
STALE_TEMP = 3600.0  # seconds after which a download's temporary file is a dead one's
# Where Remote.fetch leaves its temporary files: L1's blob store and stock entries.
_TEMPS = (".neffcache/blobs/*/.fetch-*", "neuronxcc-*/*/.fetch-*")

Ident = tuple[str, str]  # (field, value), a field of ID_FIELDS


class Graph(NamedTuple):
    """One graph of a run: every identifier its run-manifest lines named."""

    ids: tuple[Ident, ...]  # in ID_FIELDS order, then first appearance
    lines: tuple[tuple[Ident, ...], ...] = ()  # each distinct line's identifiers

    @property
    def by_address_only(self) -> bool:
        """Named by stock addresses alone: the hook's lines, whose next run looks
        nowhere but in the stock entries."""
        return all(field == "neuron_address" for field, _ in self.ids)


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
    # Ctrl-C stopped the run: the counts are of the graphs finished by then, so they
    # add up to fewer than ``graphs``.
    interrupted: bool = False

    def line(self) -> str:
        return (
            f"{self.graphs} graphs ({self.lines} lines, {self.malformed} malformed): "
            f"{self.in_l1} already in L1, {self.fetched} fetched, "
            f"{self.missing} missing on the server, {self.failed} failed; "
            f"{size_text(self.bytes)} in {self.seconds:.1f} s"
        )

    def as_json(self) -> dict[str, Any]:
        return {**self._asdict(), "seconds": round(self.seconds, 3)}


class Unanswered(Exception):
    """The server could not answer prewarm's first request (not reached, a timeout, its
    stores down); the message is one line. Raised by ``prewarm`` once its threads have
    stopped: every graph would have failed for the same reason, each with a warning."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, raised again by ``prewarm`` once its threads have stopped, with the
    summary of what was done by then."""

    def __init__(self, summary: Summary) -> None:
        super().__init__()
        self.summary = summary


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
    return record_ids(record)


def record_ids(record: object) -> list[Ident] | None:
    """``line_ids`` of a line already parsed."""
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
        return is_digest(value)
    try:
        parse_neuron_address(value)
    except KeyingError:
        return False
    return True


def group(named: Iterable[list[Ident]]) -> list[Graph]:
    """Lines that share any identifier are one graph (union-find), in the order of
    their first appearance."""
    parent: dict[Ident, Ident] = {}
    each = [tuple(ids) for ids in named]

    def root(node: Ident) -> Ident:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for ids in each:
        for node in ids:
            parent.setdefault(node, node)
        for node in ids[1:]:
            parent[root(node)] = root(ids[0])
    members: dict[Ident, list[Ident]] = {}
    for node in parent:
        members.setdefault(root(node), []).append(node)
    lines: dict[Ident, dict[tuple[Ident, ...], None]] = {top: {} for top in members}
    for ids in each:
        lines[root(ids[0])][ids] = None
    return [
        Graph(tuple(sorted(nodes, key=lambda n: ID_FIELDS.index(n[0]))), tuple(lines[top]))
        for top, nodes in members.items()
    ]


def names(graph: Graph, manifest: Manifest, found: Ident) -> tuple[list[str], list[str]]:
    """The keys and stock addresses under which ``manifest`` (found by ``found``)
    serves ``graph``: its own key and direct key, then those of every line that names
    one of these keys (transitively), with those lines' addresses, the address it was
    found by and its own (but for a graph named by address alone; see the module
    docstring). Never through an address: it does not cover the environment."""
    by_address = graph.by_address_only
    keys: dict[str, None] = {}
    addresses: dict[str, None] = {}
    for f in ID_FIELDS:
        v = manifest.get(f)
        if isinstance(v, str) and valid_id(f, v) and (f in KEY_FIELDS or not by_address):
            (keys if f in KEY_FIELDS else addresses)[v] = None
    field, value = found
    if field in KEY_FIELDS:
        keys[value] = None
    else:
        addresses[value] = None
    linked: set[tuple[Ident, ...]] = set()
    while True:
        new = [
            line
            for line in graph.lines
            if line not in linked and any(f in KEY_FIELDS and v in keys for f, v in line)
        ]
        if not new:
            break
        linked.update(new)
        for line in new:
            for f, v in line:
                (keys if f in KEY_FIELDS else addresses)[v] = None
    return list(keys), list(addresses)


# -- the server, as prewarm uses it ------------------------------------------------------


class PrewarmRemote(Remote):
    """``Remote`` as prewarm needs it. Never skipped after an error: no back-off and
    no host-wide down mark, neither written nor obeyed (prewarm retries and gives up
    by itself; see the module docstring). After ``stop`` is set every call returns at
    once as trouble, and ``abort`` cuts the transfers under way, from any thread. The
    bytes each thread downloaded are counted (``downloaded``)."""

    def __init__(self, config: ClientConfig, stop: threading.Event) -> None:
        super().__init__(config)
        self.stop = stop
        self._connections: set[Connection] = set()
        # Redirects' connections live for one request: held weakly, so they do not pile up.
        self._redirects: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._connections_lock = threading.Lock()
        self._counts = threading.local()
        self._asked_lock = threading.Lock()
        self._asked = False
        self.unanswered: str | None = None

    def available(self, scope: str | None = None) -> bool:
        """False once ``stop`` is set. The first call asks the server whether it can
        answer (the others wait for that); when it cannot, ``unanswered`` says why and
        ``stop`` is set. Graphs found whole in L1 never ask: a prewarm with nothing to
        fetch needs no server."""
        if self.stop.is_set():
            return False
        with self._asked_lock:
            if not self._asked:
                self._asked = True
                self.unanswered = self._readyz()
                if self.unanswered is not None:
                    self.stop.set()
        return self.unanswered is None

    def _readyz(self) -> str | None:
        """Why ``GET /readyz`` got no answer (a 5xx: a store is down), or None. On this
        thread's connection, which ``abort`` cuts."""
        server = self.config.server
        try:
            answer = self._api().get("/readyz")
        except HttpError as exc:
            return f"cannot reach {server}: {exc}"
        if answer.status >= 500:
            return f"{server} answered {answer.status}: {error_detail(answer.body)}"
        return None

    def _mark_down(self, what: str, reason: object, scope: str | None = None) -> None:
        STATS.count(ClientCounter.SERVER_ERRORS)
        if not self.stop.is_set():  # a cut transfer is no news
            log.warning("neffcache: %s failed (%s)", what, reason)

    def _back_off(self, name: str, cause: str | None = None) -> bool:
        return True  # a refused token is said once, and no back-off is marked

    def _connection(self) -> Connection:
        conn = super()._connection()
        with self._connections_lock:
            self._connections.add(conn)
        return conn

    def _redirect_connection(self, origin: str) -> Connection:
        conn = super()._redirect_connection(origin)
        with self._connections_lock:
            self._redirects.add(conn)
        return conn

    def abort(self) -> None:
        """Shut down every connection's socket (redirected downloads' too): a thread
        blocked reading gets the end of the stream at once, so its download fails and
        ``Remote.fetch`` removes its temporary file. (Closing the socket would not
        wake the reader.)"""
        with self._connections_lock:
            connections = [*self._connections, *self._redirects]
        for conn in connections:
            sock = conn._sock  # Connection has no abort of its own
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def fetch(self, digest: str, size: int, dest: Path) -> bool:
        fetched = super().fetch(digest, size, dest)
        if fetched:
            self._counts.bytes = self.downloaded() + size
        return fetched

    def downloaded(self) -> int:
        """Bytes this thread has downloaded so far."""
        count: int = getattr(self._counts, "bytes", 0)
        return count


# -- one graph ---------------------------------------------------------------------------


class Prewarmer:
    """Puts graphs into L1; ``warm`` is safe to call from many threads at once."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.root = Path(config.local_dir)
        self.local = LocalStore(config.local_dir)
        self.stop = threading.Event()
        self.remote = PrewarmRemote(config, self.stop)

    def warm(self, graph: Graph) -> Outcome:
        """The graph, tried once more after a pause when it failed (a server hiccup,
        a cut transfer), unless prewarm is stopping."""
        outcome = self.attempt(graph)
        if outcome.status == "failed" and not self.stop.wait(RETRY_PAUSE):
            again = self.attempt(graph)
            outcome = Outcome(again.status, outcome.bytes + again.bytes)
        return outcome

    def attempt(self, graph: Graph) -> Outcome:
        if self.stop.is_set():
            return Outcome("failed", 0)
        start = self.remote.downloaded()
        try:
            status = self.graph(graph)
        except Exception as exc:  # one graph's trouble is not the others'
            log.warning("neffcache: prewarming %s failed: %s", graph.ids[0][1], exc)
            status = "failed"
        return Outcome(status, self.remote.downloaded() - start)

    def graph(self, graph: Graph) -> str:
        """Every identifier of the graph not already covered by a manifest found for
        another one is looked up; the worst status wins (failed, fetched, in L1,
        missing)."""
        covered: set[str] = set()
        statuses: list[str] = []
        for field, value in graph.ids:
            if value in covered:
                continue
            status, served = self._one(graph, field, value)
            statuses.append(status)
            covered.add(value)
            covered.update(served)
        return worst(statuses)

    def _one(self, graph: Graph, field: str, value: str) -> tuple[str, list[str]]:
        """The status of one identifier and the names its manifest now serves."""
        if field == "neuron_address":
            if (self.root / value / DONE).exists():
                return "in_l1", []  # the hook serves it as it is
        else:
            local = self.local.manifest(value)
            if local is not None and blob_refs(local) is not None:
                return self._complete(graph, local, (field, value))
        before = trouble()
        if field == "key":
            manifest = self.remote.entry(value)
        elif field == "direct_key":
            manifest = self.remote.alias(value)
        else:
            manifest = same_environment(self.remote.alias(value))
        if manifest is None:
            failed = trouble() > before or not self.remote.available()
            return "failed" if failed else "missing", []
        return self._complete(graph, manifest, (field, value))

    def _complete(self, graph: Graph, manifest: Manifest, found: Ident) -> tuple[str, list[str]]:
        """Blobs, then the manifest by key, then the stock entries; ``in_l1`` when all
        of it was there already."""
        refs = blob_refs(manifest)
        if refs is None:
            log.warning("neffcache: the manifest of %s is unusable", manifest.get("key"))
            return "failed", []
        keys, addresses = names(graph, manifest, found)
        fetched = False
        if not graph.by_address_only:
            for digest, size in refs:
                source = self.remote.fetch_into(self.local, digest, size)
                if source is None:
                    return "failed", []
                fetched = fetched or source == "server"
        remembered = self._remember(keys, manifest)
        if remembered is None:
            return "failed", []
        written = False
        if addresses and same_environment(manifest) is not None:
            for address in addresses:
                wrote = self._stock_entry(address, manifest)
                if wrote is None:
                    return "failed", []
                written = written or wrote
        status = "fetched" if fetched or remembered or written else "in_l1"
        return status, keys + addresses

    def _remember(self, keys: list[str], manifest: Manifest) -> bool | None:
        """The manifest in L1 under ``keys``, where the wrapper looks; True when
        written, False when there already, None when it could not be."""
        wrote = False
        for key in keys:
            if self.local.manifest(key) == manifest:
                continue
            if not self.local.put_manifest(key, manifest):
                return None
            wrote = True
        return wrote

    def _stock_entry(self, address: str, manifest: Manifest) -> bool | None:
        """Write ``<L1>/<address>/`` for the hook (the caller checked the manifest's
        environment, which the address does not cover: docs/neuron-sdk.md#stock-address);
        True when written, False when present, None on failure. Files L1's blob store
        lacks are fetched straight into the entry."""
        entry = self.root / address
        with self.local.lock(entry_lock_name(address), f"entry {address}"):
            if (entry / DONE).exists():
                return False  # a rank (or the SDK) made it meanwhile
            try:
                written = write_entry(self.local, self.remote, entry, manifest, _mark_done)
            except OSError as exc:
                STATS.count(ClientCounter.LOCAL_ERRORS)
                log.warning("neffcache: cannot write %s: %s", entry, exc)
                return None
        return True if written else None


def _mark_done(done: Path) -> None:
    atomic_write(done, b"")  # atomically: the hook may be looking for it


def blob_refs(manifest: Manifest) -> list[tuple[str, int]] | None:
    """The distinct (digest, size) of the manifest's files, or None when it names no
    NEFF or is malformed (manifests.check)."""
    try:
        files = check(manifest)["files"]
    except BadManifest:
        return None
    if NEFF not in files:
        return None
    return sorted({ref["digest"]: ref["size"] for ref in files.values()}.items())


def worst(statuses: list[str]) -> str:
    for status in ("failed", "fetched", "in_l1"):
        if status in statuses:
            return status
    return "missing"


def trouble() -> int:
    """How often Remote met trouble so far in this process. A None that comes with a
    rise is counted as a failure, not a miss; the count is process-wide, so a miss
    that coincides with another thread's trouble counts as failed too (its second try
    then finds it missing)."""
    counts = STATS.snapshot()
    return sum(counts.get(name, 0) for name in _TROUBLE)


def remove_temps(root: Path, older_than: float = STALE_TEMP) -> int:
    """Remove the download temporaries (``.fetch-*``) in L1's blob store and stock
    entries last written more than ``older_than`` seconds ago: a live download writes
    its file at least every ``NEFFCACHE_TIMEOUT``, so only a killed process leaves
    one that old. How many were removed."""
    now = time.time()
    removed = 0
    for pattern in _TEMPS:
        for path in root.glob(pattern):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > older_than:
                    path.unlink()
                    removed += 1
    return removed


# -- all graphs --------------------------------------------------------------------------


def prewarm(
    config: ClientConfig,
    run: RunManifest,
    parallel: int,
    progress: TextIO | None = None,
) -> Summary:
    """Put every graph of ``run`` into L1 on ``parallel`` threads; ``progress`` gets a
    progress bar when it is a terminal. A KeyboardInterrupt is raised again, as
    ``Interrupted`` with the summary so far, once the threads have stopped (or
    ``STOP_WAIT`` has passed); ``Unanswered`` when the server could not answer."""
    start = time.monotonic()
    worker = Prewarmer(config)
    removed = remove_temps(worker.root)
    if removed:
        log.info("neffcache: removed %d temporary files left by killed downloads", removed)
    todo: queue.SimpleQueue[Graph | None] = queue.SimpleQueue()
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    for graph in run.graphs:
        todo.put(graph)
    # Daemons: a thread still stuck at STOP_WAIT (in a lock wait, say) does not keep
    # an interrupted prewarm from exiting.
    threads = [
        threading.Thread(target=_work, args=(worker, todo, done), daemon=True)
        for _ in range(min(parallel, len(run.graphs)))
    ]
    counts = dict.fromkeys(STATUSES, 0)
    fetched = in_a_row = 0
    bar = Progress(progress, len(run.graphs), start)
    try:
        for thread in threads:
            todo.put(None)
            thread.start()
        for finished in range(len(run.graphs)):
            outcome = None
            while outcome is None:
                bar.show(finished, fetched)
                with contextlib.suppress(queue.Empty):
                    outcome = done.get(timeout=0.1)
            counts[outcome.status] += 1
            fetched += outcome.bytes
            in_a_row = in_a_row + 1 if outcome.status == "failed" else 0
            if in_a_row == GIVE_UP and not worker.stop.is_set():
                log.warning(
                    "neffcache: %d graphs in a row could not be fetched; "
                    "prewarm gives up (the rest count as failed)",
                    in_a_row,
                )
                worker.stop.set()
    except KeyboardInterrupt:
        bar.close()
        stop_threads(worker, threads)
        raise Interrupted(_summary(run, counts, fetched, start, interrupted=True)) from None
    finally:
        bar.close()  # an interrupt, too, leaves the terminal's line clean
    if worker.remote.unanswered is not None:
        raise Unanswered(worker.remote.unanswered)
    grew(config)  # after the downloads: young files are never evicted, older ones may be
    return _summary(run, counts, fetched, start)


def _summary(
    run: RunManifest, counts: dict[str, int], fetched: int, start: float, interrupted: bool = False
) -> Summary:
    return Summary(
        lines=run.lines,
        malformed=run.malformed,
        graphs=len(run.graphs),
        in_l1=counts["in_l1"],
        fetched=counts["fetched"],
        missing=counts["missing"],
        failed=counts["failed"],
        bytes=fetched,
        seconds=time.monotonic() - start,
        interrupted=interrupted,
    )


def stop_threads(worker: Prewarmer, threads: list[threading.Thread]) -> None:
    """No new request, every transfer cut (``Remote.fetch`` removes its temporary
    file), and the threads waited for, at most ``STOP_WAIT`` seconds. The transfers
    are cut again while waiting: a thread may have opened a connection meanwhile."""
    worker.stop.set()
    deadline = time.monotonic() + STOP_WAIT
    while True:
        worker.remote.abort()
        alive = [thread for thread in threads if thread.is_alive()]
        if not alive or time.monotonic() >= deadline:
            break
        alive[0].join(timeout=0.1)
    if alive:
        log.warning("neffcache: %d prewarm threads did not stop in time", len(alive))


def _work(
    worker: Prewarmer, todo: queue.SimpleQueue[Graph | None], done: queue.SimpleQueue[Outcome]
) -> None:
    """Once ``worker.stop`` is set, every graph left is reported failed untried."""
    try:
        while (graph := todo.get()) is not None:
            done.put(worker.warm(graph))
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
