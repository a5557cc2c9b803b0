"""The host's counters read, folded and zeroed (``neffcache stats``): the records
``hoststats.py`` appends, added up.

Layout under L1's ``.neffcache/``::

    stats/log            records being appended (hoststats.py)
    stats/folding-*      a log renamed away to be folded
    stats/summary.json   every record folded so far, added up
    locks/stats.flock    held exclusively by a fold, shared by a reader; a leaf lock:
                         nothing else is taken under it (the hook may fold while it
                         holds an entry's lock)

A fold renames the log away, waits (boundedly) for the appenders that opened it
before, adds its records to the summary, writes the summary (through a temporary file
and a rename) with the names of the files it folded, then removes them. A fold that
dies before the summary is written leaves its file to the next fold; one that dies
after it leaves a file the summary names, which the next fold removes unread. So a
record is counted once, whatever dies when.

Every file here is untrusted (anything on the host may write L1): a line that is not a
record is skipped and counted (``skipped``), a summary that cannot be read counts as
none (``summary_lost``), and a bound caps every number, reason and file read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neffcache.client._log import log
from neffcache.client.hostlog import (
    CAP,
    KINDS,
    LOG,
    MAX_BYTES,
    MAX_SECONDS,
    VERSION,
    is_code,
    stats_dir,
)
from neffcache.client.stats import STATS
from neffcache.protocol.counters import ClientCounter

SUMMARY = "summary.json"
FOLDING = "folding-"
LOCK = "stats"
SUMMARY_VERSION = 1
# Distinct miss reasons kept; more (a server with a vocabulary this client does not
# know, or a forged file) are added up as OTHER.
MAX_REASONS = 64
OTHER = "other"
HITS = ("l1", "server")
# Bytes of one file read at most: a log stops growing at CAP.
MAX_READ = CAP + (1 << 20)
# Renamed-away logs one fold takes at most (the summary names them); more wait for the
# next fold. One is usual: a fold leaves one only when an appender held it too long.
MAX_FILES = 32
_MAX_COUNT = 1 << 62
# Seconds a fold waits for the host's other fold, and for the appenders of a log it
# renamed away (they hold it for microseconds; one stopped by a debugger is left for
# the next fold).
FOLD_WAIT = 5.0
_POLL = 0.01


@dataclass
class Tally:
    """Graph outcomes added up: counts by kind (hostlog.KINDS), misses by reason,
    and the sums of their figures."""

    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    reasons: dict[str, int] = field(default_factory=dict)
    fetch_seconds: float = 0.0  # hits: time spent getting the NEFF
    saved_seconds: float = 0.0  # hits: the served entries' compile times
    compile_seconds: float = 0.0  # misses: compiles run here, failed ones included
    bytes_fetched: int = 0  # server hits: NEFF bytes downloaded
    skipped: int = 0  # lines that were no record
    zeroed_at: float | None = None  # epoch seconds of the last --zero
    updated_at: float | None = None  # epoch seconds of the newest record known

    def add_record(self, line: bytes) -> None:
        parsed = _parse(line)
        if parsed is None:
            self.skipped += 1
            return
        kind, reason, fetch, seconds, size = parsed
        self.kinds[kind] += 1
        if kind in HITS:
            self.fetch_seconds += fetch
            self.saved_seconds += seconds
            self.bytes_fetched += size if kind == "server" else 0
        else:
            self.compile_seconds += seconds
            self.add_reason(reason, 1)

    def add_reason(self, reason: str, n: int) -> None:
        if reason not in self.reasons and len(self.reasons) >= MAX_REASONS - 1:
            reason = OTHER  # the last place: MAX_REASONS names at most, OTHER included
        self.reasons[reason] = self.reasons.get(reason, 0) + n

    def add_log(self, data: bytes) -> None:
        """Every complete line of ``data``: the last one, without its newline, is an
        append still under way (a reader may see part of one) or a torn write."""
        for line in data.split(b"\n")[:-1]:
            if line:
                self.add_record(line)

    # -- the summary file ---------------------------------------------------------------

    def as_json(self, folded: list[str]) -> dict[str, Any]:
        return {
            "version": SUMMARY_VERSION,
            "kinds": self.kinds,
            "reasons": self.reasons,
            "fetch_seconds": self.fetch_seconds,
            "saved_seconds": self.saved_seconds,
            "compile_seconds": self.compile_seconds,
            "bytes_fetched": self.bytes_fetched,
            "skipped": self.skipped,
            "zeroed_at": self.zeroed_at,
            "updated_at": self.updated_at,
            "folded": folded,
        }

    @classmethod
    def from_json(cls, value: Any) -> tuple[Tally, list[str]]:
        """The tally and the folded files' names a summary holds; ValueError for
        anything that is not a summary this version wrote."""
        if not isinstance(value, dict) or value.get("version") != SUMMARY_VERSION:
            raise ValueError("not a summary")
        tally = cls()
        kinds, reasons, folded = value["kinds"], value["reasons"], value["folded"]
        if not isinstance(kinds, dict) or set(kinds) - set(KINDS):
            raise ValueError("kinds")
        for kind, n in kinds.items():
            tally.kinds[kind] = _count(n)
        if not isinstance(reasons, dict) or len(reasons) > MAX_REASONS:
            raise ValueError("reasons")
        for reason, n in reasons.items():
            if reason != OTHER and not is_code(reason):
                raise ValueError("reasons")
            tally.add_reason(reason, _count(n))
        tally.fetch_seconds = _total(value["fetch_seconds"])
        tally.saved_seconds = _total(value["saved_seconds"])
        tally.compile_seconds = _total(value["compile_seconds"])
        tally.bytes_fetched = _count(value["bytes_fetched"])
        tally.skipped = _count(value["skipped"])
        tally.zeroed_at = _stamp(value["zeroed_at"])
        tally.updated_at = _stamp(value["updated_at"])
        if not isinstance(folded, list) or len(folded) > MAX_FILES:
            raise ValueError("folded")
        if not all(isinstance(name, str) and name.startswith(FOLDING) for name in folded):
            raise ValueError("folded")
        return tally, folded


def _parse(line: bytes) -> tuple[str, str, float, float, int] | None:
    """A record's kind, reason, fetch seconds, seconds and bytes; None for a line
    that is not one."""
    parts = line.split(b" ")
    if len(parts) != 6 or parts[0] != VERSION.encode():
        return None
    try:
        kind, reason = parts[1].decode("ascii"), parts[2].decode("ascii")
        fetch, seconds, size = _seconds(parts[3]), _seconds(parts[4]), int(parts[5])
    except (ValueError, UnicodeDecodeError):
        return None
    if kind not in KINDS or not 0 <= size < MAX_BYTES:
        return None
    if (reason != "-") if kind in HITS else not is_code(reason):
        return None
    return kind, reason, fetch, seconds, size


def _seconds(text: bytes) -> float:
    value = float(text)
    if not (math.isfinite(value) and 0 <= value < MAX_SECONDS):
        raise ValueError("seconds")
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _MAX_COUNT:
        raise ValueError("count")
    return value


def _total(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError("total")
    if not (math.isfinite(value) and 0 <= value < 1e15):
        raise ValueError("total")
    return float(value)


def _stamp(value: Any) -> float | None:
    return None if value is None else _total(value)


# -- reading ---------------------------------------------------------------------------


@dataclass
class Read:
    """What ``read`` found: the tally, and whether the summary had to be given up."""

    tally: Tally
    summary_lost: bool = False


def read(local_dir: str) -> Read:
    """L1's counters as they stand: the summary plus every record not folded into it.
    Takes the stats lock shared when it can, so that no fold runs meanwhile (a
    read-only L1 has no lock to take, and no fold either)."""
    directory = Path(stats_dir(local_dir))
    with _lock(local_dir, shared=True):
        found, folded, lost = _summary(directory)
        for path in _unfolded(directory, folded):
            data = _read(path)
            if data is not None:
                found.add_log(data)
                found.updated_at = max(found.updated_at or 0.0, _mtime(path))
    return Read(found, lost)


def _summary(directory: Path) -> tuple[Tally, list[str], bool]:
    """The summary's tally and folded names; an empty tally when there is none, and
    also (the third value True) when it cannot be read."""
    try:
        with open(directory / SUMMARY, "rb") as f:
            data = f.read(MAX_READ)
    except (FileNotFoundError, NotADirectoryError):
        return Tally(), [], False
    except OSError:  # unreadable (not ours to read): not the same as none
        return Tally(), [], True
    try:
        tally, folded = Tally.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError):
        return Tally(), [], True
    return tally, folded, False


def _unfolded(directory: Path, folded: list[str]) -> list[Path]:
    """The logs whose records the summary does not hold: logs left by a fold that
    died before writing the summary, then the log being appended to."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    left = [directory / n for n in names if n.startswith(FOLDING) and n not in folded]
    return [*left, directory / LOG]


