"""A stock Neuron cache read as entries, from a directory or ``s3://bucket/prefix``.

The layout (facts §3.1, §7) is ``<root>/neuronxcc-<version>/MODULE_<key>+<flags8>/``
with one file (or, on S3, one object) per artifact. Each entry is classified as
optimum-neuron's cleanup does (facts §3.2):

============  =====================================================
success       ``model.neff`` and ``model.done``
locked        a ``*.lock`` file and no success (compiling, or a stale lock)
failed        ``model.log`` and no success (the SDK would replay the failure)
incomplete    ``model.neff`` or ``model.done`` alone (an interrupted write)
empty         neither: HLO and flags only, never compiled
============  =====================================================

Only a success is ever imported. Errors: ``SourceError`` when the source cannot be
listed at all (the command stops), ``ReadError`` when one file cannot be read (that
entry is counted as an error and the rest go on).
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

NEFF = "model.neff"
DONE = "model.done"
LOG = "model.log"
FLAGS = "compile_flags.json"
# The HLO's name changed across SDK versions (facts §3.1): the newer name first.
HLO_NAMES = ("model.hlo_module.pb", "model.hlo.pb")
LOCK_SUFFIX = ".lock"
VERSION_PREFIX = "neuronxcc-"
# Markers of an entry's state, never artifacts of a compile.
MARKERS = frozenset({DONE, LOG})


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
    if NEFF in names and DONE in names:
        return State.SUCCESS
    if any(name.endswith(LOCK_SUFFIX) for name in names):
        return State.LOCKED
    if LOG in names:
        return State.FAILED
    if NEFF in names or DONE in names:
        return State.INCOMPLETE
    return State.EMPTY


def is_artifact(name: str) -> bool:
    """Whether a file of an entry belongs in its manifest: not a state marker, not a
    lock, not hidden (editors' and transfer tools' temporary files)."""
    return name not in MARKERS and not name.endswith(LOCK_SUFFIX) and not name.startswith(".")


@dataclass(frozen=True)
class StockEntry:
    """One ``MODULE_`` folder: its address as found (validated only when keyed) and
    the size of every file directly in it."""

    address: str
    sizes: Mapping[str, int]

    @property
    def state(self) -> State:
        return classify(self.sizes)

    def artifacts(self) -> list[str]:
        return sorted(name for name in self.sizes if is_artifact(name))


class StockSource(Protocol):
    """Where a stock cache lives. Not thread-safe; one command uses one."""

    where: str  # for messages

    def entries(self) -> list[StockEntry]:
        """Every entry folder, sorted by address; SourceError if the source cannot be
        listed or has no ``neuronxcc-*`` folder."""

    def local_file(self, entry: StockEntry, name: str, scratch: Path) -> Path:
        """A local file with the bytes of ``name`` in ``entry``: the file itself for a
        directory, a download into ``scratch`` otherwise. ReadError if unreadable."""

    def close(self) -> None:
        """Release connections."""


def open_source(src: str) -> StockSource:
    """A directory path or an ``s3://bucket/prefix`` URL; SourceError for anything else."""
    if src.startswith("s3://"):
        return S3Source(src)
    if "://" in src:
        raise SourceError(f"{src!r} is neither a directory nor an s3://bucket/prefix URL")
    return DirectorySource(Path(src))


def _no_entries(where: str) -> SourceError:
    return SourceError(
        f"{where} has no {VERSION_PREFIX}<version> folders: not a stock Neuron cache "
        "(give the folder that holds them, such as /var/tmp/neuron-compile-cache)"
    )


class DirectorySource:
    """A stock cache in a local directory (or a mounted one)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = str(root)

    def entries(self) -> list[StockEntry]:
        if not self.root.is_dir():
            raise SourceError(f"{self.root} is not a directory")
        try:
            versions = sorted(
                p for p in self.root.iterdir() if p.name.startswith(VERSION_PREFIX) and p.is_dir()
            )
            if not versions:
                raise _no_entries(self.where)
            return [
                StockEntry(f"{version.name}/{folder.name}", _sizes(folder))
                for version in versions
                for folder in sorted(version.iterdir())
                if not folder.name.startswith(".") and folder.is_dir()
            ]
        except OSError as exc:
            raise SourceError(f"cannot read {self.root}: {exc}") from None

    def local_file(self, entry: StockEntry, name: str, scratch: Path) -> Path:
        path = self.root / entry.address / name
        if not path.is_file():
            raise ReadError(f"{path} is gone")
        return path

    def close(self) -> None:
        return None


def _sizes(folder: Path) -> dict[str, int]:
    sizes = {}
    for path in folder.iterdir():
        try:
            if path.is_file():
                sizes[path.name] = path.stat().st_size
        except FileNotFoundError:
            continue  # removed while we looked (a lock released, say)
    return sizes


class S3Source:
    """A stock cache under ``s3://bucket/prefix``, one object per file (facts §7).

    The endpoint comes from ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, as for
    the server's S3 blob store; credentials from boto3's usual chain."""

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
        self._client = _s3_client()

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
                    if len(parts) == 3 and parts[2] and not parts[1].startswith("."):
                        groups.setdefault(f"{parts[0]}/{parts[1]}", {})[parts[2]] = item["Size"]
        if not seen_version:
            raise _no_entries(self.where)
        return [StockEntry(address, sizes) for address, sizes in sorted(groups.items())]

    def local_file(self, entry: StockEntry, name: str, scratch: Path) -> Path:
        dest = scratch / name
        if dest.is_file():
            return dest  # read for the key already; boto3 renames a download into place
        key = f"{self.base}{entry.address}/{name}"
        try:
            with self._errors(f"read {key}"):
                self._client.download_file(self.bucket, key, str(dest))
        except SourceError as exc:
            raise ReadError(str(exc)) from None
        return dest

    def close(self) -> None:
        self._client.close()

    def _errors(self, action: str) -> contextlib.AbstractContextManager[None]:
        return _s3_errors(f"{self.where}: {action}")


def _s3_client() -> Any:
    try:
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]
        from botocore.exceptions import BotoCoreError  # type: ignore[import-untyped]
    except ImportError:
        raise SourceError("reading s3:// needs boto3: pip install 'neffcache[s3]'") from None
    # Path-style addressing with a custom endpoint, as the S3 blob store does: MinIO or
    # moto behind a plain host name has no bucket subdomains.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    config = Config(
        connect_timeout=5,
        read_timeout=60,
        retries={"max_attempts": 5, "mode": "standard"},
        s3={"addressing_style": "path"} if endpoint else {},
    )
    try:
        return boto3.session.Session().client("s3", endpoint_url=endpoint or None, config=config)
    except (ValueError, BotoCoreError) as exc:
        raise SourceError(
            f"cannot create the S3 client ({exc}); check AWS_ENDPOINT_URL_S3, "
            "AWS_ENDPOINT_URL and the AWS region settings"
        ) from None


@contextlib.contextmanager
def _s3_errors(what: str) -> Iterator[None]:
    """botocore and boto3 failures as one-line SourceErrors."""
    from boto3.exceptions import Boto3Error  # type: ignore[import-untyped]
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise SourceError(f"{what} failed: {error.get('Code') or error}") from None
    except (BotoCoreError, Boto3Error, OSError) as exc:
        raise SourceError(f"{what} failed: {exc}") from None
