"""A stock Neuron cache read as entries, from a directory or ``s3://bucket/prefix``.

The layout (docs/neuron-sdk.md#entry-layout and #s3-backend) is
``<root>/neuronxcc-<version>/MODULE_<key>+<flags8>/`` with one file (or, on S3, one
object) per artifact; only ``MODULE_`` folders are entries (not optimum-neuron's
``0_REGISTRY``, docs/neuron-sdk.md#optimum-neurons-registry). Each entry is classified
as optimum-neuron's cleanup does (docs/neuron-sdk.md#entry-states):

============  =====================================================
success       ``model.neff`` and ``model.done``; in the oldest era
              (``compile_flags.txt``, docs/neuron-sdk.md#layout-eras),
              which wrote no ``model.done``, ``model.neff`` and no lock
locked        a ``*.lock`` file and no success (compiling, or a stale lock)
failed        ``model.log`` and no success (the SDK would replay the failure)
incomplete    ``model.neff`` or ``model.done`` alone (an interrupted write)
empty         neither: HLO and flags only, never compiled
============  =====================================================

Only a success is ever imported. A directory is read as its own user, while the
SDK's default cache sits in the world-writable ``/var/tmp``: a symlink there (a file,
an entry folder or a version folder) that resolves outside the source could make the
import publish a file of the importing user's, so such an entry carries a
``problem`` and is never read, unless symlinks are followed on purpose
(optimum-neuron links Hugging Face blobs into caches). Each file is checked again
when it is opened, on what was opened.

Errors: ``SourceError`` when the source cannot be listed at all (the command stops),
``ReadError`` when one file cannot be read (that entry is counted as an error and
the rest go on); an entry folder that cannot be listed has a ``problem``.
"""

from __future__ import annotations

import contextlib
import enum
import os
import stat
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlsplit

from neffcache.client.bridge import s3
from neffcache.keying import (
    STOCK_DONE,
    STOCK_FLAGS_TXT,
    STOCK_LOCK_SUFFIX,
    STOCK_LOG,
    STOCK_NEFF,
    is_stock_artifact,
)

VERSION_PREFIX = "neuronxcc-"
MODULE_PREFIX = "MODULE_"


class SourceError(Exception):
    """The source cannot be listed (not a stock cache, unreachable, no permission)."""


class ReadError(Exception):
    """One file of an entry cannot be read."""


class State(enum.Enum):
    SUCCESS = "success"
    LOCKED = "locked"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    EMPTY = "empty"


def classify(names: Collection[str]) -> State:
    """The state of an entry from the names of its files (the table above)."""
    if STOCK_NEFF in names and STOCK_DONE in names:
        return State.SUCCESS
    if any(name.endswith(STOCK_LOCK_SUFFIX) for name in names):
        return State.LOCKED
    if STOCK_NEFF in names and STOCK_FLAGS_TXT in names:
        # The oldest era's SDK wrote no model.done and took model.neff for a hit.
        return State.SUCCESS
    if STOCK_LOG in names:
        return State.FAILED
    if STOCK_NEFF in names or STOCK_DONE in names:
        return State.INCOMPLETE
    return State.EMPTY


@dataclass(frozen=True)
class StockEntry:
    """One ``MODULE_`` folder: its address as found (validated only when keyed), the
    size of every file directly in it, and why it may not be read at all, if so (a
    symlink out of the source, a folder that cannot be listed): an error."""

    address: str
    sizes: Mapping[str, int]
    problem: str | None = None

    @property
    def state(self) -> State:
        return classify(self.sizes)

    def artifacts(self) -> list[str]:
        return sorted(name for name in self.sizes if is_stock_artifact(name))


class StockSource(Protocol):
    """Where a stock cache lives. Not thread-safe; one command uses one."""

    where: str  # for messages

    def entries(self) -> list[StockEntry]:
        """Every ``MODULE_`` folder of every ``neuronxcc-*`` folder, sorted by address;
        SourceError if the source cannot be listed or has no ``neuronxcc-*`` folder."""

    def open_file(self, entry: StockEntry, name: str, scratch: Path) -> BinaryIO:
        """The bytes of ``name`` in ``entry``, open for reading: the file itself for a
        directory (checked again on what was opened), a download into ``scratch``
        otherwise. ReadError if it cannot be read."""

    def close(self) -> None:
        """Release connections."""


def open_source(src: str, *, follow_symlinks: bool = False) -> StockSource:
    """A directory path or an ``s3://bucket/prefix`` URL; SourceError for anything
    else. ``follow_symlinks`` lets a directory's symlinks lead out of it."""
    if src.startswith("s3://"):
        return S3Source(src)
    if "://" in src:
        raise SourceError(f"{src!r} is neither a directory nor an s3://bucket/prefix URL")
    return DirectorySource(Path(src), follow_symlinks=follow_symlinks)


def _no_entries(where: str) -> SourceError:
    return SourceError(
        f"{where} has no {VERSION_PREFIX}<version> folders: not a stock Neuron cache "
        "(give the folder that holds them, such as /var/tmp/neuron-compile-cache)"
    )


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


