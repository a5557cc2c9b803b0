"""SIGKILL the server during uploads, 36 times,
restarting it each time over the same data directory (filesystem blobs and a SQLite
index: the defaults).

Each round, three clients upload blobs (16 B to 4 MiB, a few already stored) and publish
entries naming them, concurrently, and the server is SIGKILLed at the round's point.
Each kind of point gets a fixed number of rounds (``SCHEDULE``), in a seeded order:

- ``trap``: at an exact step of a write, whatever the machine's load: just before or
  just after the link that puts a committed blob under its name (its staged file
  fsynced), and just before or just after the link that puts an entry's durable
  document under its name (its index row committed). The server kills itself there
  (``forkserver.py``'s ``trap``), at the first or second such step of the round;
- ``body``: while a large body is arriving, after a share of it was sent;
- ``commit``: just after a large body was sent whole (hashing, fsync, link);
- ``entry``: just after a publish was sent (manifest checks, the index write, its
  durable document);
- ``random``: at a time from the round's start; ``idle``: when all is quiet.

The timed kinds' parameter (the share sent, the delay) is stratified: round ``i`` of
``n`` of a kind draws it from the ``i``-th of ``n`` equal slices of its range, so every
slice is hit in every run; uniform draws (the 100 random rounds this suite once ran)
leave a slice of a fifth of a range unhit with probability 0.8^n. The exact steps of a
commit, which uniform draws hit only by luck, are the traps' job.

Then the next server starts over the same directory. Each server but the last is a
child of ``forkserver.py``, which runs the start-up ``neffcache serve`` runs
(``run_serve``: only the imports and the argument parser are shared); the last start,
which the final checks read through, is a cold ``neffcache serve``.

Nothing lost, checked after every start-up for the round before, and at the end for
all rounds:

- every acknowledged publish (``200``/``201``) reads back byte-identical (the same
  ``GET`` body as when it was first read: manifest, ``created_at``, ``writer``), and
  every blob it names is there with the bytes that were uploaded: each round reads its
  own entries and their blobs' sizes through the server (the bytes of every blob file
  are hashed on disk at each start-up) and two older entries with their blobs
  downloaded and hashed (BLAKE3); the end downloads everything;
- an acknowledged publish has its durable document (recovery/), holding that entry;
- every acknowledged upload is still there with its bytes;
- a publish the kill cut off (sent, not answered) is a miss (``404``) or, when the
  server committed it and died before answering, a complete entry whose blobs all
  verify, never a partial one; a publish never sent is a miss; an upload cut off is
  absent or exactly its bytes;
- no staging or temporary file survives start-up: the data directory holds the SQLite
  files, blob files in their fan-out directories, documents under final names, and one
  staging area (the new server's) with an empty ``uploads/``; nothing is quarantined;
  every blob file holds the bytes its name says;
- no server logged a traceback, and at the end SQLite's ``integrity_check`` is ``ok``.

A SIGKILL leaves the kernel's page cache alone, so this cannot tell a missing fsync
(a server that skips them passes); only a power loss or a VM crash can.

A failure names the seed; ``NEFFCACHE_SIGKILL_SEED=N`` replays its plans (where each
kill is aimed; thread timing still varies). ``NEFFCACHE_SIGKILL_ROUNDS`` shortens a run
while debugging (the checks that every kind landed then do not apply).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import blake3
import httpx
import pytest
from faults.support import digest, running_server
from loopback import free_port

from neffcache.server.recovery import documents

pytestmark = pytest.mark.e2e

SEED_VARIABLE = "NEFFCACHE_SIGKILL_SEED"
NAMESPACE = "sigkill"
CLIENTS = 3
MIB = 2**20
POOL_SIZE = 8 * MIB
NONCE = 16
SEND_CHUNK = 64 * 1024
FORKSERVER = Path(__file__).with_name("forkserver.py")
# Rounds per kind of kill point (the module's docstring). Eight traps: two rounds at
# each of the four steps; the timed kinds enough slices to cover their ranges finely.
SCHEDULE = {"trap": 8, "body": 8, "commit": 4, "entry": 8, "random": 6, "idle": 2}
FULL_RUN = sum(SCHEDULE.values())
ROUNDS = int(os.environ.get("NEFFCACHE_SIGKILL_ROUNDS", FULL_RUN))
# The trap points: where the linked file lands, and before or after the link.
TRAPS = [(where, when) for where in ("blobs", "documents") for when in ("before", "after")]
STAMPED = ("created_at", "namespace", "writer")  # set by the server, not the manifest

SQLITE_FILES = {"index.db", "index.db-wal", "index.db-shm", "index.db-journal"}
STORE_DIRS = {"blobs", "staging", "quarantine", "documents"}
DIGEST = re.compile(r"[0-9a-f]{64}")
FANOUT = re.compile(r"[0-9a-f]{2}")
# Names that only a write in progress gives a file (tempfile's, the store's prefixes).
TEMPORARY = re.compile(r"^\.|^tmp|^upload-|^document-|^check-|\.tmp$|\.partial$|~$")


# --- bytes


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    nonce: bytes
    offset: int


class Contents:
    """Blob contents from one random pool: a fresh 16-byte nonce, then a slice of the
    pool. Every blob is new bytes, and none has to be kept in memory."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pool = rng.randbytes(POOL_SIZE)

    def new(self, size: int) -> Blob:
        nonce = self.rng.randbytes(NONCE)
        offset = self.rng.randrange(POOL_SIZE - (size - NONCE) + 1)
        blob = Blob("", size, nonce, offset)
        return Blob(digest(self.data(blob)), size, nonce, offset)

    def data(self, blob: Blob) -> bytes:
        return blob.nonce + self.pool[blob.offset : blob.offset + blob.size - NONCE]


