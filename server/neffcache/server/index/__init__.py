"""Indexes, chosen by URL scheme: ``sqlite:///path``, ``redis://host:port/db``, ``memory://``."""

from __future__ import annotations

from .base import Entry, Index, PutResult, Token

__all__ = ["Entry", "Index", "PutResult", "Token", "open_index"]


def open_index(url: str) -> Index:
    """Open the index a URL names; an unknown scheme or a missing extra is a
    ConfigError that says how to fix it."""
    from neffcache.server.config_errors import ConfigError

    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigError(
            f"index URL {url!r} has no scheme; use sqlite:///path or redis://host:port/db"
        )
    if scheme == "sqlite":
        from .sqlite import SqliteIndex

        return SqliteIndex.from_url(url)
    if scheme in ("redis", "rediss"):
        try:
            from .redis import RedisIndex
        except ImportError as exc:
            raise ConfigError(
                "redis:// indexes need redis-py: pip install 'neffcache[redis]'"
            ) from exc
        return RedisIndex.from_url(url)
    if scheme == "memory":
        from .memory import MemoryIndex

        return MemoryIndex.from_url(url)
    raise ConfigError(
        f"unknown index scheme {scheme!r}; use sqlite:///path, redis://host:port/db or memory://"
    )
