"""The entry manifest: what a client publishes under a key and reads back.

``parse`` is the one definition of a valid manifest. The client runs it on every
manifest it reads (a server's answer, a file in L1: both untrusted) before a field
becomes a path or a URL; the server's pydantic model (``server/manifest.py``) states
the same rules for its OpenAPI schema and its error messages, and
``tests/protocol`` checks that both accept exactly the same manifests.

A manifest is a JSON object. Required: ``key`` and ``files`` (at least one file, each
``{"digest", "size"}`` and nothing else). Optional: ``direct_key``,
``neuron_address``, ``components``, ``compile_seconds`` and ``model``, each absent or
null when unknown. Any other field is kept as sent (``extra``): a newer client may add
fields an older reader ignores, and the server's stamps (``RESERVED``) come back this
way.

The classes are frozen by hand rather than dataclasses: importing ``dataclasses`` (it
imports ``inspect``) costs about 12 ms and a ``NamedTuple`` about 0.25 ms to define,
and the client's shim imports this module in every compiler process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .patterns import (
    FILE_NAME,
    HEX64,
    MODEL_LABEL,
    MODEL_LABEL_MAX,
    NEURON_ADDRESS,
    matches,
)

# Far past any NEFF or HLO module; a size beyond it is a lie meant to make a download
# (or a wait for one) last forever.
MAX_FILE_BYTES = 1 << 40
# The fields a manifest may have, in the order the server's model declares them.
FIELDS = (
    "key",
    "direct_key",
    "neuron_address",
    "components",
    "files",
    "compile_seconds",
    "model",
)
REQUIRED = frozenset({"key", "files"})
FILE_REF_FIELDS = ("digest", "size")
# Fields the server adds when it returns an entry; a client may not send them.
RESERVED = frozenset({"created_at", "namespace", "writer"})

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_T = TypeVar("_T")


class ManifestError(ValueError):
    """A manifest with a field out of shape; the message is one line naming the field."""


class _Frozen:
    """What ``@dataclass(frozen=True)`` would generate, by hand (see the module's
    docstring): a subclass lists its fields in order as ``__match_args__`` and as
    ``__slots__``, sets them once in ``__init__``, and declares them to mypy as
    read-only properties."""

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__match_args__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            assert isinstance(other, _Frozen)
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__match_args__)
        return f"{self.__class__.__name__}({fields})"

    def __reduce__(self) -> tuple[object, ...]:
        return (self.__class__, self._values())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{self.__class__.__name__} is frozen: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{self.__class__.__name__} is frozen: cannot delete {name}")


class FileRef(_Frozen):
    """One file of an entry."""

    __match_args__ = ("digest", "size")
    __slots__ = __match_args__

    if TYPE_CHECKING:

        @property
        def digest(self) -> str: ...  # BLAKE3 of the file's bytes: the blob's address
        @property
        def size(self) -> int: ...  # its length in bytes

    def __init__(self, digest: str, size: int) -> None:
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "size", size)


class Manifest(_Frozen):
    """A valid manifest: make one with ``parse``. Its mappings are read-only views."""

    __match_args__ = (
        "key",
        "files",
        "direct_key",
        "neuron_address",
        "components",
        "compile_seconds",
        "model",
        "extra",
    )
    __slots__ = __match_args__

    if TYPE_CHECKING:

        @property
        def key(self) -> str: ...
        @property
        def files(self) -> Mapping[str, FileRef]: ...
        @property
        def direct_key(self) -> str | None: ...
        @property
        def neuron_address(self) -> str | None: ...
        @property
        def components(self) -> Mapping[str, Any]: ...
        @property
        def compile_seconds(self) -> float | None: ...
        @property
        def model(self) -> str | None: ...
        @property
        def extra(self) -> Mapping[str, Any]: ...  # every other field, as sent

    def __init__(
        self,
        key: str,
        files: Mapping[str, FileRef],
        direct_key: str | None = None,
        neuron_address: str | None = None,
        components: Mapping[str, Any] = _EMPTY,
        compile_seconds: float | None = None,
        model: str | None = None,
        extra: Mapping[str, Any] = _EMPTY,
    ) -> None:
        for name, value in zip(
            self.__match_args__,
            (key, files, direct_key, neuron_address, components, compile_seconds, model, extra),
            strict=True,
        ):
            object.__setattr__(self, name, value)

    def aliases(self) -> tuple[str, ...]:
        """The other names the entry is found by: its direct key and stock address."""
        return tuple(a for a in (self.direct_key, self.neuron_address) if a)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as a JSON object: optional fields that are None left out,
        ``components`` always there (``{}`` when it was absent)."""
        out: dict[str, Any] = dict(self.extra)
        out["key"] = self.key
        out["files"] = {
            name: {"digest": r.digest, "size": r.size} for name, r in self.files.items()
        }
        out["components"] = dict(self.components)
        for field in ("direct_key", "neuron_address", "compile_seconds", "model"):
            value = getattr(self, field)
            if value is not None:
                out[field] = value
        return out

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces, ASCII), as the server stores it."""
        import json  # here: the shim reads manifests but never writes one on a hit

        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def parse(obj: object) -> Manifest:
    """``obj`` (decoded JSON) as a Manifest; ManifestError naming the first bad field."""
    if not isinstance(obj, dict):
        raise ManifestError(f"not a JSON object but {type(obj).__name__}")
    if not all(isinstance(name, str) for name in obj):
        raise ManifestError("a field name is not a string")
    missing = sorted(REQUIRED.difference(obj))
    if missing:
        raise ManifestError(f"{' and '.join(missing)} missing")
    return Manifest(
        key=_digest(obj["key"], "key"),
        files=_files(obj["files"]),
        direct_key=_optional(obj, "direct_key", _digest),
        neuron_address=_optional(obj, "neuron_address", _address),
        components=_components(obj.get("components", {})),
        compile_seconds=_optional(obj, "compile_seconds", _seconds),
        model=_optional(obj, "model", _model),
        extra=MappingProxyType({k: v for k, v in obj.items() if k not in FIELDS}),
    )


def _optional(obj: dict[str, Any], field: str, check: Callable[[object, str], _T]) -> _T | None:
    value = obj.get(field)
    return None if value is None else check(value, field)


def _shown(value: object) -> str:
    # repr() keeps a hostile value on one line; 80 characters name it well enough.
    try:
        return repr(value)[:80]
    except ValueError:  # an int past sys.get_int_max_str_digits has no repr
        return f"a {type(value).__name__}"


def _digest(value: object, field: str) -> str:
    if not matches(HEX64, value):
        raise ManifestError(f"{field} is not 64 lowercase hex digits: {_shown(value)}")
    return str(value)


def _address(value: object, field: str) -> str:
    if not matches(NEURON_ADDRESS, value):
        raise ManifestError(
            f"{field} is not a Neuron cache address neuronxcc-<version>/MODULE_<key>+<8 hex>: "
            f"{_shown(value)}"
        )
    return str(value)


def _seconds(value: object, field: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            if math.isfinite(value) and value >= 0:
                return value  # as sent: 5 stays 5 in to_json
        except OverflowError:  # an int no float can hold is no time
            pass
    raise ManifestError(f"{field} is not a number of seconds >= 0: {_shown(value)}")


def _model(value: object, field: str) -> str:
    if not (
        isinstance(value, str) and len(value) <= MODEL_LABEL_MAX and matches(MODEL_LABEL, value)
    ):
        raise ManifestError(
            f"{field} is not 1 to {MODEL_LABEL_MAX} printable characters: {_shown(value)}"
        )
    return value


def _components(value: object) -> Mapping[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ManifestError(f"components is not a JSON object but {type(value).__name__}")
    return MappingProxyType(value)


def _files(value: object) -> Mapping[str, FileRef]:
    if not isinstance(value, dict) or not value:
        raise ManifestError("files is not a non-empty object")
    return MappingProxyType({_file_name(name): _file_ref(name, ref) for name, ref in value.items()})


def _file_name(name: object) -> str:
    if not matches(FILE_NAME, name):
        raise ManifestError(f"file name {_shown(name)} is not a plain file name")
    return str(name)


def _file_ref(name: str, ref: object) -> FileRef:
    where = f"file {_shown(name)}"
    if not isinstance(ref, dict):
        raise ManifestError(f"{where} is not an object")
    unknown = sorted(str(k)[:40] for k in ref if k not in FILE_REF_FIELDS)
    if unknown:
        raise ManifestError(f"{where}: unknown field(s) {', '.join(unknown)}")
    digest = _digest(ref.get("digest"), f"{where}: the digest")
    size = ref.get("size")
    # bool is an int to Python and not to JSON: true is not a size.
    if isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= MAX_FILE_BYTES:
        return FileRef(digest, size)
    raise ManifestError(f"{where}: the size is not an integer from 0 to 1 TiB: {_shown(size)}")
