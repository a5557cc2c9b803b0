"""STAND-IN for ``libneuronxla.neuron_cc_cache``; this is NOT AWS's code (whose source is
not public, docs/neuron-sdk.md#provenance).

Written only from docs/neuron-sdk.md:

* #cache-location: how the cache location is chosen (:meth:`CacheUrl.get_cache_url`);
* #entry-layout: the on-disk layout of an entry; #entry-states: the four entry states
  (:meth:`CompileCacheFs.get_hlos`);
* #compiler-version-directory and #flags-hash: the
  ``neuronxcc-<version>/MODULE_<key>+<flags8>`` path and the flags hash (the neuronxcc
  >= 2.15 ``md5(json.dumps(list))`` form);
* #locking: the cache-wide ``<root>/lock`` taken by every ``CompileCacheFs`` method
  (``with self.lock_dir:`` in a decorator, ``open(lock_path, 'w')``), and the
  existence-based per-entry ``<hlo>.lock`` that never expires;
* #libneuronxla-cache-api: the API surface (``CompileCache``, ``CompileCacheFs``,
  ``CompileCacheS3``, ``CacheEntry``, ``create_compile_cache``);
* #neuronx-cc-version-output: the compiler version, parsed from ``neuronx-cc --version``.

Stand-in environment variable (not a real SDK variable):

* ``NEFFCACHE_STANDIN_LOCK_TIMEOUT``: seconds after which :meth:`hlo_acquire_lock` gives
  up with ``TimeoutError``. Unset (the default) waits forever, as the real SDK does; it
  exists only so tests cannot hang on a stale lock.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Concatenate, ParamSpec, TextIO, TypeVar

from libneuronxla import libncc

logger = logging.getLogger(__name__)

DEFAULT_CACHE_URL = "/var/tmp/neuron-compile-cache"
ROOT_LOCK_NAME = "lock"
HLO_FILENAME = "model.hlo_module.pb"
# docs/neuron-sdk.md#entry-layout: logs from neuronxcc 2.0 to 2.12 name the HLO
# model.hlo.pb.
LEGACY_HLO_FILENAME = "model.hlo.pb"
HLO_FILENAMES = (HLO_FILENAME, LEGACY_HLO_FILENAME)
FLAGS_FILENAME = "compile_flags.json"
NEFF_FILENAME = "model.neff"
DONE_FILENAME = "model.done"
LOG_FILENAME = "model.log"
LOCK_SUFFIX = ".lock"

# [GUESS] Neither interval is in docs/neuron-sdk.md. The wait message repeats every
# minute because it counts minutes; the poll is short so tests run fast.
LOCK_POLL_SECONDS = 0.05
LOCK_LOG_SECONDS = 60.0

CACHE_STRUCTURE_INFO = """\
(neffcache test stand-in; the real help text was not seen)
<cache_root>/lock
<cache_root>/neuronxcc-<compiler version>/MODULE_<module key>+<flags hash>/
    model.hlo_module.pb, compile_flags.json, model.neff, model.done (0 bytes),
    model.log (failed compile), model.hlo_module.pb.lock (compiling)