def _read(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ)
    except OSError:
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# -- folding and zeroing ---------------------------------------------------------------


def fold_quietly(local_dir: str) -> None:
    """``fold`` without waiting for another fold, never raising (an appender's)."""
    try:
        fold(local_dir, wait=0.0)
    except Exception:  # the counters' trouble is never the job's
        STATS.count(ClientCounter.HOST_STATS_ERRORS)
        log.exception("neffcache: could not fold the host's counters")


@dataclass
class Folded:
    held: bool  # False: another fold held the lock past the wait; nothing was done
    summary_lost: bool = False  # the summary could not be read: counted again from empty


def fold(local_dir: str, *, zero: bool = False, wait: float = FOLD_WAIT) -> Folded:
    """Fold the log into the summary (``zero``: discard everything, and start again
    from now). Raises OSError when L1 cannot be written."""
    directory = Path(stats_dir(local_dir))
    directory.mkdir(parents=True, exist_ok=True)
    with _lock(local_dir, shared=False, wait=wait) as held:
        if not held:
            return Folded(False)
        tally, folded, lost = _summary(directory)
        if lost and not zero:
            log.warning(
                "neffcache: %s could not be read; the host's counters start again from "
                "the records not yet folded",
                directory / SUMMARY,
            )
        with contextlib.suppress(FileNotFoundError):
            os.rename(directory / LOG, directory / f"{FOLDING}{os.getpid()}.{os.urandom(6).hex()}")
        # An appender's fold does not wait for a stopped process's lock on a log:
        # that log is left for the next fold.
        with _taken(directory, folded, wait if wait > 0 else 0.1) as taken:
            if zero:
                tally = Tally(zeroed_at=time.time(), updated_at=time.time())
            else:
                for path, data in taken:
                    if data is not None:
                        tally.add_log(data)
                        tally.updated_at = max(tally.updated_at or 0.0, _mtime(path))
            names = [path.name for path, _data in taken]
            _write_summary(directory, tally, names)
            for path, _data in taken:
                with contextlib.suppress(OSError):
                    path.unlink()
    return Folded(True, lost)


