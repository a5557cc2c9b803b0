"""The host's level-1 cache and the per-key locks that make ranks share one compile.

Layout under ``NEFFCACHE_LOCAL_DIR`` (which also holds the stock Neuron layout the
persistent-cache hook serves)::

    .neffcache/blobs/ab/abcd...     files by BLAKE3 digest, verified when read
    .neffcache/keys/ab/abcd....json a manifest by canonical or direct key
    .neffcache/locks/<name>.flock   per-key locks (flock: the kernel releases a dead
                                    holder's lock, so a killed rank never blocks others)

Names end in ``.flock``, not ``.lock``: the SDK's ``clear_locks`` removes ``*.lock``
files, and removing a held flock file would let a second holder in.

A read-only L1 (``l1_read_only``: declared by ``NEFFCACHE_LOCAL_READ_ONLY``, or a
directory this process cannot write) is served as it is, verified as any L1 is, and
never written: no hit is marked, no damaged copy removed, no manifest, lock or note
made. What must be written somewhere meanwhile (the SDK's own cache, which takes a lock
file even to look up, docs/neuron-sdk.md#cache-wide-lock) goes to this process's
``staging_dir``, removed when it exits.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3

from neffcache.client._log import log
from neffcache.client.l1access import l1_read_only as l1_read_only
from neffcache.client.l1access import refuse_if_read_only
from neffcache.client.l1limit import used
from neffcache.client.manifests import checked, is_digest
from neffcache.client.stats import STATS
from neffcache.protocol.counters import ClientCounter

if TYPE_CHECKING:
    from neffcache.client.config import ClientConfig

_POLL = 0.05
_LOG_EVERY = 60.0
# Set by the hook for the processes it starts while its SDK's cache is a staging
# directory over a read-only L1: where the shim looks for the SDK's entries (to vouch
# for a stock address) and leaves its notes for the hook (runlog's delegated lines).
SDK_CACHE_VARIABLE = "NEFFCACHE_SDK_CACHE_DIR"


def new_temp(directory: Path, prefix: str) -> tuple[int, Path]:
    """A new, empty, private file in ``directory`` (``tempfile.mkstemp`` without
    ``tempfile``, whose import costs a wrapper hit milliseconds)."""
    refuse_if_read_only(directory)
    made = False
    while True:
        path = directory / f"{prefix}{os.getpid()}.{os.urandom(6).hex()}"
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), path
        except FileExistsError:
            continue
        except FileNotFoundError:
            if made:
                raise
            # Made when first needed, not checked on every write (a hit makes several).
            directory.mkdir(parents=True, exist_ok=True)
            made = True


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so readers
    see the old file or the whole new one."""
    refuse_if_read_only(path.parent)
    fd, tmp = new_temp(path.parent, f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def copy_atomic(src: Path, dest: Path, *, read_meanwhile: bool = True) -> None:
    """Copy ``src`` to ``dest`` through a temporary name in ``dest``'s directory and a
    rename; the kernel copies (``sendfile``). Never a hard link: a file the SDK serves
    or a compiler's ``--output`` must not share its bytes with an L1 blob, or an
    in-place write to one would change the other. ``read_meanwhile=False``: nothing
    reads ``dest`` until this returns (a compiler's ``--output``, read after the
    compiler exits), so an old one is removed first rather than renamed over: ext4
    writes a file out before it replaces another by rename (auto_da_alloc), a
    millisecond for a NEFF, which a new name does not cost."""
    refuse_if_read_only(dest.parent)
    fd, tmp = new_temp(dest.parent, f".{dest.name}.")
    try:
        with open(src, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offset = 0
            while offset < size:
                sent = os.sendfile(fd, f.fileno(), offset, size - offset)
                if sent == 0:
                    raise OSError(f"{src} ended after {offset} of {size} bytes")
                offset += sent
        os.fchmod(fd, 0o644)
        os.close(fd)
        fd = -1
        if not read_meanwhile:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(dest)
        os.replace(tmp, dest)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_CHUNK = 1 << 20
_buffers = threading.local()  # one read buffer per thread: the hook's threads hash too


def file_digest(path: Path) -> str:
    """The BLAKE3 of a file, read into a buffer kept per thread: a fresh bytes object
    per chunk costs more in page faults than the hash (1.5 MiB: 1.0 ms against 0.34)."""
    buffer = getattr(_buffers, "view", None)
    if buffer is None:
        buffer = _buffers.view = memoryview(bytearray(_CHUNK))
    hasher = blake3.blake3()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            hasher.update(buffer[:n])
    return hasher.hexdigest()


class LocalStore:
    def __init__(self, local_dir: str | Path, read_only: bool = False) -> None:
        self.root = Path(local_dir) / ".neffcache"
        self.read_only = read_only  # served as it is, never written (l1_read_only)

    @classmethod
    def of(cls, config: ClientConfig) -> LocalStore:
        """The L1 ``config`` names, read-only when it must be (``l1_read_only``)."""
        return cls(config.local_dir, l1_read_only(config.local_dir, config.local_read_only))

    def blob_path(self, digest: str) -> Path:
        """Where the blob ``digest`` lives. ValueError for anything but 64 hex digits:
        a digest from a manifest must never name a path outside the blob store."""
        if not is_digest(digest):
            raise ValueError(f"not a blob digest: {str(digest)[:80]!r}")
        return self.root / "blobs" / digest[:2] / digest

    def has_blob(self, digest: str, size: int) -> bool:
        """Whether the blob is here with the right bytes; a damaged copy is removed.
        Only a regular file counts: a device or a FIFO planted under a blob's name
        would make the hash below read forever."""
        if not is_digest(digest):
            return False
        path = self.blob_path(digest)
        if not self.read_only:
            used(path)  # first: l1limit's handshake with an eviction under way
        try:
            status = path.stat()
            if not stat.S_ISREG(status.st_mode):
                raise ValueError("not a regular file")
            if status.st_size != size:
                raise ValueError("size")
            if file_digest(path) != digest:
                raise ValueError("digest")
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            STATS.count(ClientCounter.BAD_LOCAL_BLOBS)
            if not self.read_only:  # else it stays, and is never served
                with contextlib.suppress(OSError):
                    path.unlink()
            return False
        return True

    def add_blob(self, src: Path, digest: str) -> Path:
        """Copy a verified file in (no-op when present); returns the stored path.
        OSError when L1 is read-only."""
        if self.read_only:
            raise OSError(errno.EROFS, "L1 is read-only", str(self.root))
        dest = self.blob_path(digest)
        used(dest)  # present: it is about to be published from
        if not dest.exists():
            copy_atomic(src, dest)
        return dest

    def manifest(self, key: str) -> dict[str, Any] | None:
        """The manifest kept under ``key``, checked as a server's is (anything on the
        host may have written the file); None when absent or unusable."""
        if not is_digest(key):
            return None
        path = self.root / "keys" / key[:2] / f"{key}.json"
        try:
            value = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            STATS.count(ClientCounter.BAD_LOCAL_MANIFESTS)
            return None
        return checked(value, f"L1's manifest {path}")

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> bool:
        """Remember ``manifest`` under ``key``; best effort (a full or read-only L1
        costs a later lookup, never the current call): False when it could not."""
        if not is_digest(key) or self.read_only:
            return False
        path = self.root / "keys" / key[:2] / f"{key}.json"
        try:
            atomic_write(path, json.dumps(manifest, sort_keys=True).encode())
        except OSError as exc:
            STATS.count(ClientCounter.LOCAL_ERRORS)
            log.warning("neffcache: cannot write %s: %s", path, exc)
            return False
        return True

    # A compile the SDK ran through the wrapper's shim is one graph, seen by both the
    # wrapper and the hook: the wrapper notes the stock addresses it resolved, so that
    # the hook's line for the same compile sends no second event (runlog.graph).

    def _wrapped_path(self, address: str) -> Path:
        return self.root / "wrapped" / blake3.blake3(address.encode()).hexdigest()[:32]

    def note_wrapped(self, address: str) -> None:
        """The wrapper resolved (served or compiled) the graph at ``address`` now: the
        note is the file's modification time, set to this clock's time by one ``utime``
        (it runs on every wrapper hit: no temporary file and rename). Never in a
        read-only L1: the hook then works in a staging directory, and the shim notes
        there (``SDK_CACHE_VARIABLE``)."""
        if self.read_only:
            return
        path = self._wrapped_path(address)
        now = time.time()
        with contextlib.suppress(OSError):  # then the graph is counted twice, no worse
            try:
                os.utime(path, (now, now))
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
                os.utime(path, (now, now))

    def wrapped_since(self, address: str, since: float) -> bool:
        """Whether the wrapper resolved ``address`` at or after ``since`` (epoch s)."""
        try:
            return os.stat(self._wrapped_path(address)).st_mtime >= since
        except OSError:
            return False

    @contextlib.contextmanager
    def lock(self, name: str, what: str, wait: float = 0.0) -> Iterator[bool]:
        """Hold the lock ``name`` while the block runs; yields True when held. Waits
        while another live process holds it (``wait`` > 0 bounds the wait: then it
        yields False and the caller goes on without it). Yields False too when the
        lock cannot be created at all (a read-only directory): never a reason to fail."""
        fd = self.acquire(name, what, wait)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                release(fd)

    def acquire(self, name: str, what: str, wait: float = 0.0) -> int | None:
        """The lock ``name`` as an open descriptor (``release`` it), or None when it
        could not be taken (see ``lock``). None at once in a read-only L1, where no
        lock file can be made: each process goes on alone."""
        if self.read_only:
            return None
        path = self.root / "locks" / f"{name}.flock"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            STATS.count(ClientCounter.LOCAL_ERRORS)
            log.warning("neffcache: cannot create lock %s: %s", path, exc)
            return None
        if not _acquire(fd, what, wait):
            os.close(fd)
            return None
        with contextlib.suppress(OSError):
            # The holder's pid, for a person looking: written over the last one at a
            # fixed width, never truncated, as ext4 flushes a file truncated to zero
            # (auto_da_alloc), a third of a millisecond every time a lock is taken.
            os.pwrite(fd, f"{os.getpid():<10}\n".encode(), 0)
        return fd


def release(fd: int) -> None:
    os.close(fd)  # closing releases the flock


def _acquire(fd: int, what: str, wait: float) -> bool:
    start = time.monotonic()
    next_log = start + _LOG_EVERY
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                STATS.count(ClientCounter.LOCAL_ERRORS)
                return False
        now = time.monotonic()
        if wait and now - start >= wait:
            STATS.count(ClientCounter.LOCK_WAIT_TIMEOUTS)
            return False
        if now >= next_log:
            holder = _holder(fd)
            log.warning(
                "neffcache: waiting %.0f s for %s (held by pid %s on this host)",
                now - start,
                what,
                holder,
            )
            next_log += _LOG_EVERY
        time.sleep(_POLL)


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip() or "?"
    except OSError:
        return "?"


# -- this process's staging directory -----------------------------------------------------

_STAGING_HELD = ".held"
_staging: dict[int, Path] = {}  # pid -> its directory (a forked child makes its own)


def staging_parent() -> Path:
    """Where every process of this user stages: ``<TMPDIR>/neffcache-staging-<uid>``."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"neffcache-staging-{os.getuid()}"


def staging_dir() -> Path:
    """This process's directory for what must be written while L1 is read-only:
    ``staging_parent()/<pid>.<random>``, made on first use and removed when the process
    exits (with the parent, once empty). The process holds a flock on a file in it for
    its lifetime, so one left by a killed process is removed by the next process that
    makes one. OSError when it cannot be made."""
    pid = os.getpid()
    made = _staging.get(pid)
    if made is not None:
        return made
    parent = staging_parent()
    parent.mkdir(mode=0o700, exist_ok=True)
    _sweep(parent)
    made = parent / f"{pid}.{os.urandom(6).hex()}"
    made.mkdir(mode=0o700)
    held = os.open(made / _STAGING_HELD, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # kept open: released when the process ends
    _staging[pid] = made
    _remove_at_exit(pid, made)
    return made


def _remove_at_exit(pid: int, made: Path) -> None:
    import atexit

    def remove() -> None:
        if os.getpid() == pid and _staging.pop(pid, None) is not None:  # not a fork's exit
            _remove_staging(made)

    atexit.register(remove)
    # A multiprocessing worker ends in os._exit after multiprocessing's finalizers,
    # never running atexit (neuron_parallel_compile's pool).
    import sys

    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        from multiprocessing.util import Finalize

        Finalize(None, remove, exitpriority=0)


def _remove_staging(made: Path) -> None:
    import shutil

    shutil.rmtree(made, ignore_errors=True)
    tidy_staging()


def tidy_staging() -> None:
    """Remove ``staging_parent()`` if it is empty (another process may stage there)."""
    with contextlib.suppress(OSError):
        os.rmdir(staging_parent())


def _sweep(parent: Path) -> None:
    """Remove the staging directories of processes that are gone: a free flock."""
    with contextlib.suppress(OSError), os.scandir(parent) as found:
        for entry in found:
            try:
                fd = os.open(os.path.join(entry.path, _STAGING_HELD), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # being made (no flock file yet), or not a staging directory
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its process lives
            finally:
                os.close(fd)
            import shutil

            shutil.rmtree(entry.path, ignore_errors=True)


def link_entry(source: Path, entry: Path) -> bool:
    """Serve the stock entry ``source`` of a read-only L1 at ``entry`` (in the SDK's
    cache, a staging directory) by symbolic links to its files, ``model.done`` last:
    nothing is copied, nothing in ``source`` written. Only a complete entry
    (``model.done`` and ``model.neff``) is linked, and only its regular files with an
    artifact's name: anything on the host may have put it there, and a link out of it
    or a FIFO would be served or hang a read. Names ``entry`` already has stay (the
    SDK may have written the graph's HLO first). True when linked."""
    from neffcache.keying import STOCK_DONE, STOCK_NEFF, is_stock_artifact

    names = []
    try:
        with os.scandir(source) as found:
            for item in found:
                wanted = item.name == STOCK_DONE or is_stock_artifact(item.name)
                if wanted and item.is_file(follow_symlinks=False):
                    names.append(item.name)
    except OSError:
        return False
    if STOCK_DONE not in names or STOCK_NEFF not in names:
        return False
    names.sort(key=lambda name: name == STOCK_DONE)
    try:
        entry.mkdir(parents=True, exist_ok=True)
        for name in names:
            if not os.path.lexists(entry / name):
                os.symlink(os.path.abspath(source / name), entry / name)
    except OSError as exc:
        STATS.count(ClientCounter.LOCAL_ERRORS)
        log.warning("neffcache: cannot serve %s from the read-only L1: %s", source, exc)
        return False
    return True