"""

VERSION_RE = re.compile(r"NeuronX Compiler version (\S+)")
_COMPILER_VERSIONS: dict[str, str] = {}


def get_compiler_version() -> str:
    """The full version of the ``neuronx-cc`` on PATH
    (docs/neuron-sdk.md#neuronx-cc-version-output), cached per binary."""
    path = shutil.which("neuronx-cc")
    if path is None:
        raise RuntimeError("neuronx-cc was not found on PATH")
    cached = _COMPILER_VERSIONS.get(path)
    if cached is not None:
        return cached
    done = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    # docs/neuron-sdk.md#neuronx-cc-version-output: public callers read stdout or stderr;
    # read both.
    match = VERSION_RE.search(done.stdout) or VERSION_RE.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise RuntimeError(
            f"could not read the compiler version from {path} --version "
            f"(exit {done.returncode}): {done.stdout!r} {done.stderr!r}"
        )
    _COMPILER_VERSIONS[path] = match.group(1)
    return match.group(1)


class CacheUrl:
    """A cache location: a directory (``fs``) or an S3 prefix (``s3``),
    docs/neuron-sdk.md#cache-location."""

    def __init__(self, url: str, url_type: str = "fs") -> None:
        if url_type not in ("fs", "s3"):
            raise ValueError(f"unknown cache url type {url_type!r}")
        self.url = url
        self.url_type = url_type

    def is_s3(self) -> bool:
        return self.url_type == "s3"

    def __repr__(self) -> str:
        return f"CacheUrl({self.url!r}, url_type={self.url_type!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheUrl):
            return NotImplemented
        return (self.url, self.url_type) == (other.url, other.url_type)

    def __hash__(self) -> int:
        return hash((self.url, self.url_type))

    @classmethod
    def from_string(cls, url: str) -> CacheUrl:
        if url.startswith("s3://"):
            return cls(url, url_type="s3")
        # docs/neuron-sdk.md#cache-location: whether file:// is stripped is not documented.
        # [GUESS] It is tolerated.
        if url.startswith("file://"):
            url = url[len("file://") :]
        return cls(url, url_type="fs")

    @classmethod
    def get_cache_url(cls, cache_dir: str | None = None) -> CacheUrl:
        """The precedence of docs/neuron-sdk.md#cache-location: the ``cache_dir``
        argument, then ``--cache_dir`` in ``NEURON_CC_FLAGS``, then
        ``NEURON_COMPILE_CACHE_URL``, then the default."""
        url = (
            cache_dir
            or libncc.setup_args()[0].cache_dir
            or os.environ.get("NEURON_COMPILE_CACHE_URL")
            or DEFAULT_CACHE_URL
        )
        return cls.from_string(url)


# Re-entrancy bookkeeping for the cache-wide lock: per thread, lock path -> [file, depth].
_held = threading.local()


def _held_locks() -> dict[str, tuple[TextIO, list[int]]]:
    held: dict[str, tuple[TextIO, list[int]]] | None = getattr(_held, "locks", None)
    if held is None:
        held = {}
        _held.locks = held
    return held


class CacheLock:
    """The cache-wide lock ``<root>/lock`` (docs/neuron-sdk.md#cache-wide-lock).

    ``__enter__`` opens the file with ``open(lock_path, 'w')``, exactly as the real
    traceback shows, so a read-only cache directory fails with PermissionError / EROFS
    even for a lookup. [GUESS] ``fcntl.flock`` on that descriptor (#cache-wide-lock). The
    lock is re-entrant within one thread because cache methods call each other; other
    threads and processes open their own descriptor and wait.
    """

    def __init__(self, cache_path: str) -> None:
        self.cache_path = cache_path
        self.lock_path = os.path.abspath(os.path.join(cache_path, ROOT_LOCK_NAME))

    def __enter__(self) -> CacheLock:
        held = _held_locks()
        if self.lock_path in held:
            held[self.lock_path][1][0] += 1
            return self
        # [GUESS] The real cache creates its root on first use.
        os.makedirs(self.cache_path, exist_ok=True)
        lock_fd = open(self.lock_path, "w")  # held until __exit__
        try:
            fcntl.flock(lock_fd.fileno(), fcntl.LOCK_EX)
        except BaseException:
            lock_fd.close()
            raise
        held[self.lock_path] = (lock_fd, [1])
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held = _held_locks()
        lock_fd, depth = held[self.lock_path]
        depth[0] -= 1
        if depth[0] == 0:
            del held[self.lock_path]
            fcntl.flock(lock_fd.fileno(), fcntl.LOCK_UN)
            lock_fd.close()


P = ParamSpec("P")
R = TypeVar("R")
FsT = TypeVar("FsT", bound="CompileCacheFs")


def with_cache_lock(method: Callable[Concatenate[FsT, P], R]) -> Callable[Concatenate[FsT, P], R]:
    """Run ``method`` holding the cache-wide lock (docs/neuron-sdk.md#cache-wide-lock:
    ``with self.lock_dir:``)."""

    def wrapper(self: FsT, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.lock_dir:
            return method(self, *args, **kwargs)

    functools.update_wrapper(wrapper, method)
    return wrapper


def _lock_timeout_from_env() -> float | None:
    raw = os.environ.get("NEFFCACHE_STANDIN_LOCK_TIMEOUT", "")
    return float(raw) if raw else None


class CompileCache:
    """Base class with the surface of docs/neuron-sdk.md#libneuronxla-cache-api. Backends
    override the I/O methods."""

    def __init__(self, cache_url: CacheUrl) -> None:
        self.cache_url = cache_url
        self.cache_path = cache_url.url
        self.cache_type = cache_url.url_type

    def _join(self, *parts: str) -> str:
        return os.path.join(*parts)

    @staticmethod
    def get_compiler_flags_hash(compiler_flags: str | list[str]) -> str:
        """8 hex digits: ``md5(json.dumps(list_of_flag_tokens))[:8]``
        (docs/neuron-sdk.md#flags-hash, the neuronxcc >= 2.15 form). A string is split
        with ``shlex`` first; the raw-string form of neuronxcc <= 2.13 is not
        reproduced."""
        if isinstance(compiler_flags, str):
            compiler_flags = shlex.split(compiler_flags)
        preimage = json.dumps(list(compiler_flags)).encode("utf-8")
        return hashlib.md5(preimage, usedforsecurity=False).hexdigest()[:8]

    def get_cache_dir_with_cache_key(self, cache_key: str) -> str:
        # [GUESS] Every key, "MODULE_<x>" or "0_REGISTRY/<ver>", lives under the
        # compiler-version directory.
        return self._join(self.cache_path, f"neuronxcc-{get_compiler_version()}", cache_key)

    def get_cache_dir(
        self, model_hash: str | int, compile_flags_str: str | list[str]
    ) -> tuple[str, str]:
        """``(<root>/neuronxcc-<version>/<cache_key>, cache_key)`` with
        ``cache_key = MODULE_<model_hash>+<flags8>`` (docs/neuron-sdk.md#entry-layout and
        #stock-address)."""
        cache_key = f"MODULE_{model_hash}+{self.get_compiler_flags_hash(compile_flags_str)}"
        return self.get_cache_dir_with_cache_key(cache_key), cache_key

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def download_file(self, path: str, dst_path: str) -> None:
        raise NotImplementedError

    def download_file_to_string(self, path: str, limit: int | None = None) -> str:
        raise NotImplementedError

    def download_folder(self, folder_path: str, dst_path: str) -> bool:
        raise NotImplementedError

    def upload_file(self, cache_path: str, src_path: str) -> None:
        raise NotImplementedError

    def upload_folder(self, cache_dir: str, src_dir: str) -> None:
        raise NotImplementedError

    def upload_string_to_file(self, cache_path: str, data: str | bytes) -> None:
        raise NotImplementedError

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def clean(self) -> None:
        raise NotImplementedError

    def clear_locks(self) -> None:
        raise NotImplementedError

    def clear_neffs(self) -> None:
        raise NotImplementedError

    def get_hlos(
        self, failed_neff_str: str = ""
    ) -> tuple[list[str], list[str], list[str], list[str]]:
        raise NotImplementedError

    def hlo_acquire_lock(self, hlo_path: str, timeout: float | None = None) -> None:
        raise NotImplementedError

    def hlo_release_lock(self, hlo_path: str) -> None:
        raise NotImplementedError

    def try_lookup_for_compile(self, hlo_path: str) -> CacheEntry | None:
        raise NotImplementedError

    # download_artifacts(parent_dir, dst) exists only in newer SDKs
    # (docs/neuron-sdk.md#libneuronxla-cache-api, callers check hasattr). This stand-in
    # models an SDK without it.


class CacheEntry:
    """One entry, for the parallel-compile flow (docs/neuron-sdk.md#per-entry-compile-lock,
    #parallel-compile and #libneuronxla-cache-api).

    ``with entry:`` holds the entry's compile lock (``<hlo path>.lock``); ``.exists`` is
    true when ``model.done`` is present.
    """

    def __init__(self, cache: CompileCache, hlo_path: str, lock_timeout: float | None = None):
        self.cache = cache
        self.hlo_path = hlo_path
        self.entry_dir = os.path.dirname(hlo_path)
        # [GUESS] The key is the entry directory's name, MODULE_<key>+<flags8>.
        self.key = os.path.basename(self.entry_dir)
        self.lock_timeout = lock_timeout

    @property
    def exists(self) -> bool:
        return self.cache.exists(os.path.join(self.entry_dir, DONE_FILENAME))

    def download_hlo(self, dst_path: str) -> None:
        self.cache.download_file(self.hlo_path, dst_path)

    def __enter__(self) -> CacheEntry:
        self.cache.hlo_acquire_lock(self.hlo_path, timeout=self.lock_timeout)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cache.hlo_release_lock(self.hlo_path)

    def __repr__(self) -> str:
        return f"CacheEntry({self.hlo_path!r})"


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{uuid.uuid4().hex}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class CompileCacheFs(CompileCache):
    """The directory backend. Every public method holds ``<root>/lock``
    (docs/neuron-sdk.md#cache-wide-lock)."""

    def __init__(self, cache_url: CacheUrl) -> None:
        super().__init__(cache_url)
        self.lock_dir = CacheLock(self.cache_path)

    @with_cache_lock
    def get_cache_dir_with_cache_key(self, cache_key: str) -> str:
        return super().get_cache_dir_with_cache_key(cache_key)

    @with_cache_lock
    def get_cache_dir(
        self, model_hash: str | int, compile_flags_str: str | list[str]
    ) -> tuple[str, str]:
        return super().get_cache_dir(model_hash, compile_flags_str)

    @with_cache_lock
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    @with_cache_lock
    def download_file(self, path: str, dst_path: str) -> None:
        parent = os.path.dirname(dst_path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        shutil.copyfile(path, dst_path)

    @with_cache_lock
    def download_file_to_string(self, path: str, limit: int | None = None) -> str:
        with open(path, "rb") as f:
            data = f.read() if limit is None else f.read(limit)
        return data.decode("utf-8", errors="replace")

    @with_cache_lock
    def download_folder(self, folder_path: str, dst_path: str) -> bool:
        if not os.path.isdir(folder_path):
            return False
        shutil.copytree(
            folder_path,
            dst_path,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("*" + LOCK_SUFFIX, ROOT_LOCK_NAME),
        )
        return True

    @with_cache_lock
    def upload_file(self, cache_path: str, src_path: str) -> None:
        def write(tmp: str) -> None:
            shutil.copyfile(src_path, tmp)

        _atomic_write(cache_path, write)

    @with_cache_lock
    def upload_folder(self, cache_dir: str, src_dir: str) -> None:
        for directory, _, files in os.walk(src_dir):
            for name in files:
                src = os.path.join(directory, name)
                self.upload_file(os.path.join(cache_dir, os.path.relpath(src, src_dir)), src)

    @with_cache_lock
    def upload_string_to_file(self, cache_path: str, data: str | bytes) -> None:
        payload = data.encode("utf-8") if isinstance(data, str) else data

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(payload)

        _atomic_write(cache_path, write)

    @with_cache_lock
    def remove(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)

    @with_cache_lock
    def clean(self) -> None:
        """Remove everything in the cache. [GUESS] The root ``lock`` file stays: it is
        held while cleaning."""
        for name in os.listdir(self.cache_path):
            if name != ROOT_LOCK_NAME:
                self.remove(os.path.join(self.cache_path, name))

    @with_cache_lock
    def clear_locks(self) -> None:
        """Remove every ``*.lock`` file under the root
        (docs/neuron-sdk.md#per-entry-compile-lock, ``clear-locks``)."""
        for directory, _, files in os.walk(self.cache_path):
            for name in files:
                if name.endswith(LOCK_SUFFIX):
                    os.unlink(os.path.join(directory, name))

    @with_cache_lock
    def clear_neffs(self) -> None:
        """[GUESS] ``clear-neffs`` (docs/neuron-sdk.md#report-and-commands) removes the
        compile results (``model.neff``, ``model.done``, ``model.log``) and keeps the
        HLO and flags, so every entry goes back to the "Empty" state."""
        for hlo in self._all_hlos():
            entry_dir = os.path.dirname(hlo)
            for name in (NEFF_FILENAME, DONE_FILENAME, LOG_FILENAME):
                self.remove(os.path.join(entry_dir, name))

    def _all_hlos(self) -> list[str]:
        # [GUESS] Every compiler-version directory is scanned, not only the current one.
        found: list[str] = []
        for directory, _, files in os.walk(self.cache_path):
            found.extend(os.path.join(directory, name) for name in files if name in HLO_FILENAMES)
        return sorted(found)

    @with_cache_lock
    def get_hlos(
        self, failed_neff_str: str = ""
    ) -> tuple[list[str], list[str], list[str], list[str]]:
        """``(todo, locked, done, failed)`` HLO paths, by the state table of
        docs/neuron-sdk.md#entry-states.

        [GUESS] The order of the checks is done, then locked, then failed, then todo; the
        docs give the states, not which wins when files of two states are present.
        [GUESS] ``failed_neff_str``: when non-empty, an entry whose ``model.neff``
        contains it also counts as failed (older SDKs named a "cached failed neff").
        """
        todo: list[str] = []
        locked: list[str] = []
        done: list[str] = []
        failed: list[str] = []
        for hlo in self._all_hlos():
            entry_dir = os.path.dirname(hlo)
            neff = os.path.join(entry_dir, NEFF_FILENAME)
            if os.path.exists(os.path.join(entry_dir, DONE_FILENAME)):
                done.append(hlo)
            elif os.path.exists(hlo + LOCK_SUFFIX):
                locked.append(hlo)
            elif os.path.exists(os.path.join(entry_dir, LOG_FILENAME)) or (
                failed_neff_str
                and os.path.exists(neff)
                and failed_neff_str.encode("utf-8") in _read_bytes(neff)
            ):
                failed.append(hlo)
            else:
                todo.append(hlo)
        return todo, locked, done, failed

    @with_cache_lock
    def _try_create_entry_lock(self, lock_path: str) -> bool:
        os.makedirs(os.path.dirname(lock_path), exist_ok=True)
        try:
            fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def hlo_acquire_lock(self, hlo_path: str, timeout: float | None = None) -> None:
        """Create ``<hlo_path>.lock`` (O_CREAT|O_EXCL), waiting while it exists.

        Faithful to docs/neuron-sdk.md#per-entry-compile-lock: the lock is
        existence-based and never expires, so a lock left by a killed compile blocks
        forever. ``timeout`` (or ``NEFFCACHE_STANDIN_LOCK_TIMEOUT``) is for tests only
        and raises TimeoutError. The cache-wide lock is held for each attempt, not while
        waiting: holding it while waiting would stop the lock's owner from ever
        releasing it.
        """
        if timeout is None:
            timeout = _lock_timeout_from_env()
        lock_path = hlo_path + LOCK_SUFFIX
        module = os.path.basename(os.path.dirname(hlo_path))
        start = time.monotonic()
        next_log = start
        while not self._try_create_entry_lock(lock_path):
            waited = time.monotonic() - start
            if time.monotonic() >= next_log:
                logger.info(
                    "Another process must be compiling %s, been waiting for: %d minutes",
                    module,
                    int(waited // 60),
                )
                next_log += LOCK_LOG_SECONDS
            if timeout is not None and waited >= timeout:
                raise TimeoutError(
                    f"{lock_path} still exists after {waited:.1f} s "
                    "(NEFFCACHE_STANDIN_LOCK_TIMEOUT / timeout: test-only)"
                )
            time.sleep(LOCK_POLL_SECONDS)

    @with_cache_lock
    def hlo_release_lock(self, hlo_path: str) -> None:
        lock_path = hlo_path + LOCK_SUFFIX
        if os.path.exists(lock_path):
            os.unlink(lock_path)

    @with_cache_lock
    def try_lookup_for_compile(self, hlo_path: str) -> CacheEntry | None:
        """None if the HLO is already done or locked by another worker
        (docs/neuron-sdk.md#per-entry-compile-lock); otherwise an unlocked
        :class:`CacheEntry` (``with entry:`` takes the lock)."""
        entry_dir = os.path.dirname(hlo_path)
        if os.path.exists(os.path.join(entry_dir, DONE_FILENAME)):
            return None
        if os.path.exists(hlo_path + LOCK_SUFFIX):
            return None
        return CacheEntry(self, hlo_path)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class CompileCacheS3(CompileCache):
    """The S3 backend (docs/neuron-sdk.md#s3-backend). Only paths are implemented: every
    I/O method raises NotImplementedError (inherited), because the stand-ins have no S3
    behaviour to follow beyond "one object per file" and locking on S3 is not visible
    (#s3-backend)."""

    def _join(self, *parts: str) -> str:
        return "/".join(part.strip("/") if i else part.rstrip("/") for i, part in enumerate(parts))


def create_compile_cache(cache_url: CacheUrl) -> CompileCache:
    """``CompileCacheS3`` for an ``s3://`` URL, else ``CompileCacheFs``
    (docs/neuron-sdk.md#cache-location and #libneuronxla-cache-api)."""
    if cache_url.is_s3():
        return CompileCacheS3(cache_url)
    return CompileCacheFs(cache_url)
