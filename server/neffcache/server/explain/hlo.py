"""The graph summary of a stored entry, from the HLO module among its files.

Entries published by the client carry the module they were compiled from
(``model.hlo_module.pb``, the stock layout's name; docs/neuron-sdk.md#entry-layout).
Summarizing one parses it, so summaries are kept per blob digest (blobs never change) in
a small LRU.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import blake3

from neffcache.keying import STOCK_HLO_NAMES, GraphSummary, KeyingError, graph_summary
from neffcache.server.blobs import BlobStore
from neffcache.server.errors import StoreError

log = logging.getLogger("neffcache.server.explain")

HLO_MAX_BYTES = 64 * 2**20  # a larger module is not read for an explanation
_CACHED = 8  # summaries of large graphs hold a string per instruction

_cache: OrderedDict[str, GraphSummary | None] = OrderedDict()
_loading: dict[str, threading.Lock] = {}  # per digest, while a thread reads it
_lock = threading.Lock()


def hlo_digest(manifest: Mapping[str, Any]) -> str | None:
    """The blob digest of the entry's HLO module, or None when it has none small
    enough to read."""
    files = manifest.get("files")
    if not isinstance(files, Mapping):
        return None
    for name in STOCK_HLO_NAMES:
        ref = files.get(name)
        if isinstance(ref, Mapping) and isinstance(ref.get("digest"), str):
            size = ref.get("size")
            if isinstance(size, int) and 0 < size <= HLO_MAX_BYTES:
                return str(ref["digest"])
    return None


def summary_of_entry(blobs: BlobStore, manifest: Mapping[str, Any]) -> GraphSummary | None:
    digest = hlo_digest(manifest)
    return None if digest is None else summary_of_blob(blobs, digest)


def summary_of_blob(blobs: BlobStore, digest: str) -> GraphSummary | None:
    """The summary of a stored HLO module; None when the blob is absent, fails its
    digest, is too large or is not a module (then that answer is remembered too).

    One module is read and parsed by one thread at a time: misses come in bursts (a
    fleet starting cold asks about the same graphs at once), and the others wait for
    its summary rather than each reading up to ``HLO_MAX_BYTES`` again."""
    with _lock:
        loading = _loading.setdefault(digest, threading.Lock())
    try:
        with loading:
            return _summary_once(blobs, digest)
    finally:
        with _lock:
            if _loading.get(digest) is loading and not loading.locked():
                del _loading[digest]


def _summary_once(blobs: BlobStore, digest: str) -> GraphSummary | None:
    with _lock:
        if digest in _cache:
            _cache.move_to_end(digest)
            return _cache[digest]
    data = _read(blobs, digest)
    if data is None:
        return None  # absent or unreadable now: may be there later, not remembered
    try:
        summary: GraphSummary | None = graph_summary(data)
    except KeyingError as exc:
        log.info("blob %s is not an HLO module (%s)", digest, exc)
        summary = None
    with _lock:
        _cache[digest] = summary
        while len(_cache) > _CACHED:
            _cache.popitem(last=False)
    return summary


def _read(blobs: BlobStore, digest: str) -> bytes | None:
    try:
        size = blobs.size(digest)
        if size is None or size > HLO_MAX_BYTES:
            return None
        chunks = blobs.read(digest)
        if chunks is None:
            return None
        data = b"".join(chunks)
    except StoreError as exc:
        log.warning("blob %s unreadable for an explanation (%s)", digest, exc)
        return None
    if blake3.blake3(data).hexdigest() != digest:
        return None  # the serving path quarantines it; here it is just not used
    return data
