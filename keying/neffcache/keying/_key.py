"""Cache keys: the canonical key and the direct (raw-bytes) key.

``compute_key`` hashes the canonical fingerprint, so two traces of the same program
share a key whatever their names, ids and debug metadata. ``direct_key`` hashes the
module's raw bytes instead (ccache's direct mode): a re-run of the very same trace hits
without paying for canonicalization, and the canonical key is computed only when the
direct key misses. Both hash the same context fields in the same order under
different domains, so a direct key can never equal a canonical one.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import blake3

from ._errors import KeyingError
from ._hasher import ComponentValue, TaggedHasher, hash_threads
from ._inputs import CompileContext, Frozen, KeyInputs
from ._version import KEY_VERSION

_CANONICAL_DOMAIN = f"neffcache {KEY_VERSION} cache key"
_DIRECT_DOMAIN = f"neffcache {KEY_VERSION} direct key"
_MODULE_DIGEST_DOMAIN = f"neffcache {KEY_VERSION} raw HloModuleProto bytes"


class CacheKey(Frozen):
    """A 64-hex key and the labelled components it was hashed from, in hash order.

    ``components`` is what explanations diff: two keys that differ differ in at least
    one component. Equality and hash look at ``key`` alone.
    """

    __match_args__ = ("key", "components")
    __slots__ = __match_args__
    _compared = ("key",)

    if TYPE_CHECKING:  # read-only fields, as a frozen dataclass's

        @property
        def key(self) -> str: ...
        @property
        def components(self) -> Mapping[str, ComponentValue]: ...

    def __init__(self, key: str, components: Mapping[str, ComponentValue]) -> None:
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "components", components)

    def as_json(self) -> dict[str, Any]:
        """Components as plain JSON values (lists and dicts)."""
        out: dict[str, Any] = {}
        for label, value in self.components.items():
            if isinstance(value, str):
                out[label] = value
            elif isinstance(value, Mapping):
                out[label] = dict(value)
            else:
                out[label] = list(value)
        return out


def compute_key(inputs: KeyInputs) -> CacheKey:
    """The canonical cache key of a graph fingerprint in a compile context."""
    if not isinstance(inputs, KeyInputs):
        raise KeyingError("compute_key takes a KeyInputs")
    return _key(_CANONICAL_DOMAIN, ("fingerprint", inputs.fingerprint), inputs.context)


def direct_key(module_bytes: bytes, context: CompileContext) -> CacheKey:
    """The key of the raw module bytes in a compile context; no parsing at all."""
    if not isinstance(module_bytes, (bytes, bytearray, memoryview)):
        raise KeyingError(f"direct_key takes module bytes, got {type(module_bytes).__name__}")
    if not isinstance(context, CompileContext):
        raise KeyingError("direct_key takes a CompileContext")
    digest = blake3.blake3(
        module_bytes,
        derive_key_context=_MODULE_DIGEST_DOMAIN,
        max_threads=hash_threads(len(module_bytes)),
    ).hexdigest()
    return _key(_DIRECT_DOMAIN, ("module_digest", digest), context)


def digest_key(module_digest: str, context: CompileContext) -> CacheKey:
    """The direct key of an input whose raw digest the caller made: a directory's
    (``tree_digest`` over its files' raw bytes). Same domain and fields as
    ``direct_key``; the digests themselves come from separate domains, so a folder's
    key can never equal a file's."""
    if not isinstance(module_digest, str) or len(module_digest) != 64:
        raise KeyingError("digest_key takes a 64-hex digest")
    if not isinstance(context, CompileContext):
        raise KeyingError("digest_key takes a CompileContext")
    return _key(_DIRECT_DOMAIN, ("module_digest", module_digest), context)


def _key(domain: str, graph: tuple[str, str], context: CompileContext) -> CacheKey:
    components: dict[str, ComponentValue] = {
        "key_version": KEY_VERSION,
        graph[0]: graph[1],
        "compiler_version": context.compiler_version,
        "target": context.target,
        "flags": context.flags,
        "env": MappingProxyType(dict(context.env)),
        "frameworks": MappingProxyType(dict(context.frameworks)),
    }
    hasher = TaggedHasher(domain)
    for label, value in components.items():
        hasher.field(label, value)
    return CacheKey(key=hasher.hexdigest(), components=MappingProxyType(components))
