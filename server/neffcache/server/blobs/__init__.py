"""Blob stores, chosen by URL scheme: ``file:///path``, ``s3://bucket/prefix``, ``memory://``."""

from __future__ import annotations

from .base import DIGEST_PATTERN, BlobInfo, BlobStore

__all__ = ["DIGEST_PATTERN", "BlobInfo", "BlobStore", "open_blob_store"]


_SCHEMES = {
    "file": ("neffcache.server.blobs.fs", "FsBlobStore", "file:///path"),
    "s3": ("neffcache.server.blobs.s3", "S3BlobStore", "s3://bucket/prefix"),
    "memory": ("neffcache.server.blobs.memory", "MemoryBlobStore", "memory://"),
}


def open_blob_store(url: str) -> BlobStore:
    """Open the store a URL names; an unknown scheme or a missing extra is a
    ConfigError that says how to fix it."""
    from neffcache.server.config_errors import open_by_scheme

    store: BlobStore = open_by_scheme(url, "blob store", _SCHEMES)
    return store