class DirectorySource:
    """A stock cache in a local directory (or a mounted one)."""

    def __init__(self, root: Path, *, follow_symlinks: bool = False) -> None:
        self.root = root
        self.where = str(root)
        self.follow_symlinks = follow_symlinks
        self._real_root = os.path.realpath(root)

    def entries(self) -> list[StockEntry]:
        if not self.root.is_dir():
            raise SourceError(f"{self.root} is not a directory")
        try:
            versions = sorted(
                p for p in self.root.iterdir() if p.name.startswith(VERSION_PREFIX) and p.is_dir()
            )
        except OSError as exc:
            raise SourceError(f"cannot read {self.root}: {_why(exc)}") from None
        if not versions:
            raise _no_entries(self.where)
        return [entry for version in versions for entry in self._version_entries(version)]

    def _version_entries(self, version: Path) -> list[StockEntry]:
        """The entries of one version folder; one that cannot be listed is one error."""
        try:
            folders = sorted(p for p in version.iterdir() if p.name.startswith(MODULE_PREFIX))
        except OSError as exc:
            return [StockEntry(version.name, {}, f"cannot list {version}: {_why(exc)}")]
        outside = self._outside(version)
        entries = []
        for folder in folders:
            address = f"{version.name}/{folder.name}"
            try:
                if not folder.is_dir():
                    continue  # a stray file, not an entry
                problem = outside or self._outside(folder)
                sizes, problem = ({}, problem) if problem else self._sizes(folder)
            except OSError as exc:
                sizes, problem = {}, f"cannot read {folder}: {_why(exc)}"
            entries.append(StockEntry(address, sizes, problem))
        return entries

    def _sizes(self, folder: Path) -> tuple[dict[str, int], str | None]:
        """The size of every regular file in ``folder`` (through symlinks that stay in
        the source), and the first symlink that leads out, if any."""
        sizes = {}
        for path in folder.iterdir():
            try:
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    problem = self._outside(path)
                    if problem:
                        return {}, problem
                    info = path.stat()
            except FileNotFoundError:
                continue  # removed while we looked (a lock released, say)
            if stat.S_ISREG(info.st_mode):
                sizes[path.name] = info.st_size
        return sizes, None

    def _outside(self, path: Path) -> str | None:
        """Why ``path`` may not be read: a symlink that resolves outside the source."""
        if self.follow_symlinks or not path.is_symlink():
            return None
        real = os.path.realpath(path)
        if _inside(real, self._real_root):
            return None
        return (
            f"{path.relative_to(self.root)} is a symlink to {real}, outside {self.root} "
            "(--follow-symlinks reads it)"
        )

    def open_file(self, entry: StockEntry, name: str, scratch: Path) -> BinaryIO:
        path = self.root / entry.address / name
        try:
            # O_NONBLOCK: a FIFO swapped in since the listing must not hang the import.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ReadError(f"{path} is gone") from None
        except OSError as exc:
            raise ReadError(f"cannot read {path}: {_why(exc)}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ReadError(f"{path} is not a regular file")
            # Checked again on the file opened: a symlink planted since the listing
            # must not be read.
            real = _opened_path(fd, path)
            if not self.follow_symlinks and not _inside(real, self._real_root):
                raise ReadError(f"{path} resolves to {real}, outside {self.root}")
            return os.fdopen(fd, "rb")
        except OSError as exc:
            os.close(fd)
            raise ReadError(f"cannot read {path}: {_why(exc)}") from None
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _opened_path(fd: int, path: Path) -> str:
    """Where the open file ``fd`` is: Linux names it in /proc, with no race against a
    rename or a new symlink; elsewhere the resolved path, if it is still that file."""
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/self/fd/{fd}")
    real = os.path.realpath(path)
    opened, found = os.fstat(fd), os.stat(real)
    if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
        return f"<{path} changed while it was opened>"
    return real


class S3Source:
    """A stock cache under ``s3://bucket/prefix``, one object per file
    (docs/neuron-sdk.md#s3-backend).

    The client is ``s3.py``'s, made as the server's S3 blob store makes its own: the
    endpoint from ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, credentials from
    boto3's usual chain; its errors name only the S3 error code."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if "@" in parts.netloc or parts.query or parts.fragment or not parts.netloc:
            raise SourceError(
                "an S3 source is s3://bucket/prefix, nothing else (credentials come from "
                "the AWS credential chain)"
            )
        self.bucket = parts.netloc
        prefix = parts.path.strip("/")
        self.base = f"{prefix}/" if prefix else ""  # every key starts with this
        self.where = f"s3://{self.bucket}/{prefix}"
        try:
            self._client = s3.make_client()
        except s3.S3Error as exc:
            raise SourceError(str(exc)) from None

    def entries(self) -> list[StockEntry]:
        groups: dict[str, dict[str, int]] = {}
        seen_version = False
        with self._errors("list"):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.base
            )
            for page in pages:
                for item in page.get("Contents", []):
                    parts = item["Key"][len(self.base) :].split("/")
                    if not parts[0].startswith(VERSION_PREFIX) or len(parts) < 2:
                        continue
                    seen_version = True
                    if len(parts) == 3 and parts[2] and parts[1].startswith(MODULE_PREFIX):
                        groups.setdefault(f"{parts[0]}/{parts[1]}", {})[parts[2]] = item["Size"]
        if not seen_version:
            raise _no_entries(self.where)
        return [StockEntry(address, sizes) for address, sizes in sorted(groups.items())]

    def open_file(self, entry: StockEntry, name: str, scratch: Path) -> BinaryIO:
        dest = scratch / name
        if not dest.is_file():  # else read for the key already (boto3 renames into place)
            key = f"{self.base}{entry.address}/{name}"
            try:
                with self._errors(f"read {key}"):
                    self._client.download_file(self.bucket, key, str(dest))
            except SourceError as exc:
                raise ReadError(str(exc)) from None
        return dest.open("rb")

    def close(self) -> None:
        self._client.close()

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """``s3.py``'s one-line S3 errors, as SourceErrors naming the source."""
        try:
            with s3.s3_errors(action):
                yield
        except s3.S3Error as exc:
            raise SourceError(f"{self.where}: {exc}") from None
