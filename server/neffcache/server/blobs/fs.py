"""A blob store on a local or shared POSIX filesystem: ``file:///var/cache/neffcache``.

Layout under the root::

    blobs/ab/abcdef…                   one file per blob, fanned out by its first two digits
    staging/<area>/uploads/…           upload files, one area per open store (process)
    quarantine/<digest>.<timestamp>    blobs whose bytes stopped matching their digest
    documents/<name>                   named documents (documents.py): the index's durable copy

A blob appears only through ``os.link`` from a complete, fsynced staging file, so a
reader never sees a partial blob and a stored blob is never replaced.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Hashable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import FULL_ERRNOS, StoreError, StoreFull

from .base import DIGEST_PATTERN, BlobInfo
from .documents import check_name, check_prefix, is_name

_CHUNK = 1 << 20
# A read of a known span up to this long is one read into one buffer: the server sends
# a blob up to 16 MiB in one write (services/blobs.py), and 1 MiB reads joined again cost a
# quarter more CPU per byte (measured with 8 MiB blobs).
_WHOLE = 16 << 20
_LOCK_NAME = "lock"
_UPLOADS_NAME = "uploads"
_SETUP_PREFIX = ".setup-"
# An area is renamed out of its setup name microseconds after creation; a setup
# directory this old belongs to a process killed in between.
_STALE_SETUP_SECONDS = 3600
_DIGEST = re.compile(DIGEST_PATTERN)
_FANOUT = re.compile(r"[0-9a-f]{2}")


@contextmanager
def os_errors(action: str) -> Iterator[None]:
    """Translate OSError into the store exception tree (StoreFull when out of space)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise StoreFull(f"{action}: {exc}") from exc
        raise StoreError(f"{action}: {exc}") from exc


