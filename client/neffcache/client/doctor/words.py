"""Small ways of saying things the checks share."""

from __future__ import annotations

from neffcache.client._redact import redact_url

SET_URL = "export NEFFCACHE_URL=neffcache+http://HOST:8787/NAMESPACE"
SHIM_FIRST = 'export PATH="$(neffcache shim-dir):$PATH"'


def size(n: float) -> str:
    """Bytes in powers of 1024, as NEFFCACHE_LOCAL_MAX_SIZE spells them."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def url(value: str | None) -> str:
    """A URL as the output shows it: no user, password or query (they may be secrets)."""
    return redact_url(value) if value else "(none)"


def listed(items: list[str] | tuple[str, ...], empty: str = "none") -> str:
    return ", ".join(items) if items else empty
