"""The document store interface: small named files kept beside the blobs.

Blobs are content-addressed (bazel-remote's CAS); documents are addressed by name (its
action cache): the durable copy of every index row that must survive the index
(recovery/). Each blob store backend keeps them in the same place as its blobs, under
``documents/``, so one backup, one bucket policy and one lifecycle cover both.

A name is ``/``-separated segments of ``[A-Za-z0-9._-]`` (no empty, ``.`` or ``..``
segment); callers hash anything else into a segment. Writes replace atomically: a
reader sees the old document or the new one, never a mix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")


def check_name(name: str) -> str:
    """``name`` if it is a valid document name; ValueError otherwise (a bug in the
    caller: names are built by recovery/documents.py, never taken from a request)."""
    parts = name.split("/")
    if not all(_SEGMENT.fullmatch(part) and part not in (".", "..") for part in parts):
        raise ValueError(f"not a document name: {name!r}")
    return name


def is_name(name: str) -> bool:
    """Whether a listed name is a document's: a listing skips anything else (an
    NFS ``.nfs*`` file, an rsync temporary, an S3 console "folder"), so one stray
    file cannot stop a reindex."""
    try:
        check_name(name)
    except ValueError:
        return False
    return True


def check_prefix(prefix: str) -> str:
    """A listing prefix: whole segments followed by ``/`` (``entries/``), or ``""``."""
    if prefix and (not prefix.endswith("/") or not check_name(prefix[:-1])):
        raise ValueError(f"not a document prefix: {prefix!r}")
    return prefix


@runtime_checkable
class DocumentStore(Protocol):
    """Named documents. Every method is safe to call from several threads; raises
    StoreError (StoreFull when out of space) when the backend fails."""

    def put_document(self, name: str, data: bytes, *, create_only: bool = False) -> bool:
        """Store ``data`` under ``name``, atomically and durably (it survives a crash
        once this returns); True when stored. A document already there is replaced,
        or with ``create_only`` kept (False): one writer of a new name wins."""

    def get_document(self, name: str) -> bytes | None:
        """The document, or None if there is none."""

    def delete_document(self, name: str) -> bool:
        """Remove a document; False if there was none."""

    def documents(self, prefix: str) -> Iterator[str]:
        """The names of every document under ``prefix`` (``"entries/"``; ``""`` for
        all), in no particular order, listed lazily: one stored or deleted during the
        listing may or may not appear. Files there that are not documents (``is_name``)
        are not listed."""