def quarantine_stamp() -> str:
    """A sortable UTC timestamp for quarantined names, readable by an operator."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


class StagingArea:
    """This process's directory for upload files, under a parent that other processes
    (uvicorn workers, replicas on a shared filesystem) may share.

    An area holds an exclusive ``flock`` on its lock file while open. At start-up an
    area whose lock can be taken belongs to a dead process, so it is removed with what
    its killed uploads left; areas of live processes are left alone. (On NFS, Linux
    emulates flock with per-process locks: open one store per process there.) ``path``
    is the area's ``uploads/``, so it holds upload files and nothing else.
    """

    def __init__(self, parent: Path) -> None:
        with os_errors(f"prepare staging area in {parent}"):
            parent.mkdir(parents=True, exist_ok=True)
            _remove_dead_areas(parent)
            self._area, self._lock_fd = _new_area(parent)
        self.path = self._area / _UPLOADS_NAME

    def close(self) -> None:
        # Remove while still locked, so no cleaner races us for the same directory.
        shutil.rmtree(self._area, ignore_errors=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _new_area(parent: Path) -> tuple[Path, int]:
    # Built under a name cleaners skip, locked, then renamed into view: a cleaner can
    # never find an area whose lock is not yet held.
    setup = Path(tempfile.mkdtemp(prefix=_SETUP_PREFIX, dir=parent))
    fd = os.open(setup / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (setup / _UPLOADS_NAME).mkdir()
        area = parent / setup.name.removeprefix(_SETUP_PREFIX)
        os.rename(setup, area)
    except BaseException:
        os.close(fd)
        shutil.rmtree(setup, ignore_errors=True)
        raise
    return area, fd


def _remove_dead_areas(parent: Path) -> None:
    for entry in parent.iterdir():
        if entry.name.startswith(_SETUP_PREFIX):
            _remove_if_stale(entry)
        elif entry.is_dir() and not entry.is_symlink():
            _remove_area_if_dead(entry)
        else:
            # Nothing writes loose files here; they are leftovers, never blobs.
            entry.unlink(missing_ok=True)


def _remove_if_stale(setup: Path) -> None:
    try:
        age = time.time() - setup.lstat().st_mtime
    except FileNotFoundError:
        return  # renamed into place (or removed) since the listing
    if age > _STALE_SETUP_SECONDS:
        shutil.rmtree(setup, ignore_errors=True)


def _remove_area_if_dead(area: Path) -> None:
    try:
        fd = os.open(area / _LOCK_NAME, os.O_RDWR)
    except FileNotFoundError:
        # Live areas always have a lock file; this one was part-removed by a cleaner.
        shutil.rmtree(area, ignore_errors=True)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # its process is alive
    else:
        shutil.rmtree(area, ignore_errors=True)
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _root_from_url(url: str) -> Path:
    parts = urlsplit(url)
    form = "use file:///absolute/path (three slashes)"
    if parts.scheme != "file" or parts.query or parts.fragment:
        raise ConfigError(f"blob store URL {url!r} is not a plain file:// URL; {form}")
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(
            f"blob store URL {url!r} names host {parts.netloc!r}; relative paths are not "
            f"allowed, {form}"
        )
    path = unquote(parts.path)
    if not path:
        raise ConfigError(f"blob store URL {url!r} has no path; {form}")
    if not path.startswith("/"):
        raise ConfigError(f"blob store URL {url!r} has a relative path; {form}")
    return Path(path)


class FsBlobStore:
    """Blobs as files under a root directory, created if missing.

    >>> store = FsBlobStore.from_url("file:///var/cache/neffcache")
    >>> staged = store.staging_dir() / "upload-1"   # the server writes and verifies it
    >>> store.commit(staged, digest)                # True: published; False: already there

    Thread-safe: it keeps no state but the filesystem and its staging lock.
    """

    # Answers come from this machine: the server may call it on its event loop.
    local = True
    # Reads of a verified, unchanged file skip hashing (stamp): the scrub re-reads them.
    scrubbed = True

    def __init__(self, root: Path) -> None:
        self._root = root
        self._blobs = root / "blobs"
        self._quarantine = root / "quarantine"
        self._documents = root / "documents"
        with os_errors(f"create blob store at {root}"):
            self._blobs.mkdir(parents=True, exist_ok=True)
            self._quarantine.mkdir(exist_ok=True)
            self._documents.mkdir(exist_ok=True)
        self._staging = StagingArea(root / "staging")

    @classmethod
    def from_url(cls, url: str) -> FsBlobStore:
        return cls(_root_from_url(url))

    @property
    def root(self) -> Path:
        """The directory the store's URL names; a blob is ``blobs/ab/<digest>`` under it."""
        return self._root

    def _blob_path(self, digest: str) -> Path:
        return self._blobs / digest[:2] / digest

    def staging_dir(self) -> Path:
        return self._staging.path

    def commit(self, staged: Path, digest: str) -> bool:
        blob = self._blob_path(digest)
        try:
            with os_errors(f"commit blob {digest}"):
                _fsync(staged)
                self._make_fanout(blob.parent)
                try:
                    # Unlike rename, link fails if the name exists: never replace a blob.
                    os.link(staged, blob)
                except FileExistsError:
                    return False
                _fsync(blob.parent)
                return True
        finally:
            # The staged file is the only partial file a failure can leave behind.
            with suppress(OSError):
                staged.unlink(missing_ok=True)

    def _make_fanout(self, fanout: Path) -> None:
        try:
            fanout.mkdir()
        except FileExistsError:
            return
        # A new fan-out directory must survive a crash before a blob relies on it.
        _fsync(self._blobs)

    def size(self, digest: str) -> int | None:
        with os_errors(f"stat blob {digest}"):
            try:
                return os.stat(self._blob_path(digest)).st_size
            except FileNotFoundError:
                return None

    def read(self, digest: str, start: int = 0, end: int | None = None) -> Iterator[bytes] | None:
        chunks = _FileChunks(self._blob_path(digest), start, end)
        # Run it to its first yield so the file is opened now: a blob quarantined later
        # still streams whole, and a miss is None rather than an empty stream.
        if next(chunks, None) is None:
            return None
        return chunks

    def stamp(self, digest: str) -> tuple[Hashable, float] | None:
        with os_errors(f"stat blob {digest}"):
            try:
                st = os.stat(self._blob_path(digest))
            except FileNotFoundError:
                return None
        return _stamp_of(st), max(st.st_mtime_ns, st.st_ctime_ns) / 1e9

    def open_file(self, digest: str) -> OpenBlob | None:
        """The blob's file, open, or None when there is no such blob."""
        with os_errors(f"open blob {digest}"):
            try:
                file = self._blob_path(digest).open("rb")
            except FileNotFoundError:
                return None
            try:
                return OpenBlob(file)
            except BaseException:
                file.close()
                raise

    def local_path(self, digest: str) -> Path | None:
        return self._blob_path(digest) if self.size(digest) is not None else None

    def quarantine(self, digest: str) -> None:
        target = self._quarantine / f"{digest}.{quarantine_stamp()}"
        with os_errors(f"quarantine blob {digest}"):
            # Recreated in case an operator emptied it by removing it; otherwise the
            # FileNotFoundError below would hide the failure and keep the bad blob.
            self._quarantine.mkdir(exist_ok=True)
            with suppress(FileNotFoundError):
                os.replace(self._blob_path(digest), target)

    def delete(self, digest: str) -> bool:
        with os_errors(f"delete blob {digest}"):
            try:
                os.unlink(self._blob_path(digest))
            except FileNotFoundError:
                return False
            return True

    def blobs(self) -> Iterator[BlobInfo]:
        # Only blobs/ is walked, so staging and quarantine files never show up; within
        # it, only a digest-named file in its own fan-out directory is a blob.
        for fanout in _scan(self._blobs, missing_ok=False):
            if not _FANOUT.fullmatch(fanout.name) or not _is_dir(fanout):
                continue
            for entry in _scan(Path(fanout.path), missing_ok=True):
                if _DIGEST.fullmatch(entry.name) and entry.name[:2] == fanout.name:
                    info = _blob_info(entry)
                    if info is not None:
                        yield info

    # --- documents

    def put_document(self, name: str, data: bytes, *, create_only: bool = False) -> bool:
        path = self._documents / check_name(name)
        with os_errors(f"write document {name}"):
            self._make_parents(path.parent)
            # Written in the staging area and moved into place: a crash leaves the old
            # document or the new one, and only a staging file to clean up.
            fd, temp = tempfile.mkstemp(dir=self._staging.path, prefix="document-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if create_only:
                    try:
                        os.link(temp, path)  # unlike rename, fails if the name exists
                    except FileExistsError:
                        return False
                    finally:
                        os.unlink(temp)
                else:
                    os.replace(temp, path)
            except BaseException:
                with suppress(OSError):
                    os.unlink(temp)
                raise
            _fsync(path.parent)
            return True

    def _make_parents(self, directory: Path) -> None:
        if directory.is_dir():
            return
        directory.mkdir(parents=True, exist_ok=True)
        # New directories must survive a crash before a document relies on them.
        for parent in (directory, *directory.parents):
            _fsync(parent)
            if parent == self._documents:
                break

    def get_document(self, name: str) -> bytes | None:
        with os_errors(f"read document {name}"):
            try:
                return (self._documents / check_name(name)).read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None

    def delete_document(self, name: str) -> bool:
        path = self._documents / check_name(name)
        with os_errors(f"delete document {name}"):
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return False
            # Durable too: a document back after a crash would restore what was removed.
            _fsync(path.parent)
            return True

    def documents(self, prefix: str) -> Iterator[str]:
        start = self._documents / check_prefix(prefix) if prefix else self._documents
        yield from _walk_documents(start, prefix)

    def check(self) -> None:
        with os_errors(f"blob store at {self._root} is not usable"):
            if not self._blobs.is_dir():
                raise StoreError(f"blob store at {self._root} has no blobs directory")
            # A real write, not os.access: root passes access checks on any mode.
            fd, probe = tempfile.mkstemp(dir=self._staging.path, prefix="check-")
            os.close(fd)
            os.unlink(probe)

    def close(self) -> None:
        self._staging.close()


def _scan(directory: Path, *, missing_ok: bool) -> Iterator[os.DirEntry[str]]:
    """The entries of ``directory``, read lazily; nothing if it is gone and
    ``missing_ok``. Other OSErrors become StoreError."""
    action = f"list {directory}"
    with os_errors(action):
        try:
            entries = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            # NotADirectoryError: a document listed as if it were a folder of them.
            if missing_ok:
                return
            raise
    with entries:
        while True:
            with os_errors(action):
                entry = next(entries, None)
            if entry is None:
                return
            yield entry


def _walk_documents(directory: Path, prefix: str) -> Iterator[str]:
    """Document names under ``directory``, which holds those starting with ``prefix``."""
    for entry in _scan(directory, missing_ok=True):
        if _is_dir(entry):
            yield from _walk_documents(Path(entry.path), f"{prefix}{entry.name}/")
        elif is_name(prefix + entry.name):
            yield prefix + entry.name


def _is_dir(entry: os.DirEntry[str]) -> bool:
    with os_errors(f"stat {entry.path}"):
        return entry.is_dir()  # False if it vanished since the listing


def _blob_info(entry: os.DirEntry[str]) -> BlobInfo | None:
    """What a digest-named entry holds; None if it vanished since the listing or is
    not a regular file (size and read follow symlinks, so this does too)."""
    with os_errors(f"stat blob {entry.name}"):
        try:
            st = entry.stat()
        except FileNotFoundError:
            return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return BlobInfo(entry.name, st.st_size, st.st_mtime)


def _stamp_of(st: os.stat_result) -> tuple[int, int, int, int, int]:
    # ctime: set by the kernel on every change to the inode, never by a user.
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _FileChunks:
    """The chunks of one open blob file (``_read_file``), and ``unchanged_since``:
    whether that file, the one read and not whatever has its name now, still had a
    given stamp once its last bytes were read. So a blob collected, or collected and
    uploaded again (a new file under its name), while it is read is judged by the bytes
    that were read."""

    def __init__(self, path: Path, start: int, end: int | None) -> None:
        self._after: list[os.stat_result] = []  # the open file's stat after its last read
        self._chunks = _read_file(path, start, end, self._after)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)

    def unchanged_since(self, stamp: Hashable) -> bool:
        """Whether the file read had ``stamp`` (``FsBlobStore.stamp``) after it was
        read to the end; False before then. An unlinked file (collected) counts as
        unchanged when only its ctime moved: unlinking sets it, and a file without a
        name changes its bytes only through an open descriptor, which sets mtime."""
        return bool(self._after) and _still(self._after[-1], stamp)