def random_size(rng: random.Random) -> int:
    pick = rng.random()
    if pick < 0.55:
        return int(NONCE * (48 * 1024 / NONCE) ** rng.random())  # 16 B to 48 KiB
    if pick < 0.85:
        return rng.randrange(48 * 1024, MIB)
    return rng.randrange(MIB, 4 * MIB)


@dataclass(frozen=True, eq=False)
class Publish:
    key: str
    files: dict[str, Blob]

    def manifest(self) -> dict[str, Any]:
        files = {name: {"digest": b.digest, "size": b.size} for name, b in self.files.items()}
        return {"key": self.key, "files": files}


# --- the launcher and the kill


def plain_http(base_url: str = "", timeout: float = 30) -> httpx.Client:
    """A client for plain HTTP on loopback. ``verify=False`` only skips loading the CA
    bundle (no TLS is spoken), which costs 20 ms of CPU per client: five clients a
    round, 100 rounds."""
    return httpx.Client(base_url=base_url, timeout=timeout, trust_env=False, verify=False)


@dataclass(frozen=True)
class TrapAt:
    """A kill at an exact step: ``before`` or ``after`` the ``nth`` link of a file into
    ``where`` (``blobs``: a committed blob; ``documents``: an entry's durable copy)."""

    where: str
    when: str
    nth: int


