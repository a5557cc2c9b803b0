"""Finding the entry a lookup asks for: in its namespace, then in the namespaces its
policy reads through, in order; every hit recorded for expiry and ranking.

The entry found says where it came from (its ``namespace``). The own namespace is read
first and its policy only on a miss, so a hit costs what it cost before read-through.
An entry found is answered as ``stamped`` makes it, and with one of its files inline
when the client asked and the file is small (``inlined_file``).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _string

from neffcache.protocol import inline, is_hex64
from neffcache.server.errors import ServerError
from neffcache.server.index import Entry
from neffcache.server.manifest import HEX64
from neffcache.server.services import Services
from neffcache.server.services import blobs as blob_reads

log = logging.getLogger("neffcache.server")


def find_entry(backends: Services, namespace: str, key: str) -> Entry | None:
    return _first(backends, namespace, lambda ns: backends.index.get_entry(ns, key))


def find_alias(backends: Services, namespace: str, alias: str) -> Entry | None:
    return _first(backends, namespace, lambda ns: _by_alias(backends, ns, alias))


def find_name(backends: Services, namespace: str, name: str) -> Entry | None:
    """A lease's name: a key, or else an alias (direct key or Neuron address)."""

    def look(ns: str) -> Entry | None:
        found = backends.index.get_entry(ns, name) if re.fullmatch(HEX64, name) else None
        return found if found is not None else _by_alias(backends, ns, name)

    return _first(backends, namespace, look)


def _by_alias(backends: Services, namespace: str, alias: str) -> Entry | None:
    key = backends.index.resolve_alias(namespace, alias)
    return None if key is None else backends.index.get_entry(namespace, key)


def _first(backends: Services, namespace: str, look: Callable[[str], Entry | None]) -> Entry | None:
    found = look(namespace)
    if found is None:
        for source in backends.policies.sources(namespace):
            found = look(source)
            if found is not None:
                break
    if found is None:
        answer = "absent"
    else:
        backends.access.hit(found.namespace, found.key)
        answer = "hit" if found.namespace == namespace else "hit_read_through"
    backends.metrics.entry_answered(namespace, answer)
    return found


def stamped(entry: Entry) -> str:
    """An entry as GET returns it: the manifest plus the server's stamps."""
    # The stored manifest is canonical JSON without these fields (manifest.RESERVED):
    # splice them in rather than decoding and encoding the manifest again. Written as
    # json.dumps writes {"created_at": ..., "namespace": ..., "writer": ...}, with its
    # string encoder, without its general machinery (every lookup answers this).
    return (
        f'{entry.manifest[:-1]},"created_at": {_number(entry.created_at)}, '
        f'"namespace": {_string(entry.namespace)}, "writer": {_string(entry.writer)}}}'
    )


def _number(value: float) -> str:
    # json.dumps writes a finite float as its repr; anything else its own way.
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return json.dumps(value)


def inlined_file(backends: Services, entry: Entry, asked: str) -> bytes | None:
    """The bytes of the file a lookup asked for inline (``X-Neffcache-Inline``), read
    and verified as a blob GET reads them; None to answer the JSON alone: the ask is
    malformed, the entry has no such file, it is larger than asked, or its blob is not
    one the server sends itself whole (absent, quarantined now, or redirected to the
    store, whose bytes the client then fetches as it would have)."""
    wanted = inline.parse_asked(asked)
    if wanted is None:
        return None
    name, max_bytes = wanted
    # The index holds manifests the server validated; read defensively all the same,
    # as a lookup must answer whatever an index restored from elsewhere holds.
    files = json.loads(entry.manifest).get("files")
    ref = files.get(name) if isinstance(files, dict) else None
    digest, size = (ref.get("digest"), ref.get("size")) if isinstance(ref, dict) else (None, None)
    if not is_hex64(digest):
        return None
    if not isinstance(size, int) or size > max_bytes:
        return None
    try:
        found = blob_reads.read(backends, digest, None)
    except ServerError as exc:
        # The file is what may go wrong here, never the lookup: the client downloads
        # it as it would have, and that GET answers the error.
        log.warning("cannot inline blob %s in a lookup (%s); answered without it", digest, exc)
        return None
    if not isinstance(found, blob_reads.Whole) or len(found.data) != size:
        return None
    metrics = backends.metrics
    metrics.blob_reads.labels("hit").inc()
    metrics.blob_bytes_served.inc(len(found.data))
    metrics.blob_inlined.inc()
    return found.data
