"""L1's size limit (``NEFFCACHE_LOCAL_MAX_SIZE``): least recently used first, off the
hot path, one process of the host at a time.

What counts: L1's blobs (``.neffcache/blobs``) and the stock entries the hook serves
(``neuronxcc-*/MODULE_*/``). Manifests, locks and notes are a few hundred bytes each and
are not counted; a manifest whose NEFF blob is gone is removed with it (it would only
send its hit to the server).

Recency is a file's modification time: set when the file is written, and set again by
every hit (``used``: the wrapper's on the blob, the hook's on ``model.done``). Access
times are no use: ``noatime`` never sets them, ``relatime`` once a day. A hit costs one
``utime``; nothing on a hit's path lists a directory.

When: ``grew`` is called where L1 grows (a compile kept, an entry fetched, a prewarm).
It costs one ``stat`` of a stamp file until ``INTERVAL`` has passed. Then the process
that takes the host's eviction flock (without waiting: the others go on) walks L1 and
removes the least recently used until L1 is down to ``LOW_WATER`` of the limit, within
``BUDGET`` seconds; a run cut short works on what it saw and the next one goes on.

Never removed:

* anything written or used in the last ``GRACE`` seconds: a file being written, a
  download just renamed into place, a hit being served;
* a blob whose ``blob-<digest>`` flock is held (a download of it), a stock entry whose
  ``entry-<address>`` flock is held (a fetch writing it): each item's flock is taken
  without waiting and held while the item is checked again and removed;
* a stock entry with an SDK ``*.lock`` in it (a compile), or a subdirectory;
* a stock entry without ``model.done`` touched in the last ``ABANDONED`` seconds (it is
  being written; after that it is a killed compile's or a failed one's);
* hidden files (temporaries; ``prewarm.remove_temps`` removes stale ones).

A hit and a removal meet safely because each writes before it reads: the hit touches
the file, then checks that it exists; the evictor renames the file away (``.evicting-``
prefix), then reads its modification time, and puts it back when it is recent. A hit
either saw the file before the rename (then the evictor sees its touch and keeps it) or
finds it gone (a miss: the wrapper fetches or compiles, the SDK compiles). A stock entry
goes whole: ``model.done`` first (so the SDK never takes a half-removed entry for a
complete one), then the directory is renamed into ``.neffcache/evicting/`` and emptied
there, out of every reader's sight.

Lock order: the host's eviction flock, then one item's flock at a time. A hit takes
none of them. Nothing here raises to the caller: an error is counted
(``l1_eviction_errors``), logged, and the job goes on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from neffcache.client._log import log
from neffcache.client.l1access import l1_read_only
from neffcache.client.manifests import is_digest
from neffcache.client.stats import STATS
from neffcache.protocol.counters import ClientCounter

if TYPE_CHECKING:
    from neffcache.client.config import ClientConfig

# ccache's default is 5 GB and sccache's 10 GiB, sized for object files. A NEFF is tens
# of MB to a GB, a large model compiles hundreds to thousands of graphs, and a host
# often trains several models (or versions of one) in turn: 50 GiB holds a few models'
# worth. The L1 default (/var/tmp) is usually on the root volume, shared with images,
# checkpoints and logs: the cache takes at most a quarter of it.
DEFAULT_MAX_SIZE = 50 << 30
FILESYSTEM_SHARE = 0.25
# How often one host may walk its L1. A walk costs about 5 us per file, so even a large
# L1 takes well under a second; more often would only cost more walks.
INTERVAL = 600.0
# Younger than this, a file may be in use: a compile's output being kept, a download
# renamed into place and about to be copied, an entry a rank just found. Every write
# and hit sets a file's time, so ten minutes covers the slowest copy with room to spare.
GRACE = 600.0
# A stock entry without model.done untouched this long is a killed or failed compile's.
ABANDONED = 86400.0
# Evict down to this share of the limit, so the next few compiles do not each cross it.
LOW_WATER = 0.9
# Longest one run may take (walk and removals), in seconds: eviction runs in a
# process that has work to do (a compile's shim, a publisher thread).
BUDGET = 5.0

_EVICTING = ".evicting-"
_DONE = "model.done"
_NEFF = "model.neff"
_LOCK_SUFFIX = ".lock"

# Plain classes, not NamedTuples or dataclasses, and json and threading imported where
# used: the wrapper imports this module on every hit (for ``used``), and a NamedTuple
# alone costs a third of a millisecond to define.


def used(path: str | os.PathLike[str]) -> None:
    """Note a hit on ``path`` (a blob, an entry's ``model.done``): its modification
    time becomes now. Call it before the hit checks or reads the file (see the module
    docstring). Best effort: a file that is absent or not ours to touch is left as is."""
    with contextlib.suppress(OSError):
        os.utime(path)


def grew(config: ClientConfig, *, background: bool = False) -> None:
    """L1 grew: evict if a run is due (one ``stat`` when it is not). ``background``
    runs the eviction on a daemon thread, for a process whose caller is waiting (the
    hook's); the shim's process, which ends soon after, runs it inline (at most
    ``BUDGET`` seconds, once per ``INTERVAL`` per host). Never raises. A read-only L1
    is never evicted from (it did not grow: nothing was written to it)."""
    try:
        if config.local_max_size == 0 or config.local_read_only:
            return
        evictor = Evictor(config.local_dir, config.local_max_size)
        if not evictor.due() or not _writable(config.local_dir):
            return
        if background:
            import threading

            threading.Thread(target=evictor.run_quietly, name="neffcache-l1", daemon=True).start()
        else:
            evictor.run_quietly()
    except Exception:  # the cache's trouble is never the job's
        STATS.count(ClientCounter.L1_EVICTION_ERRORS)
        log.exception("neffcache: the L1 size limit could not be applied")


def _writable(local_dir: str) -> bool:
    return not l1_read_only(local_dir, declared=False)


def default_limit(local_dir: Path) -> int:
    """``DEFAULT_MAX_SIZE``, or ``FILESYSTEM_SHARE`` of ``local_dir``'s filesystem when
    that is smaller."""
    try:
        fs = os.statvfs(local_dir)
    except OSError:
        return DEFAULT_MAX_SIZE
    return min(DEFAULT_MAX_SIZE, int(fs.f_blocks * fs.f_frsize * FILESYSTEM_SHARE))


class Item:
    """A removable unit of L1: a blob, or a stock entry directory."""

    __slots__ = ("entry", "path", "size", "used")

    def __init__(self, used: float, size: int, path: Path, entry: bool) -> None:
        self.used = used  # the newest modification time of its files (epoch seconds)
        self.size = size  # bytes
        self.path = path
        self.entry = entry  # a stock entry (else a blob)


class _EntryState:
    __slots__ = ("busy", "done", "size", "used")

    def __init__(self, used: float, size: int, done: bool, busy: bool) -> None:
        self.used = used
        self.size = size
        self.done = done  # model.done is there
        self.busy = busy  # an SDK *.lock or a subdirectory is there


class Evictor:
    """One host's eviction of ``local_dir``'s L1 down to ``max_size`` bytes (None: the
    default; 0: no limit). ``clock`` gives epoch seconds (tests move it)."""

    def __init__(
        self,
        local_dir: str | Path,
        max_size: int | None,
        *,
        clock: Callable[[], float] = time.time,
        interval: float = INTERVAL,
        grace: float = GRACE,
        abandoned: float = ABANDONED,
        budget: float = BUDGET,
    ) -> None:
        self.top = Path(local_dir)
        self.root = self.top / ".neffcache"
        self.max_size = max_size
        self.clock = clock
        self.interval = interval
        self.grace = grace
        self.abandoned = abandoned
        self.budget = budget
        self._warned = False

    @property
    def _stamp_path(self) -> Path:
        # Beside the locks: host-wide coordination, not cache content.
        return self.root / "locks" / "l1-evict.stamp"

    def limit(self) -> int | None:
        if self.max_size == 0:
            return None
        return default_limit(self.top) if self.max_size is None else self.max_size

    def due(self) -> bool:
        """Whether ``interval`` has passed since the host's last run (the stamp's time)."""
        try:
            return self.clock() - os.stat(self._stamp_path).st_mtime >= self.interval
        except FileNotFoundError:
            return self.root.is_dir()  # no L1 here yet: nothing to evict
        except OSError:
            return False

    def run_quietly(self) -> None:
        try:
            self.run()
        except Exception:  # the cache's trouble is never the job's
            STATS.count(ClientCounter.L1_EVICTION_ERRORS)
            log.exception("neffcache: the L1 size limit could not be applied")

    def run(self) -> list[Path]:
        """Evict if due and no other process of the host is evicting; what was removed
        (blobs, entry directories, then manifests), oldest first."""
        limit = self.limit()
        if limit is None:
            return []
        fd = try_lock(self.root, "l1-evict")
        if fd is None:
            return []  # another process evicts now
        try:
            if not self.due():
                return []  # one ran while we took the lock
            self._stamp()
            return self._evict(limit, time.monotonic() + self.budget)
        finally:
            os.close(fd)

    def _stamp(self) -> None:
        now = self.clock()
        stamp = self._stamp_path
        with contextlib.suppress(OSError):  # then the next process walks again: slower, no worse
            os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT, 0o644))
            os.utime(stamp, (now, now))

    def _evict(self, limit: int, deadline: float) -> list[Path]:
        self._empty_trash()
        items = list(self._blobs(deadline)) + list(self._entries(deadline))
        total = sum(item.size for item in items)
        if total <= limit:
            return []
        target = int(limit * LOW_WATER)
        removed: list[Path] = []
        for item in sorted(items, key=_by_use):
            if total <= target or time.monotonic() > deadline or self._young(item.used):
                break  # sorted oldest first: the rest are younger still
            if self._remove(item):
                total -= item.size
                removed.append(item.path)
                STATS.count(ClientCounter.L1_EVICTED)
                STATS.count(ClientCounter.L1_EVICTED_BYTES, item.size)
        if removed:
            removed += self._orphan_manifests(deadline)
        return removed

    def _young(self, mtime: float) -> bool:
        return self.clock() - mtime < self.grace

    def _remove(self, item: Item) -> bool:
        try:
            return self._remove_entry(item.path) if item.entry else self._remove_blob(item.path)
        except OSError as exc:
            STATS.count(ClientCounter.L1_EVICTION_ERRORS)
            if not self._warned:  # one line per run: an L1 shared with other users may
                self._warned = True  # refuse every removal
                log.warning("neffcache: cannot evict %s from L1: %s", item.path, exc)
            return False

    # -- blobs ------------------------------------------------------------------------

    def _blobs(self, deadline: float) -> Iterator[Item]:
        for shard in _dirs(self.root / "blobs"):
            if time.monotonic() > deadline:
                return
            for found in _scan(shard, hidden=True):
                if found.name.startswith(_EVICTING):  # a killed evictor's (we hold the flock)
                    with contextlib.suppress(OSError):
                        os.unlink(found.path)
                elif found.is_file(follow_symlinks=False) and is_digest(found.name):
                    with contextlib.suppress(OSError):
                        status = found.stat(follow_symlinks=False)
                        yield Item(status.st_mtime, status.st_size, Path(found.path), False)

    def _remove_blob(self, path: Path) -> bool:
        fd = try_lock(self.root, f"blob-{path.name}")
        if fd is None:
            return False  # being downloaded
        try:
            return self._unlink_unless_used(path)
        finally:
            os.close(fd)

    def _unlink_unless_used(self, path: Path) -> bool:
        """Rename ``path`` away, then remove it unless a hit touched it meanwhile (then
        put it back): the evictor's half of the handshake in the module docstring."""
        hidden = path.with_name(_EVICTING + path.name)
        try:
            os.rename(path, hidden)
        except FileNotFoundError:
            return False
        if self._young(os.stat(hidden).st_mtime):
            os.rename(hidden, path)
            return False
        os.unlink(hidden)
        return True

    # -- stock entries ----------------------------------------------------------------

    def _entries(self, deadline: float) -> Iterator[Item]:
        for version in _dirs(self.top):
            if not version.name.startswith("neuronxcc-"):
                continue
            for entry in _dirs(version):
                if time.monotonic() > deadline:
                    return
                state = _entry_state(entry)
                if state is None or not entry.name.startswith("MODULE_"):
                    continue
                if state.busy or (not state.done and self.clock() - state.used < self.abandoned):
                    yield Item(self.clock(), state.size, entry, True)  # counted, never chosen
                else:
                    yield Item(state.used, state.size, entry, True)

    def _remove_entry(self, entry: Path) -> bool:
        lock = _entry_lock(entry)
        if lock is None:
            return False  # not a stock address: not ours to remove
        fd = try_lock(self.root, lock)
        if fd is None:
            return False  # a rank is writing it
        try:
            state = _entry_state(entry)
            if state is None or state.busy or self._young(state.used):
                return False
            if not state.done and self.clock() - state.used < self.abandoned:
                return False
            if state.done and not self._hide_done(entry):
                return False
            return self._discard(entry)
        finally:
            os.close(fd)

    def _hide_done(self, entry: Path) -> bool:
        """``model.done`` renamed away, unless a hit touched the entry meanwhile or a
        compile began in it; then False, and ``model.done`` is put back when no compile
        began (the entry's files are complete)."""
        done, hidden = entry / _DONE, entry / (_EVICTING + _DONE)
        try:
            os.rename(done, hidden)
        except FileNotFoundError:
            return True  # gone already: the entry is not complete either way
        state = _entry_state(entry)  # the hidden model.done's time included
        if state is not None and not state.busy and not self._young(state.used):
            return True
        if state is not None and not state.busy:
            os.rename(hidden, done)
        return False

    def _discard(self, entry: Path) -> bool:
        """Move the entry (no longer complete) out of sight, then empty it."""
        trash = self.root / "evicting" / f"{os.getpid()}.{os.urandom(6).hex()}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(entry, trash)
        _empty(trash)
        return True

    def _empty_trash(self) -> None:
        """Entries a killed evictor moved out of sight and did not finish removing (the
        eviction flock says no other evictor is at work)."""
        for left in _dirs(self.root / "evicting"):
            with contextlib.suppress(OSError):
                _empty(left)

    # -- manifests --------------------------------------------------------------------

    def _orphan_manifests(self, deadline: float) -> list[Path]:
        """Remove manifests older than the grace period whose NEFF blob is gone."""
        removed: list[Path] = []
        for shard in _dirs(self.root / "keys"):
            if time.monotonic() > deadline:
                break
            for found in _scan(shard):
                path = Path(found.path)
                if path.suffix == ".json" and self._orphan(path) and self._remove_manifest(path):
                    removed.append(path)
                    STATS.count(ClientCounter.L1_EVICTED_MANIFESTS)
        return removed

    def _orphan(self, path: Path) -> bool:
        import json

        try:
            if self._young(path.stat().st_mtime):
                return False
            digest = json.loads(path.read_bytes())["files"][_NEFF]["digest"]
        except (OSError, ValueError, KeyError, TypeError):
            return False  # unreadable: the lookup's own checks deal with it
        if not is_digest(digest):
            return False
        return not (self.root / "blobs" / digest[:2] / digest).exists()

    def _remove_manifest(self, path: Path) -> bool:
        fd = try_lock(self.root, path.stem)  # the wrapper's per-key lock
        if fd is None:
            return False
        try:
            return self._unlink_unless_used(path)
        except OSError:
            return False
        finally:
            os.close(fd)


def _by_use(item: Item) -> float:
    return item.used


def try_lock(root: Path, name: str) -> int | None:
    """The flock ``root/locks/<name>.flock`` (LocalStore's), taken without waiting: an
    open descriptor (close it to release), or None when another holds it or it cannot
    be made. The file is never removed (see local.py)."""
    path = root / "locks" / f"{name}.flock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def entry_lock_name(address: str) -> str:
    """The name of the flock the hook holds on a stock address's entry while it fills
    or reads it (proxy.py), which an eviction here must take too."""
    import blake3

    return "entry-" + blake3.blake3(address.encode()).hexdigest()[:32]


def _entry_lock(entry: Path) -> str | None:
    """The hook's per-entry flock name (``entry_lock_name``), None when the
    directory is not at a stock address."""
    from neffcache.keying import KeyingError, parse_neuron_address

    try:
        address = str(parse_neuron_address(f"{entry.parent.name}/{entry.name}"))
    except KeyingError:
        return None
    return entry_lock_name(address)


def _entry_state(entry: Path) -> _EntryState | None:
    """What the entry holds now (its temporaries too: a file being written makes it
    young); None when it cannot be read."""
    newest, size, done, busy = 0.0, 0, False, False
    try:
        for found in _scan(entry, hidden=True, strict=True):
            status = found.stat(follow_symlinks=False)
            newest = max(newest, status.st_mtime)
            if found.is_dir(follow_symlinks=False) or found.name.endswith(_LOCK_SUFFIX):
                busy = True
            else:
                size += status.st_size
                done = done or found.name == _DONE
    except OSError:
        return None
    return _EntryState(newest, size, done, busy)


def _empty(directory: Path) -> None:
    for found in _scan(directory, hidden=True):
        with contextlib.suppress(OSError):
            os.unlink(found.path)
    os.rmdir(directory)


def _dirs(parent: Path) -> Iterator[Path]:
    for found in _scan(parent):
        if found.is_dir(follow_symlinks=False) and not found.name.startswith("."):
            yield Path(found.path)


def _scan(directory: Path, *, hidden: bool = False, strict: bool = False) -> list[os.DirEntry[str]]:
    """``directory``'s entries (hidden ones only if ``hidden``); none when it cannot be
    read, unless ``strict``."""
    try:
        with os.scandir(directory) as found:
            return [e for e in found if hidden or not e.name.startswith(".")]
    except OSError:
        if strict:
            raise
        return []