class Launcher:
    """``forkserver.py`` over its pipes: servers on one port over one data directory."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.log = log
        self.data_dir = data_dir
        self.armed = log.with_name("trap-armed")  # a trap counts while this file exists
        self.logged = 0  # the log's size when the latest server started
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
        serve = ["serve", "--data-dir", str(data_dir)]
        self.process = subprocess.Popen(
            [sys.executable, str(FORKSERVER), str(log), "--", *serve],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._read(timeout=180) == ["ready"], "the launcher did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _read(self, timeout: float = 60) -> list[str]:
        out = self.process.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        line = out.readline() if ready else ""
        assert line, f"the launcher stopped answering (exit {self.process.poll()})"
        return line.split()

    def _ask(self, command: str) -> list[str]:
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()
        return self._read()

    def start(self, trap: TrapAt | None = None) -> int:
        """A new server (with ``trap`` set, once ``arm`` is called); its pid once
        ``/healthz`` answers."""
        self.arm(False)
        for _ in range(3):
            logged = self.logged = self.log.stat().st_size if self.log.exists() else 0
            if trap is not None:
                assert self._ask(self._trap_command(trap)) == ["trap", "set"]
            pid = int(self._ask(f"start --port {self.port}")[1])
            with plain_http() as http:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    with contextlib.suppress(httpx.TransportError):
                        if http.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                            return pid
                    if self._ask(f"alive {pid}")[2] == "0":
                        break
                    time.sleep(0.005)
                else:
                    raise AssertionError(f"the server did not start in 60 s:\n{self._log(logged)}")
            said = self._log(logged)
            if "address already in use" not in said:
                raise AssertionError(f"the server exited at start-up:\n{said}")
            self.port = free_port()  # taken meanwhile by another process: another port
        raise AssertionError("no free port for the server in three tries")

    def _trap_command(self, trap: TrapAt) -> str:
        prefix = f"{self.data_dir}/{trap.where}/"
        if trap.where == "documents":
            prefix += documents.entry_name(NAMESPACE, "")  # entries, not other documents
        return f"trap {trap.when} {trap.nth} {self.armed} {prefix}"

    def arm(self, armed: bool) -> None:
        """Start (or stop) counting the trap's steps: after start-up, which must not."""
        if armed:
            self.armed.touch()
        else:
            self.armed.unlink(missing_ok=True)

    def trap_fired(self) -> bool:
        """Whether the latest server killed itself at its trap (it logs so first)."""
        return "trap: SIGKILL" in self._log(self.logged)

    def _log(self, since: int) -> str:
        with open(self.log, "rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")[-4000:]

    def reap(self, pid: int) -> int:
        return int(self._ask(f"reap {pid}")[2])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class Kill:
    """SIGKILL the server once, from whichever thread gets there first."""

    def __init__(self, pid: int, entry_target: int | None) -> None:
        self.pid = pid
        self.done = threading.Event()
        self.trigger = threading.Event()  # the round's kill point was reached
        self.entry_target = entry_target
        self._entries = 0
        self._lock = threading.Lock()

    def now(self) -> None:
        with self._lock:
            if not self.done.is_set():
                os.kill(self.pid, signal.SIGKILL)
                self.done.set()

    def publishing(self) -> None:
        """A client is about to send a publish."""
        with self._lock:
            number, self._entries = self._entries, self._entries + 1
        if number == self.entry_target:
            self.trigger.set()


# --- one round


@dataclass
class Plan:
    kind: str
    clients: list[list[Publish]]
    trigger_blob: Blob | None = None  # body/commit: the upload whose progress kills
    fraction: float = 1.0  # body: the share of it sent when the kill comes
    delay: float = 0.0  # commit/entry: seconds from the trigger to the kill; random: from start
    entry_target: int | None = None  # entry: which of the round's publishes (in sending order)
    trap: TrapAt | None = None  # trap: where the server kills itself


@dataclass
class Outcomes:
    blobs_acked: list[Blob] = field(default_factory=list)
    blobs_cut: list[Blob] = field(default_factory=list)
    published: list[Publish] = field(default_factory=list)
    cut: list[Publish] = field(default_factory=list)
    unsent: list[Publish] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


FILE_NAMES = ("model.neff", "model.hlo_module.pb", "compile_flags.json")


def schedule(rng: random.Random) -> list[tuple[str, int, int]]:
    """The rounds, in a seeded order: (kind, its round's number among the kind's, how
    many the kind has)."""
    rounds = [(kind, i, n) for kind, n in SCHEDULE.items() for i in range(n)]
    rng.shuffle(rounds)
    return rounds[:ROUNDS]


def stratified(rng: random.Random, low: float, high: float, i: int, n: int) -> float:
    """A draw from the ``i``-th of ``n`` equal slices of ``[low, high)``."""
    return low + (i + rng.random()) * (high - low) / n


