"""Stored blobs verified again: the background scrub, and clients' mismatch reports.

A read of a verified blob whose file is unchanged skips hashing (verified.py). What
no file stamp shows, a disk's bit rot beneath the filesystem, is found here:

- **The scrub** (``Scrub``). One replica at a time, the holder of the
  ``_system``/``scrubber`` lease in the index, reads and hashes every blob once per
  ``scrub_interval_seconds``, at most ``scrub_bytes_per_second`` (a blob counts as at
  least ``MIN_COST`` bytes, so a store of tiny blobs is not walked at full speed either).
  A corrupt blob is quarantined exactly as a read that finds one quarantines it
  (``quarantine``); a sound one is remembered as verified again. Replicas sharing a
  filesystem (NFS) scrub it once between them. Only a store whose reads can skip
  hashing is scrubbed (``scrubbed = True``: the filesystem store). The S3 and
  in-memory stores hash every byte they serve, so nothing rests on a scrub there; S3
  checks its objects itself (checksums on upload, redundancy that repairs rot), and a
  re-read would cost a GET and the egress of every object each interval.

  Where the scrub stands is one index record (kind ``scrub``): when the last pass
  began, whether one is under way, and the last full pass's end and counts, which
  ``GET /v1/status`` shows. The first pass is due one interval after the store was
  first served (a new server does not begin by reading its whole store). A pass cut
  off (its replica stopped or killed) is begun again from its start by the next
  replica to take the lease, within ``IDLE`` seconds of the lease expiring.

- **Mismatch reports** (``Rechecks``). A client that downloaded bytes that do not hash
  to their digest says so (``POST /v1/blobs/{digest}/mismatch``). The blob is dropped
  from the memo at once, so the next read hashes it, and queued for this replica's one
  recheck thread, which hashes it unpaced and quarantines it if it is corrupt. A
  digest is taken at most once per ``RECHECK_EVERY`` seconds and at most ``QUEUE``
  wait, so reports cannot make the server hash one blob in a loop, nor many at once.

The clock and the sleep are injected (tests run a pass on a clock they move).
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import blake3

from neffcache.server.blobs import BlobStore
from neffcache.server.errors import StoreError
from neffcache.server.index import Index, Record
from neffcache.server.metrics import Metrics
from neffcache.server.settings import ServerSettings
from neffcache.server.system_lease import LeasedThread
from neffcache.server.verified import VerifiedMemo

if TYPE_CHECKING:  # only Integrity.of names it; the scrub itself takes the parts
    from neffcache.server.services import Services

log = logging.getLogger("neffcache.server.scrub")

LEASE = "scrubber"
RECORD = ("scrub", "", "pass")  # kind, namespace, name
LEASE_TTL = 120.0  # seconds; renewed every third of it while a pass runs
MIN_COST = 64 * 1024  # bytes a blob counts as, at least, against the scrub's rate
IDLE = 300.0  # seconds between looks at the record while no pass is due
FIRST_LOOK = 60.0  # seconds after start-up: a short-lived server never touches the index
RECHECK_EVERY = 600.0  # seconds: one digest is rechecked at most this often
QUEUE = 64  # rechecks waiting at most
_REMEMBERED = 16384  # digests whose last recheck is remembered (about 2 MiB)

Sleep = Callable[[float], bool]  # wait this long; False when the work should stop


class Verdict(enum.Enum):
    SOUND = "sound"
    CORRUPT = "corrupt"  # and quarantined
    ABSENT = "absent"
    CHANGED = "changed"  # its file changed while it was read: not judged
    STOPPED = "stopped"  # the pace said stop (the server is stopping)


def quarantine(
    blobs: BlobStore, memo: VerifiedMemo, metrics: Metrics, digest: str, found_by: str
) -> None:
    """What every check that finds a blob's bytes wrong does (a read, the scrub, a
    client's report): forget it was verified, move it out of the way so it reads as
    absent and the next upload heals it, count it and say so."""
    memo.forget(digest)
    blobs.quarantine(digest)
    metrics.blob_mismatches.labels(found_by).inc()
    log.error("blob %s failed verification (%s); quarantined", digest, found_by)


def verify(
    blobs: BlobStore,
    memo: VerifiedMemo,
    metrics: Metrics,
    digest: str,
    found_by: str,
    spend: Callable[[int], bool] = lambda size: True,
) -> Verdict:
    """Hash the stored blob in full, whatever the memo says. Sound: remembered as
    verified (by the stamp taken before it was read). Corrupt: quarantined, unless its
    file changed while it was read (another upload after a collection), which only
    makes the memo forget it. ``spend`` is told each chunk's size, and may wait."""
    seen_at = time.time()  # epoch, as the file's change time the memo compares it with
    stamped = blobs.stamp(digest)
    chunks = blobs.read(digest)
    if chunks is None:
        return Verdict.ABSENT
    hasher = blake3.blake3()
    for chunk in chunks:
        hasher.update(chunk)
        if not spend(len(chunk)):
            return Verdict.STOPPED
    if hasher.hexdigest() == digest:
        if stamped is not None:
            memo.remember(digest, stamped[0], stamped[1], seen_at)
        return Verdict.SOUND
    if stamped is not None and not _unchanged(blobs, digest, stamped[0], chunks):
        memo.forget(digest)
        return Verdict.CHANGED
    quarantine(blobs, memo, metrics, digest, found_by)
    return Verdict.CORRUPT


