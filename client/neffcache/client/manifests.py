"""What a manifest must be before the client lets it near the filesystem.

Every manifest the client reads comes from outside the process: from a server, which
may be broken or hostile, or from a file in L1, which anything on the host may have
written. Its file names become paths inside an entry directory, its digests become
paths inside L1's blob store and URLs on the server, its sizes bound downloads. So each
is checked here, before the first filesystem call, and a manifest with any field out of
shape is refused whole: a miss with one warning, and the graph compiles.

The rules are the server's (``manifest.py`` there): a digest is 64 lowercase hex, a
size a non-negative integer, a file name a plain name as the stock layout has them
(no directory, no ``.`` or ``..``, no leading dot).
"""

from __future__ import annotations

import re
from typing import Any

from neffcache.client._log import log
from neffcache.client.stats import STATS

Manifest = dict[str, Any]

HEX64 = re.compile(r"[0-9a-f]{64}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
# Far past any NEFF or HLO module; a size beyond it is a lie meant to make a download
# (or a wait for one) last forever.
MAX_FILE_BYTES = 1 << 40


class BadManifest(ValueError):
    """A manifest with a field out of shape; the message names the field."""


def is_digest(value: object) -> bool:
    return isinstance(value, str) and HEX64.fullmatch(value) is not None


def is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FILE_BYTES


def check(value: object) -> Manifest:
    """``value`` itself when it is a usable manifest; BadManifest naming what is not."""
    if not isinstance(value, dict):
        raise BadManifest(f"not a JSON object but {type(value).__name__}")
    for field in ("key", "direct_key"):
        if value.get(field) is not None and not is_digest(value[field]):
            raise BadManifest(f"{field} is not 64 hex digits")
    address = value.get("neuron_address")
    if address is not None and not isinstance(address, str):
        raise BadManifest("neuron_address is not a string")
    files = value.get("files")
    if not isinstance(files, dict) or not files:
        raise BadManifest("files is not a non-empty object")
    for name, ref in files.items():
        _check_file(name, ref)
    return value


def _check_file(name: object, ref: object) -> None:
    if not isinstance(name, str) or FILE_NAME.fullmatch(name) is None:
        raise BadManifest(f"file name {str(name)[:80]!r} is not a plain file name")
    if not isinstance(ref, dict):
        raise BadManifest(f"file {name!r} is not an object")
    if not is_digest(ref.get("digest")):
        raise BadManifest(f"file {name!r}: the digest is not 64 hex digits")
    if not is_size(ref.get("size")):
        raise BadManifest(f"file {name!r}: the size is not an integer from 0 to 1 TiB")


def checked(value: object, source: str) -> Manifest | None:
    """``value`` when it is a usable manifest, else None after one warning naming
    ``source`` (``"the server's entry abcdef012345"``) and what is wrong."""
    if value is None:
        return None
    try:
        return check(value)
    except BadManifest as exc:
        STATS.count("bad_manifests")
        log.warning("neffcache: %s is malformed (%s); treated as a miss", source, exc)
        return None