def make_plan(
    rng: random.Random, contents: Contents, stored: list[Blob], slot: tuple[str, int, int]
) -> Plan:
    kind, i, n = slot
    clients: list[list[Publish]] = []
    for _ in range(CLIENTS):
        publishes = []
        for _ in range(rng.randint(1, 2)):
            files = {}
            for name in FILE_NAMES[: rng.randint(1, 3)]:
                # As many draws whatever was stored, so a seed replays the same plans.
                pick, reuse, size = rng.random(), rng.random() < 0.1, random_size(rng)
                if reuse and stored:  # already on the server: 200
                    files[name] = stored[int(pick * len(stored))]
                else:
                    files[name] = contents.new(size)
            publishes.append(Publish(rng.randbytes(32).hex(), files))
        clients.append(publishes)
    plan = Plan(kind, clients)
    if kind in ("body", "commit"):
        first = rng.choice(clients)[0]
        name = rng.choice(list(first.files))
        plan.trigger_blob = first.files[name] = contents.new(rng.randrange(MIB, 4 * MIB))
        plan.fraction = stratified(rng, 0.02, 0.98, i, n) if kind == "body" else 1.0
        plan.delay = stratified(rng, 0, 0.02, i, n) if kind == "commit" else 0.0
    elif kind == "entry":
        plan.entry_target = rng.randrange(sum(len(c) for c in clients))
        plan.delay = stratified(rng, 0, 0.006, i, n)
    elif kind == "random":
        plan.delay = stratified(rng, 0, 0.3, i, n)
    elif kind == "trap":
        where, when = TRAPS[i % len(TRAPS)]
        plan.trap = TrapAt(where, when, 1 + i // len(TRAPS) % 2)
        # Two new blobs at least (a stored one's link places nothing): a second link.
        for publishes in clients[:2]:
            name = next(iter(publishes[0].files))
            publishes[0].files[name] = contents.new(random_size(rng))
    return plan


def body(data: bytes, at: int, reached: Callable[[], None]) -> Iterator[bytes]:
    """``data`` in chunks, calling ``reached`` just before the chunk that holds byte
    ``at`` is handed to the socket (``at == len(data)``: after the last chunk)."""
    for start in range(0, len(data), SEND_CHUNK):
        if start <= at < start + SEND_CHUNK:
            reached()
        yield data[start : start + SEND_CHUNK]
    if at >= len(data):
        reached()


def client(
    url: str, publishes: list[Publish], plan: Plan, kill: Kill, contents: Contents, out: Outcomes
) -> None:
    """Upload each publish's blobs, then publish it; stop at the first failure."""
    with plain_http(url, timeout=60) as http:
        for number, publish in enumerate(publishes):
            if not upload(http, publish, plan, kill, contents, out) or kill.done.is_set():
                out.unsent.extend(publishes[number:])
                return
            kill.publishing()
            try:
                answer = http.put(
                    f"/v1/ns/{NAMESPACE}/entries/{publish.key}", json=publish.manifest()
                )
            except httpx.TransportError:
                out.cut.append(publish)
                out.unsent.extend(publishes[number + 1 :])
                return
            if answer.status_code not in (200, 201):
                out.unexpected.append(f"publish {publish.key}: {answer.status_code} {answer.text}")
                return
            out.published.append(publish)


def upload(
    http: httpx.Client, publish: Publish, plan: Plan, kill: Kill, contents: Contents, out: Outcomes
) -> bool:
    for blob in publish.files.values():
        if kill.done.is_set():
            return False
        data = contents.data(blob)
        content: bytes | Iterator[bytes] = data
        if blob is plan.trigger_blob:
            reached = kill.now if plan.kind == "body" else kill.trigger.set
            content = body(data, int(plan.fraction * len(data)), reached)
        try:
            answer = http.put(
                f"/v1/blobs/{blob.digest}",
                content=content,
                headers={"Content-Length": str(blob.size)},
            )
        except httpx.TransportError:
            out.blobs_cut.append(blob)
            return False
        if answer.status_code not in (200, 201):
            out.unexpected.append(f"upload {blob.digest}: {answer.status_code} {answer.text}")
            return False
        out.blobs_acked.append(blob)
    return True


def play(url: str, pid: int, plan: Plan, contents: Contents) -> Outcomes:
    """Run the round's clients and kill the server at the planned point."""
    kill = Kill(pid, plan.entry_target)
    out = Outcomes()
    threads = [
        threading.Thread(target=client, args=(url, publishes, plan, kill, contents, out))
        for publishes in plan.clients
    ]
    for thread in threads:
        thread.start()

    def working() -> bool:
        return any(thread.is_alive() for thread in threads)

    if plan.kind == "random":
        time.sleep(plan.delay)
    elif plan.kind in ("idle", "trap"):  # a trap: the server kills itself meanwhile
        for thread in threads:
            thread.join(timeout=120)
    elif plan.kind in ("commit", "entry"):
        while working() and not kill.trigger.wait(0.005):
            pass
        if kill.trigger.is_set():
            time.sleep(plan.delay)
    elif plan.kind == "body":
        while working() and not kill.done.wait(0.005):
            pass
    kill.now()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a client hung after the kill"
    return out


# --- checks


def leftovers(data_dir: Path) -> tuple[list[str], list[Path]]:
    """What start-up should have removed (or nothing should ever have left) in the data
    directory: anything but the SQLite files, blob files in their fan-out directories,
    documents with final names, and one staging area holding its lock and an empty
    ``uploads/``; and anything quarantined. Also the blob files found."""
    found: list[str] = []
    areas: list[str] = []
    blobs: list[Path] = []
    for top, dirs, files in os.walk(data_dir):
        parts = Path(top).relative_to(data_dir).parts
        for name in sorted(dirs + files):
            where = "/".join((*parts, name))
            is_dir = name in dirs
            if not parts:
                if not ((name in SQLITE_FILES and not is_dir) or (name in STORE_DIRS and is_dir)):
                    found.append(f"{where}: not part of a data directory")
            elif parts[0] == "staging":
                if len(parts) == 1 and is_dir and not TEMPORARY.search(name):
                    areas.append(where)
                elif not (len(parts) == 2 and name in ("lock", "uploads")):
                    found.append(f"{where}: left in a staging area")
            elif parts[0] == "blobs":
                if len(parts) == 2 and DIGEST.fullmatch(name) and name[:2] == parts[1]:
                    blobs.append(Path(top, name))
                elif not (len(parts) == 1 and is_dir and FANOUT.fullmatch(name)):
                    found.append(f"{where}: not a blob")
            elif parts[0] == "quarantine":
                found.append(f"{where}: quarantined (a stored blob did not match its digest)")
            elif parts[0] == "documents" and TEMPORARY.search(name):
                found.append(f"{where}: a temporary document file")
    if len(areas) != 1:
        found.append(f"staging areas {areas}: only the running server's should be left")
    return found, blobs


def bad_blob_files(blobs: list[Path], hashed: set[str]) -> list[str]:
    """Blob files not hashed before whose bytes do not hash to their name."""
    bad = []
    for path in blobs:
        if path.name in hashed:
            continue
        hasher = blake3.blake3()
        with open(path, "rb") as f:
            while chunk := f.read(MIB):
                hasher.update(chunk)
        if hasher.hexdigest() != path.name:
            bad.append(f"{path.name}: a blob file of {path.stat().st_size} bytes hashes otherwise")
        hashed.add(path.name)
    return bad


class Reader:
    """Reads entries and blobs back through a server and says what is wrong.

    ``full``: download each blob and hash it; otherwise ``HEAD`` it (its size), which
    is enough where ``bad_blob_files`` has hashed every blob file since start-up."""

    def __init__(self, url: str, first_seen: dict[str, bytes]) -> None:
        self.http = plain_http(url, timeout=120)
        self.first_seen = first_seen  # key: the entry's GET body the first time it was read
        self.downloaded: set[str] = set()  # digests verified through this server

    def close(self) -> None:
        self.http.close()

    def entry(self, publish: Publish, problems: list[str], *, full: bool) -> bool:
        """Whether the entry is there (a miss is False); what is wrong goes in
        ``problems``: an answer other than 200 or 404, a different manifest or body
        than first read, a blob that is gone or not whole."""
        answer = self.http.get(f"/v1/ns/{NAMESPACE}/entries/{publish.key}")
        if answer.status_code == 404:
            return False
        if answer.status_code != 200:
            problems.append(f"entry {publish.key}: {answer.status_code} {answer.text}")
            return False
        manifest = {k: v for k, v in answer.json().items() if k not in STAMPED}
        if manifest != publish.manifest():
            problems.append(f"entry {publish.key} holds {manifest}, not {publish.manifest()}")
        first = self.first_seen.setdefault(publish.key, answer.content)
        if answer.content != first:
            problems.append(f"entry {publish.key} reads {answer.content!r}, first {first!r}")
        for blob in publish.files.values():
            if not self.blob(blob, problems, full=full):
                problems.append(f"entry {publish.key} names blob {blob.digest}, which is gone")
        return True

    def blob(self, blob: Blob, problems: list[str], *, full: bool) -> bool:
        """Whether the blob is there (a miss is False)."""
        if blob.digest in self.downloaded:
            return True
        url = f"/v1/blobs/{blob.digest}"
        answer = self.http.get(url) if full else self.http.head(url)
        if answer.status_code == 404:
            return False
        size = len(answer.content) if full else int(answer.headers.get("content-length", -1))
        if answer.status_code != 200:
            problems.append(f"blob {blob.digest}: {answer.status_code}")
        elif size != blob.size:
            problems.append(f"blob {blob.digest}: {size} bytes, not {blob.size}")
        elif full and digest(answer.content) != blob.digest:
            problems.append(f"blob {blob.digest}: other bytes served")
        elif full:
            self.downloaded.add(blob.digest)
        return True

    def miss(self, publish: Publish, problems: list[str]) -> None:
        answer = self.http.get(f"/v1/ns/{NAMESPACE}/entries/{publish.key}")
        if answer.status_code != 404:
            problems.append(f"entry {publish.key}, never published, answers {answer.status_code}")


@dataclass
class Ledger:
    """Everything acknowledged so far, and how the kills landed."""

    published: dict[str, Publish] = field(default_factory=dict)
    blobs: dict[str, Blob] = field(default_factory=dict)
    first_seen: dict[str, bytes] = field(default_factory=dict)
    hashed: set[str] = field(default_factory=set)  # blob files hashed on disk
    answered: set[str] = field(default_factory=set)  # keys whose publish got 200/201
    landed: Counter[str] = field(default_factory=Counter)

    def settle(
        self, reader: Reader, data_dir: Path, out: Outcomes, rng: random.Random
    ) -> list[str]:
        """Check one round's outcomes through the restarted server, and two entries of
        earlier rounds in full; record what is now stored. Returns the problems."""
        problems = list(out.unexpected)
        older = rng.sample(list(self.published.values()), min(2, len(self.published)))
        for publish in out.published:
            self.published[publish.key] = publish
            self.answered.add(publish.key)
            if not reader.entry(publish, problems, full=False):
                problems.append(f"entry {publish.key} was acknowledged, and is a miss")
            problems += self.durable_copy(data_dir, publish)
        for publish in out.cut:
            if reader.entry(publish, problems, full=False):
                self.published[publish.key] = publish
                self.landed["publish cut, found committed"] += 1
                # Killed between the index row and its document: allowed, as nobody
                # was told it was durable (a republish or fsck --repair writes it).
                if self.durable_copy(data_dir, publish):
                    self.landed["publish cut, committed without its document yet"] += 1
        for publish in out.unsent:
            reader.miss(publish, problems)
        for blob in out.blobs_acked:
            self.blobs[blob.digest] = blob
            if not reader.blob(blob, problems, full=False):
                problems.append(f"blob {blob.digest} was acknowledged, and is gone")
        for blob in out.blobs_cut:
            if reader.blob(blob, problems, full=False):
                self.blobs[blob.digest] = blob
                self.landed["upload cut, found committed"] += 1
        for publish in older:
            if not reader.entry(publish, problems, full=True):
                problems.append(f"entry {publish.key}, acknowledged earlier, is a miss")
        return problems

    def count(self, plan: Plan, out: Outcomes, trap_fired: bool) -> None:
        self.landed[f"kind {plan.kind}"] += 1
        if plan.trap is not None and trap_fired:
            self.landed["trap fired"] += 1
        if any(b.size >= MIB for b in out.blobs_cut):
            self.landed["a body of 1 MiB or more cut off"] += 1
        if out.blobs_cut:
            self.landed["an upload cut off"] += 1
        if out.cut:
            self.landed["a publish cut off"] += 1
        if not (out.blobs_cut or out.cut):
            self.landed["nothing in flight"] += 1

    def durable_copy(self, data_dir: Path, publish: Publish) -> list[str]:
        """An answered publish is durable: the index's copy among the blob store's
        documents (recovery/) holds the entry as served."""
        path = data_dir / "documents" / documents.entry_name(NAMESPACE, publish.key)
        try:
            entry = documents.entry_from(path.read_bytes())
        except (OSError, documents.DocumentError) as exc:
            return [f"entry {publish.key} was acknowledged; its document: {exc}"]
        served = json.loads(self.first_seen.get(publish.key, b"{}"))
        manifest = {k: v for k, v in json.loads(entry.manifest).items() if k not in STAMPED}
        if (entry.key, manifest, entry.created_at) != (
            publish.key,
            publish.manifest(),
            served.get("created_at"),
        ):
            return [f"entry {publish.key}: its document holds {entry}"]
        return []

    def check_all(self, reader: Reader, data_dir: Path) -> list[str]:
        problems: list[str] = []
        for publish in self.published.values():
            if not reader.entry(publish, problems, full=True):
                problems.append(f"entry {publish.key} was acknowledged, and is a miss")
            if publish.key in self.answered:
                problems += self.durable_copy(data_dir, publish)
        for blob in self.blobs.values():
            if not reader.blob(blob, problems, full=True):
                problems.append(f"blob {blob.digest} was acknowledged, and is gone")
        return problems


def expect_none(problems: list[str]) -> None:
    shown = problems[:20] + [f"... and {len(problems) - 20} more"] * (len(problems) > 20)
    assert not problems, "\n".join(shown)


def check_start(data_dir: Path, ledger: Ledger) -> list[str]:
    found, blobs = leftovers(data_dir)
    return found + bad_blob_files(blobs, ledger.hashed)


def check_landed(landed: Counter[str]) -> None:
    """The kills landed where they were aimed, whatever the timing: every trap fired
    (none fell back to the round's end), each body round cut its large body off, each
    document trap cut its publish off, and each one before the link left a committed
    row without its document (the window a republish or fsck --repair closes)."""
    assert landed["trap fired"] == SCHEDULE["trap"], landed
    assert landed["a body of 1 MiB or more cut off"] >= SCHEDULE["body"], landed
    assert landed["a publish cut off"] >= SCHEDULE["trap"] // 2, landed
    assert landed["publish cut, committed without its document yet"] >= SCHEDULE["trap"] // 4, (
        landed
    )


