"""What an explanation is asked about: the body of ``POST /v1/ns/{ns}/explain``, and
the components and graph summary a client's event or failure record carried.

Strict like failure reports: unknown fields are refused, types are not coerced,
strings and lists are bounded, so a bad request is one clear 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from neffcache.keying import CompileContext, KeyingError, KeyInputs, compute_key
from neffcache.server.errors import BadRequest
from neffcache.server.explain.facts import Asked, GraphInfo
from neffcache.server.manifest import HEX64, load_json, validated

_Shape = Annotated[str, Field(max_length=4096)]  # one instruction's "<opcode> <shape>"
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
    env: dict[_Name, _Value] | None = Field(None, max_length=64)
    frameworks: dict[_Name, _Value] | None = Field(None, max_length=64)
    graph: GraphBody | None = None


class ExplainRequest(BaseModel):
    """The body of ``POST /v1/ns/{namespace}/explain``: a key, its components, or both;
    the graph summary beside the components or inside them (as events carry it)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    key: str | None = Field(None, pattern=f"^{HEX64}$")
    components: ComponentsBody | None = None
    graph: GraphBody | None = None
    model: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")

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
    asked = validated(ExplainRequest, raw, "explain request")
    if asked.components is None:
        return Asked(namespace, asked.key, {}, model=asked.model), False
    components = asked.components.model_dump(exclude_none=True, exclude={"graph"})
    graph = asked.graph or asked.components.graph
    key = asked.key or key_of(components)
    return Asked(namespace, key, components, _info(graph), asked.model), True


def _info(graph: GraphBody | None) -> GraphInfo | None:
    if graph is None:
        return None
    shapes = tuple(graph.shapes) if graph.shapes is not None else None
    return GraphInfo(graph.structure, graph.instructions, shapes)


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
    return parsed.model_dump(exclude_none=True, exclude={"graph"}), _info(parsed.graph)