@contextlib.contextmanager
def _taken(
    directory: Path, folded: list[str], wait: float
) -> Iterator[list[tuple[Path, bytes | None]]]:
    """Every renamed-away log, locked exclusively (their appenders are done), with
    its bytes (None: the summary holds them already). A log whose lock cannot be had
    within ``wait`` seconds is left for the next fold. Locks held until the block ends."""
    taken: list[tuple[Path, bytes | None]] = []
    descriptors: list[int] = []
    try:
        for name in sorted(os.listdir(directory)):
            if not name.startswith(FOLDING) or len(taken) >= MAX_FILES:
                continue
            path = directory / name
            if name in folded:  # counted already: only to be removed
                taken.append((path, None))
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            descriptors.append(fd)
            if _flock(fd, fcntl.LOCK_EX, wait):
                taken.append((path, _read(path)))
        yield taken
    finally:
        for fd in descriptors:
            os.close(fd)


def _write_summary(directory: Path, tally: Tally, folded: list[str]) -> None:
    """Through a temporary file and a rename, readable by all as the log is (a rank
    of another user may run ``neffcache stats``)."""
    from neffcache.client.local import new_temp

    data = json.dumps(tally.as_json(folded), sort_keys=True).encode()
    fd, tmp = new_temp(directory, f".{SUMMARY}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            os.fchmod(out.fileno(), 0o644)
        os.replace(tmp, directory / SUMMARY)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _lock(local_dir: str, *, shared: bool, wait: float = FOLD_WAIT) -> Iterator[bool]:
    """The host's stats lock: exclusive (a fold: the lock file is made if need be),
    or shared (a reader: taken if the file can be opened, else not at all, as on a
    read-only L1). Yields whether it is held."""
    path = Path(local_dir) / ".neffcache" / "locks" / f"{LOCK}.flock"
    try:
        if shared:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        if not shared:
            raise
        yield False
        return
    try:
        yield _flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, wait)
    finally:
        os.close(fd)


def _flock(fd: int, operation: int, wait: float) -> bool:
    """``flock`` within ``wait`` seconds (0: one try)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