def _still(st: os.stat_result, stamp: Hashable) -> bool:
    """Whether an open blob file, whose stat is now ``st``, still has ``stamp``; an
    unlinked one (collected) when only its ctime moved (``_FileChunks.unchanged_since``)."""
    found = _stamp_of(st)
    if st.st_nlink == 0 and isinstance(stamp, tuple):
        return found[:4] == stamp[:4]
    return found == stamp


class OpenBlob:
    """A blob's file, open for a server that sends it itself (``os.sendfile``); the
    caller closes it."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.size = os.fstat(file.fileno()).st_size

    def fileno(self) -> int:
        return self._file.fileno()

    def unchanged_since(self, stamp: Hashable) -> bool:
        """Whether this file, the one opened and not whatever has its name now, has
        ``stamp`` (``FsBlobStore.stamp``) now."""
        return _still(os.fstat(self._file.fileno()), stamp)

    def close(self) -> None:
        self._file.close()


def _read_file(
    path: Path, start: int, end: int | None, after: list[os.stat_result]
) -> Iterator[bytes]:
    """Yields b"" once the file is open (see ``read``), then [start, end) in chunks,
    then appends the open file's stat to ``after``; yields nothing if the file is
    absent."""
    with os_errors(f"read {path.name}"):
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return
        with f:
            yield b""
            f.seek(start)
            remaining = None if end is None else max(0, end - start)
            step = remaining if remaining is not None and remaining <= _WHOLE else _CHUNK
            while remaining != 0:
                data = f.read(step if remaining is None else min(step, remaining))
                if not data:
                    break
                if remaining is not None:
                    remaining -= len(data)
                yield data
            after.append(os.fstat(f.fileno()))
