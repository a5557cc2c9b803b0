"""Finding the entry a lookup asks for: in its namespace, then in the namespaces its
policy reads through, in order; every hit recorded for expiry and ranking.

The entry found says where it came from (its ``namespace``). The own namespace is read
first and its policy only on a miss, so a hit costs what it cost before read-through.
An entry found is answered as ``stamped`` makes it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _string

from neffcache.server.index import Entry
from neffcache.server.manifest import HEX64
from neffcache.server.services import Services


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
