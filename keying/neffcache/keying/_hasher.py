"""Tagged, length-prefixed hashing of labelled fields.

Every field enters the hash as ``len(label) label len(value) value`` with 8-byte
big-endian lengths, so no two different field lists share a pre-image: ``-O2 -g`` can
never collide with ``-O2-g``, nor a value with the next label (ccache hash_delimiter).
The domain string goes through BLAKE3's key derivation, so keys, fingerprints and
direct keys live in separate hash spaces.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import blake3

ComponentValue = str | Sequence[str] | Mapping[str, str]


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
