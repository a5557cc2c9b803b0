"""What the recovery tests that drive the stores and the service layer in this process
share (tests/recovery): an entry published as the API publishes one, its blobs'
digests, and the service layer's ``Backends`` over given stores."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import blake3

from neffcache.server.auth import TokenPresence
from neffcache.server.blobs import BlobStore
from neffcache.server.deps import Backends
from neffcache.server.index import Entry, Index, PutResult
from neffcache.server.manifest import canonical_json
from neffcache.server.settings import ServerSettings

NS = "team-a"
BOOT = "nfc_bootstrap_secret_for_recovery_tests_0123456789abcdef"


def commit(store: BlobStore, data: bytes) -> str:
    staged = store.staging_dir() / f"upload-{uuid.uuid4().hex}"
    staged.write_bytes(data)
    digest: str = blake3.blake3(data).hexdigest()
    store.commit(staged, digest)
    return digest


def publish(
    index: Index,
    blobs: BlobStore,
    name: str,
    *,
    created_at: float | None = None,
    writer: str = "tok1",
) -> Entry:
    """An entry as the API publishes it: blobs committed, then the row (through
    ``index``: a DurableIndex writes its document)."""
    key = blake3.blake3(f"key {name}".encode()).hexdigest()
    files = {}
    for part in ("model.neff", "model.hlo"):
        data = f"{part} of {name}".encode() * 50
        files[part] = {"digest": commit(blobs, data), "size": len(data)}
    manifest = canonical_json({"key": key, "files": files, "compile_seconds": 600.0})
    entry = Entry(NS, key, manifest, time.time() if created_at is None else created_at, writer)
    assert index.put_entry(entry, ()) is PutResult.CREATED
    return entry


def digests(entry: Entry) -> set[str]:
    files: dict[str, Any] = json.loads(entry.manifest)["files"]
    return {ref["digest"] for ref in files.values()}


def service_backends(index: Index, blobs: BlobStore, tmp: Path, **settings: Any) -> Backends:
    """The service layer over ``index`` and ``blobs``, with no background passes, no
    grace for blobs and no default TTL unless ``settings`` say otherwise."""
    values: dict[str, Any] = {
        "data_dir": tmp,
        "eviction_interval_seconds": 0,
        "blob_grace_seconds": 0,
        "default_ttl_seconds": None,
        **settings,
    }
    return Backends(ServerSettings(**values), blobs, index, TokenPresence(index))