def _unchanged(blobs: BlobStore, digest: str, stamp: Hashable, chunks: Iterator[bytes]) -> bool:
    read = getattr(chunks, "unchanged_since", None)
    if read is not None:
        return bool(read(stamp))  # the very file that was read (fs.py)
    now = blobs.stamp(digest)
    return now is not None and now[0] == stamp


class Pace:
    """At most ``rate`` bytes a second, measured on ``clock``: ``spend(n)`` after n
    bytes waits (``sleep``) as long as they should have taken; no credit is saved up
    while idle. False when ``sleep`` says stop."""

    def __init__(self, rate: float, clock: Callable[[], float], sleep: Sleep) -> None:
        self._rate = rate
        self._clock = clock
        self._sleep = sleep
        self._due = clock()

    def spend(self, size: int) -> bool:
        now = self._clock()
        self._due = max(self._due, now) + size / self._rate
        wait = self._due - now
        return wait <= 0 or self._sleep(wait)


@dataclass(frozen=True)
class ScrubState:
    """The index record of the scrub (``RECORD``), as ``/v1/status`` shows it."""

    began: float  # when the last pass began (before the first: when the store was first seen)
    running: bool  # a pass began and has not finished (or was cut off)
    last_full_pass: float | None  # when the last full pass ended
    blobs: int = 0  # of the last full pass
    bytes: int = 0
    mismatches: int = 0

    def value(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, value: str) -> ScrubState | None:
        """None for a value that is not one (then a new record replaces it)."""
        try:
            found = json.loads(value)
            state = cls(**found)
        except (ValueError, TypeError):
            return None
        numbers = (state.began, state.blobs, state.bytes, state.mismatches)
        if not all(isinstance(n, (int, float)) for n in numbers):
            return None
        if not isinstance(state.running, bool):
            return None
        if not isinstance(state.last_full_pass, (int, float, type(None))):
            return None
        return state


@dataclass
class _Counts:
    blobs: int = 0
    bytes: int = 0
    mismatches: int = 0


class Scrub(LeasedThread):
    """The background scrub of one replica (see the module docstring).

    >>> scrub = Scrub(blobs, index, memo, metrics, settings)
    >>> scrub.start()   # a thread: a look at the record FIRST_LOOK seconds after start-up
    >>> scrub.tick()    # or by hand: a pass if one is due; seconds until the next look
    """

    lease = LEASE
    role = "scrub"
    what = "scrub"
    log = log

    def __init__(
        self,
        blobs: BlobStore,
        index: Index,
        memo: VerifiedMemo,
        metrics: Metrics,
        settings: ServerSettings,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Sleep | None = None,
    ) -> None:
        """``clock``: epoch seconds (the record, the lease); ``monotonic`` paces the
        reads, ``sleep`` waits (tests move one clock for all three)."""
        super().__init__(index)
        self.blobs, self.memo, self.metrics = blobs, memo, metrics
        self.interval = settings.scrub_interval_seconds
        self.rate = settings.scrub_bytes_per_second
        self.enabled = self.interval > 0 and bool(getattr(blobs, "scrubbed", False))
        self._clock = clock
        self._monotonic = monotonic
        # A pass under way stops at its next chunk when the thread is stopped.
        self._sleep: Sleep = sleep or self.running
        self._renewed = 0.0

    # --- the thread (LeasedThread)

    def start(self) -> None:
        if self.enabled:
            super().start()

    def first_wait(self) -> float:
        return FIRST_LOOK

    def idle(self) -> float:
        return IDLE

    def turn(self) -> float:
        return self.tick()

    # --- the record

    def state(self) -> ScrubState | None:
        """The scrub's record; None before any replica looked."""
        found = self.index.get_record(*RECORD)
        return None if found is None else ScrubState.parse(found.value)

    def _put(self, state: ScrubState) -> None:
        self.index.put_record(Record(*RECORD, state.value()))

    def _state_now(self) -> ScrubState:
        state = self.state()
        if state is None:
            # First seen now: the first pass is due one interval later.
            state = ScrubState(began=self._clock(), running=False, last_full_pass=None)
            if not self.index.put_record(Record(*RECORD, state.value()), create_only=True):
                return self.state() or state  # another replica wrote it first
        return state

    # --- passes

    def tick(self) -> float:
        """A pass if one is due (or was cut off) and this replica takes the lease;
        the seconds until the next look."""
        state = self._state_now()
        due = state.began + self.interval
        now = self._clock()
        if not state.running and now < due:
            return min(due - now, IDLE)
        if not self._lead():
            return IDLE
        self.run_pass(state)
        return IDLE

    def _lead(self) -> bool:
        """Hold (take or renew) the scrubber lease; False while another replica does."""
        now = self._clock()
        if not self.hold_lease(now, LEASE_TTL):
            return False
        self._renewed = now
        return True

    def _still_leading(self) -> bool:
        if self._clock() - self._renewed < LEASE_TTL / 3:
            return True
        return self._lead()

    def run_pass(self, before: ScrubState | None = None) -> ScrubState | None:
        """Read and hash every blob, paced; the record of the finished pass, or None
        when it was stopped or lost its lease (it stays marked running, for the next
        holder of the lease to begin again), or when another replica holds the lease."""
        if not self._lead():
            return None
        before = before or self._state_now()
        began = self._clock()
        self._put(
            ScrubState(
                began, True, before.last_full_pass, before.blobs, before.bytes, before.mismatches
            )
        )
        pace = Pace(self.rate, self._monotonic, self._sleep)
        counts = _Counts()
        for blob in self.blobs.blobs():
            if not self._still_leading():
                log.warning("scrub: another replica took the lease; this pass stops")
                return None
            if not self._scrub_one(blob.digest, blob.size, pace, counts):
                return None
        done = ScrubState(
            began, False, self._clock(), counts.blobs, counts.bytes, counts.mismatches
        )
        self._put(done)
        self.metrics.scrub_last_pass.set(done.last_full_pass or 0.0)
        log.info(
            "scrub: %d blobs (%d bytes) verified in %.0f s, %d corrupt (quarantined)",
            done.blobs,
            done.bytes,
            (done.last_full_pass or began) - began,
            done.mismatches,
        )
        self.release_lease()
        return done

    def _scrub_one(self, digest: str, size: int, pace: Pace, counts: _Counts) -> bool:
        verdict = verify(self.blobs, self.memo, self.metrics, digest, "scrub", pace.spend)
        if verdict is Verdict.STOPPED or not pace.spend(max(MIN_COST - size, 0)):
            return False
        if verdict is not Verdict.ABSENT:
            counts.blobs += 1
            counts.bytes += size
            self.metrics.scrub_blobs.inc()
            self.metrics.scrub_bytes.inc(size)
        counts.mismatches += verdict is Verdict.CORRUPT
        return True