# --- the test


def test_sigkill_during_uploads_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Nothing lost (see the module's docstring): over every SIGKILL, every acknowledged
    entry and blob reads back byte-identical, a cut-off publish is a miss or complete,
    no temporary file survives start-up, and the SQLite index checks ``ok``."""
    seed = int(os.environ.get(SEED_VARIABLE) or random.SystemRandom().randrange(2**32))
    where = "launching"
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # a kill timed by the main thread lands close to its mark
    try:
        data_dir = tmp_path / "data"
        rng = random.Random(seed)  # the plans
        sampling = random.Random(seed + 1)  # which older entries a round reads again
        contents = Contents(rng)
        ledger = Ledger()
        launcher = Launcher(data_dir, tmp_path / "servers.log")
        try:
            out: Outcomes | None = None
            kind = ""
            for number, slot in enumerate(schedule(rng)):
                # Planned before the start: a trap is set in the server as it forks.
                plan = make_plan(rng, contents, list(ledger.blobs.values()), slot)
                where = f"round {number}, start-up"
                pid = launcher.start(plan.trap)
                expect_none(check_start(data_dir, ledger))
                reader = Reader(launcher.url, ledger.first_seen)
                try:
                    if out is not None:
                        where = f"round {number}, checking round {number - 1} ({kind})"
                        expect_none(ledger.settle(reader, data_dir, out, sampling))
                finally:
                    reader.close()
                kind = plan.kind
                where = f"round {number} ({kind})"
                launcher.arm(plan.trap is not None)
                out = play(launcher.url, pid, plan, contents)
                status = launcher.reap(pid)
                assert os.WIFSIGNALED(status), f"the server exited on its own ({status})"
                assert os.WTERMSIG(status) == signal.SIGKILL
                ledger.count(plan, out, launcher.trap_fired())
        finally:
            launcher.close()
        where = "the last start-up, a cold neffcache serve"
        with running_server(data_dir) as server:
            expect_none(check_start(data_dir, ledger))
            reader = Reader(server.url, ledger.first_seen)
            try:
                if out is not None:
                    expect_none(ledger.settle(reader, data_dir, out, sampling))
                where = "reading back everything acknowledged"
                expect_none(ledger.check_all(reader, data_dir))
            finally:
                reader.close()
        where = "the index and the logs"
        with contextlib.closing(sqlite3.connect(data_dir / "index.db")) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        logs = [tmp_path / "servers.log", *tmp_path.glob("server-*.log")]
        expect_none([log.name for log in logs if "Traceback" in log.read_text()])
    except AssertionError as exc:
        raise AssertionError(f"seed {seed} ({SEED_VARIABLE}), {where}: {exc}") from exc
    finally:
        sys.setswitchinterval(switch)
    print(f"seed {seed}: {len(ledger.published)} entries, {len(ledger.blobs)} blobs;")
    print("\n".join(f"  {what}: {n}" for what, n in sorted(ledger.landed.items())))
    if ROUNDS >= FULL_RUN:
        check_landed(ledger.landed)
    shutil.rmtree(data_dir)  # a gigabyte of blobs; kept when the test fails
