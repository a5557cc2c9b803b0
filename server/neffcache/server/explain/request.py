"""What an explanation is asked about: the body of ``POST /v1/ns/{ns}/explain``, and
the components and graph summary a client's event or failure record carried.

Strict like failure reports: unknown fields are refused, types are not coerced,
strings and lists are bounded, so a bad request is one clear 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from neffcache.keying import (
    CompileContext,
    KeyingError,
    KeyInputs,
    compile_env,
    compute_key,
    normalize_flags,
)
from neffcache.protocol import MODEL_LABEL, MODEL_LABEL_MAX
from neffcache.server.errors import BadRequest
from neffcache.server.explain.facts import Asked, GraphInfo
from neffcache.server.manifest import HEX64, load_json, validated

_SHAPE_MAX = 4096
_MAPPING_MAX = 64
_Shape = Annotated[str, Field(max_length=_SHAPE_MAX)]  # one instruction's "<opcode> <shape>"
_Value = Annotated[str, Field(max_length=65536)]  # a flag, a variable's value (XLA_FLAGS)
_Name = Annotated[str, Field(min_length=1, max_length=255)]


class GraphBody(BaseModel):
    """A graph's summary, as ``GraphSummary.as_json`` writes it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    structure: str = Field(pattern=f"^{HEX64}$")
    instructions: int = Field(ge=1, le=100_000_000)
    shapes: list[_Shape] | None = Field(None, max_length=10_000_000)

    @model_validator(mode="after")
    def _counted(self) -> GraphBody:
        if self.shapes is not None and len(self.shapes) != self.instructions:
            raise ValueError(
                f"shapes lists {len(self.shapes)} instructions; instructions says "
                f"{self.instructions}"
            )
        return self


class ComponentsBody(BaseModel):
    """A key's components as in a manifest (each optional), and optionally the graph."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    key_version: str | None = Field(None, max_length=16)
    fingerprint: str | None = Field(None, pattern=f"^{HEX64}$")
    compiler_version: _Name | None = None
    target: str | None = Field(None, min_length=1, max_length=16)
    flags: list[_Value] | None = Field(None, max_length=1024)
    env: dict[_Name, _Value] | None = Field(None, max_length=_MAPPING_MAX)
    frameworks: dict[_Name, _Value] | None = Field(None, max_length=_MAPPING_MAX)
    graph: GraphBody | None = None


class ExplainRequest(BaseModel):
    """The body of ``POST /v1/ns/{namespace}/explain``: a key, its components, or both;
    the graph summary beside the components or inside them (as events carry it)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    key: str | None = Field(None, pattern=f"^{HEX64}$")
    components: ComponentsBody | None = None
    graph: GraphBody | None = None
    model: str | None = Field(
        None, min_length=1, max_length=MODEL_LABEL_MAX, pattern=f"^{MODEL_LABEL}$"
    )

    @model_validator(mode="after")
    def _something(self) -> ExplainRequest:
        if self.key is None and self.components is None:
            raise ValueError("give a key, components, or both")
        if self.graph is not None and self.components is not None and self.components.graph:
            raise ValueError("give the graph once: beside the components or inside them")
        return self


def parse_request(namespace: str, body: bytes) -> tuple[Asked, bool]:
    """The graph asked about, and whether its components came with the request (else
    the server looks them up by key)."""
    raw = load_json(body, "explain request")
    if not isinstance(raw, dict):
        raise BadRequest("an explain request is a JSON object")
    _precheck(raw)
    asked = validated(ExplainRequest, raw, "explain request")
    if asked.components is None:
        return Asked(namespace, asked.key, {}, model=asked.model), False
    components = normalized(asked.components.model_dump(exclude_none=True, exclude={"graph"}))
    graph = asked.graph or asked.components.graph
    key = asked.key or key_of(components)
    return Asked(namespace, key, components, _info(graph), asked.model), True


def _precheck(raw: dict[str, Any]) -> None:
    """Refuse the request's large collections with one problem before validation: 8 MiB
    of ``[1,1,...]`` as shapes, or of variables as env, would be millions of problems,
    all listed in the 400 (seconds of work, hundreds of megabytes of answer)."""
    components = raw.get("components")
    graphs = [("graph", raw.get("graph"))]
    if isinstance(components, dict):
        graphs.append(("components.graph", components.get("graph")))
        for name in ("env", "frameworks"):
            value = components.get(name)
            if isinstance(value, dict) and len(value) > _MAPPING_MAX:
                raise BadRequest(
                    f"invalid explain request: components.{name}: at most {_MAPPING_MAX} "
                    f"names, not {len(value)}"
                )
    for where, graph in graphs:
        shapes = graph.get("shapes") if isinstance(graph, dict) else None
        if not isinstance(shapes, list):
            continue
        for i, shape in enumerate(shapes):
            if not isinstance(shape, str) or len(shape) > _SHAPE_MAX:
                raise BadRequest(
                    f"invalid explain request: {where}.shapes.{i}: a string of at most "
                    f"{_SHAPE_MAX} characters"
                )


def _info(graph: GraphBody | None) -> GraphInfo | None:
    if graph is None:
        return None
    shapes = tuple(graph.shapes) if graph.shapes is not None else None
    return GraphInfo(graph.structure, graph.instructions, shapes)


def normalized(components: Mapping[str, Any]) -> dict[str, Any]:
    """The components in the spelling keys use (``CompileContext``'s): flags through
    ``normalize_flags`` (``-O2`` is ``--optlevel=2``; a ``--target`` flag that agrees
    with the target lives only there), env reduced to the allowlisted variables (dump
    options out of ``XLA_FLAGS``), empty framework versions dropped. Explanations
    compare components in this form, so a spelling is never read as a difference; a
    component keying refuses stays as given (its key cannot be computed anyway)."""
    out = dict(components)
    flags, target = out.get("flags"), out.get("target")
    if isinstance(flags, list):
        try:
            kept = normalize_flags(flags)
        except KeyingError:
            kept = flags
        out["flags"] = [flag for flag in kept if flag != f"--target={target}"]
    env = out.get("env")
    if isinstance(env, dict):
        with suppress(KeyingError):  # XLA_FLAGS that do not split: kept as given
            out["env"] = compile_env(env)
    frameworks = out.get("frameworks")
    if isinstance(frameworks, dict):
        out["frameworks"] = {name: value for name, value in frameworks.items() if value}
    return out


def key_of(components: Mapping[str, Any]) -> str | None:
    """The key of complete components, computed as the client does; None when they
    are incomplete or do not make a key (another key version, say)."""
    try:
        context = CompileContext.create(
            compiler_version=components["compiler_version"],
            target=components["target"],
            flags=components.get("flags", ()),
            env=components.get("env"),
            frameworks=components.get("frameworks"),
        )
        key = compute_key(KeyInputs(components["fingerprint"], context))
    except (KeyError, KeyingError, TypeError):
        return None
    if (
        components.get("key_version", key.components["key_version"])
        != key.components["key_version"]
    ):
        return None
    return key.key


def stored_components(value: Any) -> tuple[dict[str, Any], GraphInfo | None]:
    """Components and graph from a stored event or failure record: validated like a
    request's, and dropped whole (``{}``) when they do not validate, since a client
    of another version may have sent them."""
    if not isinstance(value, dict):
        return {}, None
    try:
        parsed = ComponentsBody.model_validate(value)
    except ValueError:
        return {}, None
    components = normalized(parsed.model_dump(exclude_none=True, exclude={"graph"}))
    return components, _info(parsed.graph)