class Rechecks:
    """Blobs clients found wrong, verified again by one thread of this replica.

    >>> rechecks.report(digest)   # "queued", "recent" or "busy"; never waits
    >>> rechecks.run_pending()    # the thread's work, or a test's, by hand
    """

    def __init__(
        self,
        blobs: BlobStore,
        memo: VerifiedMemo,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        threaded: bool = True,
    ) -> None:
        self.blobs, self.memo, self.metrics = blobs, memo, metrics
        self._clock = clock
        self._threaded = threaded
        self._queue: deque[str] = deque()
        self._taken: OrderedDict[str, float] = OrderedDict()  # digest -> when it was queued
        self._working = False
        self._stopping = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def report(self, digest: str) -> str:
        """Queue a recheck of ``digest`` (of a blob that exists): ``queued``; ``recent``
        when it was queued less than ``RECHECK_EVERY`` ago (nothing done), ``busy``
        when ``QUEUE`` wait already. A queued blob is forgotten by the memo at once."""
        with self._cond:
            now = self._clock()
            taken = self._taken.get(digest)
            if taken is not None and now - taken < RECHECK_EVERY:
                return "recent"
            if len(self._queue) >= QUEUE or self._stopping:
                return "busy"
            self._taken[digest] = now
            self._taken.move_to_end(digest)
            while len(self._taken) > _REMEMBERED:
                self._taken.popitem(last=False)
            self._queue.append(digest)
            self._start()
            self._cond.notify_all()
        self.memo.forget(digest)
        return "queued"

    def _start(self) -> None:
        if self._threaded and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="neffcache-rechecks")
            self._thread.daemon = True
            self._thread.start()

    def run_pending(self) -> int:
        """Recheck every queued blob now; how many were."""
        done = 0
        while self._take():
            done += 1
        return done

    def _take(self) -> bool:
        with self._cond:
            if not self._queue or self._stopping:
                return False
            digest = self._queue.popleft()
            self._working = True
        try:
            # Unpaced, but a stopping server does not wait for a large blob's hash.
            verify(
                self.blobs,
                self.memo,
                self.metrics,
                digest,
                "report",
                lambda size: not self._stopping,
            )
        except StoreError as exc:
            log.warning("cannot recheck blob %s: %s", digest, exc)
        finally:
            with self._cond:
                self._working = False
                self._cond.notify_all()
        return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                self._take()
            except Exception:  # a bug must not end the thread for good
                log.exception("recheck failed")

    def wait_idle(self, timeout: float) -> bool:
        """Whether every queued recheck finished within ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._working, timeout)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)


@dataclass
class Integrity:
    """A replica's scrub and rechecks, started and stopped with the app (app.py)."""

    scrub: Scrub
    rechecks: Rechecks

    @classmethod
    def of(cls, backends: Services) -> Integrity:
        memo, metrics = backends.verified, backends.metrics
        scrub = Scrub(backends.blobs, backends.index, memo, metrics, backends.settings)
        return cls(scrub, Rechecks(backends.blobs, memo, metrics))

    def start(self) -> None:
        self.scrub.start()

    def stop(self) -> None:
        self.rechecks.stop()
        self.scrub.stop()
