"""Tagged, length-prefixed hashing of labelled fields.

Every field enters the hash as ``len(label) label len(value) value`` with 8-byte
big-endian lengths, so no two different field lists share a pre-image: ``-O2 -g`` can
never collide with ``-O2-g``, nor a value with the next label (ccache hash_delimiter).
The domain string goes through BLAKE3's key derivation, so keys, fingerprints and
direct keys live in separate hash spaces.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import blake3

ComponentValue = str | Sequence[str] | Mapping[str, str]

#: Below this many bytes one thread hashes faster than BLAKE3's thread pool, in the
#: one-shot processes that hash here (the shim hashes one input and exits): the pool's
#: start and hand-off cost more than the hash (0.5 MiB: 0.15 ms on one thread, 0.5 to
#: 0.7 ms with the pool), and its idle workers spin on the caller's own core when the
#: process is pinned to one. Measured on a 2-core machine; the digest is the same
#: either way.
PARALLEL_HASH_FROM = 32 << 20


def hash_threads(size: int) -> int:
    """How many threads BLAKE3 may use for ``size`` bytes: its pool (``AUTO``) for a
    large input when this process may run on more than one CPU, else one."""
    if size < PARALLEL_HASH_FROM:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux: the CPU count is the best guess
        cpus = os.cpu_count() or 1
    return blake3.blake3.AUTO if cpus > 1 else 1


class TaggedHasher:
    def __init__(self, domain: str) -> None:
        self._hasher = blake3.blake3(derive_key_context=domain)

    def field(self, label: str, value: ComponentValue) -> None:
        data = encode_value(value)
        tag = label.encode("utf-8")
        self._hasher.update(len(tag).to_bytes(8, "big") + tag)
        self._hasher.update(len(data).to_bytes(8, "big"))
        self._hasher.update(data)

    def hexdigest(self) -> str:
        digest: str = self._hasher.hexdigest()
        return digest


def encode_value(value: ComponentValue) -> bytes:
    """Strings as UTF-8; lists and mappings as compact JSON (mappings sorted).

    ``surrogatepass`` because ``os.environ`` turns undecodable bytes into lone
    surrogates; they must hash, and hash apart from every other value.
    """
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, Mapping):
        encoded = json.dumps(dict(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    else:
        encoded = json.dumps(list(value), separators=(",", ":"), ensure_ascii=False)
    return encoded.encode("utf-8", "surrogatepass")
