"""Blob stores, chosen by URL scheme: ``file:///path``, ``s3://bucket/prefix``, ``memory://``."""

from __future__ import annotations

from .base import DIGEST_PATTERN, BlobStore

__all__ = ["DIGEST_PATTERN", "BlobStore", "open_blob_store"]


def open_blob_store(url: str) -> BlobStore:
    """Open the store a URL names; an unknown scheme or a missing extra is a
    ConfigError that says how to fix it."""
    from neffcache.server.config_errors import ConfigError

    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigError(
            f"blob store URL {url!r} has no scheme; use file:///path or s3://bucket/prefix"
        )
    if scheme == "file":
        from .fs import FsBlobStore

        return FsBlobStore.from_url(url)
    if scheme == "s3":
        try:
            from .s3 import S3BlobStore
        except ImportError as exc:
            raise ConfigError("s3:// blob stores need boto3: pip install 'neffcache[s3]'") from exc
        return S3BlobStore.from_url(url)
    if scheme == "memory":
        from .memory import MemoryBlobStore

        return MemoryBlobStore.from_url(url)
    raise ConfigError(
        f"unknown blob store scheme {scheme!r}; use file:///path, s3://bucket/prefix or memory://"
    )
