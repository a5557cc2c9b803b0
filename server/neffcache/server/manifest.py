"""Entry manifests: what a client publishes under a key, validated before storing.

The stored form is canonical JSON (sorted keys, no spaces) of the fields the client
sent, so "the same manifest again" is a byte comparison; the server's own stamps
(``created_at``, ``writer``) live beside it in the index.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from neffcache.keying import KeyingError, parse_neuron_address
from neffcache.protocol import FILE_NAME as FILE_NAME
from neffcache.protocol import HEX64 as HEX64
from neffcache.protocol import (
    MAX_FILE_BYTES,
    MODEL_LABEL,
    MODEL_LABEL_MAX,
    NEURON_ADDRESS,
    is_file_name,
)
from neffcache.protocol import NAMESPACE as NAMESPACE
from neffcache.protocol import RESERVED as RESERVED
from neffcache.server.errors import BadRequest

# The wire's patterns and the manifest's rules are neffcache.protocol's (HEX64,
# NAMESPACE, FILE_NAME and RESERVED are imported from there, and re-exported for the
# server's modules that import them from here); this model states them for pydantic
# and the OpenAPI schema, and tests/protocol checks that both accept the same.
ADDRESS_PATTERN = NEURON_ADDRESS

M = TypeVar("M", bound=BaseModel)


class FileRef(BaseModel):
    # Strict, as the stored manifest is the JSON sent: a size of "5" or 5.0 would be
    # stored as sent, and every client would read the entry as a miss.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    digest: str = Field(pattern=f"^{HEX64}$")
    size: int = Field(ge=0, le=MAX_FILE_BYTES)


class Manifest(BaseModel):
    """The minimum the protocol requires; further fields are kept as sent.

    Strict (no coercion): the stored manifest is the JSON sent, so a field is stored
    with the type it is validated as, or refused."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    key: str = Field(pattern=f"^{HEX64}$")
    direct_key: str | None = Field(None, pattern=f"^{HEX64}$")
    neuron_address: str | None = Field(None, json_schema_extra={"pattern": f"^{ADDRESS_PATTERN}$"})
    components: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, FileRef] = Field(
        json_schema_extra={"minProperties": 1, "propertyNames": {"pattern": f"^{FILE_NAME}$"}}
    )
    compile_seconds: float | None = Field(None, ge=0, allow_inf_nan=False)
    # The publishing job's label (NEFFCACHE_MODEL): pins and reports group by it.
    model: str | None = Field(
        None, min_length=1, max_length=MODEL_LABEL_MAX, pattern=f"^{MODEL_LABEL}$"
    )

    @field_validator("files")
    @classmethod
    def _files(cls, files: dict[str, FileRef]) -> dict[str, FileRef]:
        if not files:
            raise ValueError("files must name at least one file")
        for name in files:
            if not is_file_name(name):
                raise ValueError(f"file name {name!r} is not a plain file name")
        return files

    @field_validator("neuron_address")
    @classmethod
    def _address(cls, address: str | None) -> str | None:
        return check_neuron_address(address)

    def aliases(self) -> tuple[str, ...]:
        return tuple(a for a in (self.direct_key, self.neuron_address) if a)


def check_neuron_address(address: str | None) -> str | None:
    """A field validator: the address, or ValueError if it is not a stock address."""
    if address is not None:
        try:
            parse_neuron_address(address)
        except KeyingError as exc:
            raise ValueError(str(exc)) from None
    return address


def parse_manifest(body: bytes, key: str) -> tuple[Manifest, str]:
    """Validate a manifest for ``key``; return it and its canonical JSON."""
    raw = load_json(body, "manifest")
    manifest = validated(Manifest, raw, "manifest")
    reserved = RESERVED.intersection(raw)
    if reserved:
        raise BadRequest(f"the server sets {', '.join(sorted(reserved))}; leave them out")
    if manifest.key != key:
        raise BadRequest(f"the manifest's key {manifest.key} is not the key in the path {key}")
    return manifest, canonical_json(raw)


def load_json(body: bytes, what: str) -> Any:
    """A JSON body, or BadRequest naming ``what`` it should have been."""
    try:
        return json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError covers invalid JSON, NaN and Infinity, and numbers too long to read.
        raise BadRequest(f"the {what} is not JSON: {str(exc)[:200]}") from None


def validated(model: type[M], raw: Any, what: str) -> M:
    """``raw`` as a ``model``, or BadRequest listing every problem."""
    try:
        return model.model_validate(raw)
    except (ValidationError, RecursionError) as exc:
        if isinstance(exc, RecursionError):
            raise BadRequest(f"the {what} is nested too deeply") from None
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or what}: {e['msg']}" for e in exc.errors()
        )
        raise BadRequest(f"invalid {what}: {problems}") from None


def refuse_unknown(
    raw: dict[str, Any], model: type[BaseModel], stamps: frozenset[str], noun: str, where: str = ""
) -> None:
    """BadRequest naming every field of ``raw`` that ``model`` lacks, with the fields
    it has; the server's own ``stamps`` apart, so a client sending them back learns
    why. ``noun`` names the document ("a failure report"); ``where`` prefixes the
    message (an event's place in its batch)."""
    unknown = set(raw).difference(model.model_fields)
    if not unknown:
        return
    problems = []
    if unknown - stamps:
        problems.append(
            f"unknown field(s) {', '.join(sorted(unknown - stamps))} ({noun} "
            f"has {', '.join(model.model_fields)})"
        )
    if unknown & stamps:
        problems.append(f"the server sets {', '.join(sorted(unknown & stamps))}")
    message = "; ".join(problems)
    raise BadRequest(f"{where}: {message}" if where else message)


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces; ASCII, so a lone surrogate stays an escape and the text
    always encodes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:40]} is too large for a JSON number")
    return value
