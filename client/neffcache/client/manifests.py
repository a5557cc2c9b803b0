"""What a manifest must be before the client lets it near the filesystem.

Every manifest the client reads comes from outside the process: from a server, which
may be broken or hostile, or from a file in L1, which anything on the host may have
written. Its file names become paths inside an entry directory, its digests become
paths inside L1's blob store and URLs on the server, its sizes bound downloads. So each
is checked here, before the first filesystem call, and a manifest with any field out of
shape is refused whole: a miss with one warning, and the graph compiles.

The rules are the protocol's (``neffcache.protocol.parse``), the ones the server's
model states too: a digest is 64 lowercase hex, a size an integer from 0 to 1 TiB, a
file name a plain name as the stock layout has them (no directory, no ``.`` or
``..``, no leading dot). The client goes on using the manifest as the JSON object it
read, so that fields it does not know travel on unchanged.
"""

from __future__ import annotations

from typing import Any

from neffcache.client._log import log
from neffcache.client.stats import STATS
from neffcache.protocol import MAX_FILE_BYTES, ManifestError, is_hex64, parse
from neffcache.protocol.counters import ClientCounter

Manifest = dict[str, Any]
# The protocol's error under the name the client's modules catch.
BadManifest = ManifestError


def is_digest(value: object) -> bool:
    return is_hex64(value)


def is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FILE_BYTES


def check(value: object) -> Manifest:
    """``value`` itself when it is a usable manifest; BadManifest naming what is not."""
    parse(value)
    assert isinstance(value, dict)  # parse refuses anything else
    return value


def checked(value: object, source: str) -> Manifest | None:
    """``value`` when it is a usable manifest, else None after one warning naming
    ``source`` (``"the server's entry abcdef012345"``) and what is wrong."""
    if value is None:
        return None
    try:
        return check(value)
    except BadManifest as exc:
        STATS.count(ClientCounter.BAD_MANIFESTS)
        log.warning("neffcache: %s is malformed (%s); treated as a miss", source, exc)
        return None
