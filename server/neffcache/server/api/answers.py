"""What the routes answer, as the OpenAPI schema (``/openapi.json``) declares it.

Many routes build their own ``Response`` (an entry is stored JSON, spliced rather than
decoded and encoded again), which FastAPI cannot describe: they declare their answers
here, statuses and bodies, so that the schema says what a client gets and the fuzz
test (tests/faults/test_fuzz_api.py) checks every answer against it. Every error body
is ``{"detail": str}`` (``app.error_response``), a few with more: ``missing`` (digests
to upload first), ``reason`` (why a lookup missed).

Declared, not enforced: nothing here validates an answer at run time.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from neffcache.server.manifest import HEX64, NAMESPACE, Manifest

Schema = dict[str, Any]
Answers = dict[int | str, dict[str, Any]]


def inlined(schema: Any, defs: dict[str, Any]) -> Any:
    """``schema`` with each ``#/$defs/X`` reference replaced by X (none is recursive),
    so that it stands alone inside the OpenAPI document."""
    if isinstance(schema, dict):
        ref = schema.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return inlined(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: inlined(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [inlined(item, defs) for item in schema]
    return schema


def model_schema(model: type[BaseModel]) -> Schema:
    """A model's JSON schema, standing alone (no ``$defs``)."""
    schema = model.model_json_schema()
    standalone: Schema = inlined(schema, schema.get("$defs", {}))
    return standalone


def request_body(model: type[BaseModel] | Schema) -> dict[str, Any]:
    """``openapi_extra`` for a JSON body a route reads itself (api/body.py)."""
    schema = model if isinstance(model, dict) else model_schema(model)
    return {"requestBody": {"content": {"application/json": {"schema": schema}}}}


# --- building blocks

HEX = {"type": "string", "pattern": f"^{HEX64}$"}
NAME = {"type": "string", "pattern": f"^{NAMESPACE}$"}
NUMBER = {"type": "number"}
SECONDS = {"type": "number", "minimum": 0}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> Schema:
    """An object with these fields (the required ones always present); others allowed:
    an answer may gain fields without breaking a reader."""
    return {
        "type": "object",
        "required": sorted(required),
        "properties": {**required, **(optional or {})},
    }


def array(items: Schema, min_items: int = 0) -> Schema:
    schema: Schema = {"type": "array", "items": items}
    if min_items:
        schema["minItems"] = min_items
    return schema


# --- errors

PROBLEM = obj({"detail": {"type": "string"}}, {"missing": array(HEX)})
ABSENT = obj({"detail": {"type": "string"}, "reason": {"type": "string", "enum": ["absent"]}})

_WHY = {
    400: "a malformed path, query, header or body",
    401: "no token, or an unknown or revoked one",
    403: "the token lacks the scope or the namespace (or is not trusted, where required)",
    404: "absent",
    408: "the request body sent nothing for 60 s",
    409: "a conflict with what the server holds",
    413: "the body is over its cap",
    416: "a Range outside the blob, or not one bytes=a-b range",
    503: "a backend cannot be reached",
    507: "the store is out of space; nothing partial is kept",
}
# Every route behind a token: the token is checked, then the request.
TOKEN = (400, 401, 403)
# Every route that reads a JSON body itself (api/body.py), on top of TOKEN.
BODY = (408, 413)


def errors(*statuses: int, **why: str) -> Answers:
    """Error answers, each ``{"detail": ...}``; ``why`` overrides a description
    (keyed ``e404`` and so on)."""
    return {
        status: {
            "description": why.get(f"e{status}", _WHY[status]),
            "content": {"application/json": {"schema": PROBLEM}},
        }
        for status in statuses
    }


def missed(what: str) -> Answers:
    """The 404 of a lookup that missed: ``{"detail": ..., "reason": "absent"}``."""
    return {404: {"description": what, "content": {"application/json": {"schema": ABSENT}}}}


def json_answer(status: int, schema: Schema, description: str) -> Answers:
    return {
        status: {"description": description, "content": {"application/json": {"schema": schema}}}
    }


def formats_answer(status: int, schemas: dict[str, Schema], description: str) -> Answers:
    """An answer in one of several media types, ``{media type: schema}``."""
    content = {media: {"schema": schema} for media, schema in schemas.items()}
    return {status: {"description": description, "content": content}}


def no_body(status: int, description: str) -> Answers:
    return {status: {"description": description}}


# --- bodies


def _entry() -> Schema:
    """An entry as ``GET .../entries/{key}`` returns it: the manifest as published
    (further fields kept as sent) plus the server's stamps."""
    manifest = model_schema(Manifest)
    manifest["required"] = sorted({*manifest["required"], "created_at", "namespace", "writer"})
    manifest["properties"] = {
        **manifest["properties"],
        "created_at": NUMBER,
        "namespace": NAME,
        "writer": {"type": "string"},
    }
    manifest.pop("title", None)
    manifest.pop("description", None)
    return manifest


ENTRY = _entry()

FAILURE = obj(
    {
        "compiler_version": {"type": "string", "minLength": 1},
        "namespace": NAME,
        "key": HEX,
        "created_at": NUMBER,
        "writer": {"type": "string"},
        "log_truncated": {"type": "boolean"},
    },
    {
        "neuron_address": {"type": "string"},
        "direct_key": HEX,
        "components": {"type": "object"},
        "exit_code": {"type": "integer"},
        "compile_seconds": SECONDS,
        "log": {"type": "string"},
        "host": {"type": "string"},
        "job_id": {"type": "string"},
    },
)
