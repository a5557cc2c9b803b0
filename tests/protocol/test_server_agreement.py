"""The server states the protocol with pydantic and FastAPI; neffcache.protocol states it
in the standard library for the client. These tests hold the two statements equal:
the same fields, patterns and required set, the same verdict on every manifest of a
table, and the same routes, lease words, lease ids, alias names, model labels and
counter names."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError

from neffcache import protocol
from neffcache.protocol import counters, routes
from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.errors import BadRequest
from neffcache.server.eviction.pins import check_pin
from neffcache.server.explain.request import ExplainRequest
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.manifest import FileRef as ServerFileRef
from neffcache.server.manifest import Manifest as ServerManifest
from neffcache.server.services import leases as lease_service
from neffcache.server.settings import ServerSettings
from neffcache.server.telemetry import counters as server_counters
from neffcache.server.telemetry import schema as telemetry_schema

KEY = "a" * 64
DIGEST = "b" * 64
ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
GOOD: dict[str, Any] = {
    "key": KEY,
    "direct_key": "c" * 64,
    "neuron_address": ADDRESS,
    "components": {"compiler_version": "2.20.9961.0+0acef03a", "graph": {"n": 1}},
    "files": {
        "model.neff": {"digest": DIGEST, "size": 4096},
        "model.hlo_module.pb": {"digest": "d" * 64, "size": 0},
    },
    "compile_seconds": 12.5,
    "model": "llama-3-8b",
    "host": "node-1",  # a field the protocol does not name: kept as sent
}


def with_(**changes: Any) -> dict[str, Any]:
    """GOOD with ``changes``; a value of ``...`` removes the field."""
    manifest = copy.deepcopy(GOOD)
    for field, value in changes.items():
        if value is ...:
            manifest.pop(field, None)
        else:
            manifest[field] = value
    return manifest


def one_file(ref: Any, name: Any = "model.neff") -> dict[str, Any]:
    return with_(files={name: ref})


ACCEPTED = {
    "full": GOOD,
    "minimal": {"key": KEY, "files": {"model.neff": {"digest": DIGEST, "size": 1}}},
    "nulls": with_(direct_key=None, neuron_address=None, compile_seconds=None, model=None),
    "int-seconds": with_(compile_seconds=7),
    "zero-seconds": with_(compile_seconds=0),
    "empty-components": with_(components={}),
    "server-stamps": with_(created_at=1.0, namespace="team", writer="tok"),
    "size-0": one_file({"digest": DIGEST, "size": 0}),
    "size-1TiB": one_file({"digest": DIGEST, "size": protocol.MAX_FILE_BYTES}),
    "name-with-plus": one_file({"digest": DIGEST, "size": 1}, "graph+0acef03a.neff"),
    "name-128": one_file({"digest": DIGEST, "size": 1}, "a" * 128),
    "model-200": with_(model="m" * protocol.MODEL_LABEL_MAX),
    "model-unicode": with_(model="modèle ñ"),
    "address-long-version": with_(neuron_address="neuronxcc-2.21.1.0.0+abc/MODULE_x+0123abcd"),
}

REFUSED = {
    "not-an-object": [GOOD],
    "null": None,
    "no-key": with_(key=...),
    "no-files": with_(files=...),
    "key-upper": with_(key="A" * 64),
    "key-short": with_(key="a" * 63),
    "key-newline": with_(key=KEY + "\n"),
    "key-null": with_(key=None),
    "key-number": with_(key=1),
    "direct-key-bad": with_(direct_key="xyz"),
    "address-no-module": with_(neuron_address="neuronxcc-2.20/graph"),
    "address-bad-flags": with_(neuron_address=ADDRESS[:-1] + "G"),
    "address-no-build": with_(neuron_address="neuronxcc-2.20/MODULE_1+0123abcd"),
    "address-number": with_(neuron_address=5),
    "components-null": with_(components=None),
    "components-list": with_(components=[1]),
    "files-empty": with_(files={}),
    "files-list": with_(files=["model.neff"]),
    "name-dotdot": one_file({"digest": DIGEST, "size": 1}, ".."),
    "name-slash": one_file({"digest": DIGEST, "size": 1}, "a/b"),
    "name-hidden": one_file({"digest": DIGEST, "size": 1}, ".lock"),
    "name-129": one_file({"digest": DIGEST, "size": 1}, "a" * 129),
    "ref-string": one_file(DIGEST),
    "ref-extra": one_file({"digest": DIGEST, "size": 1, "mode": 420}),
    "ref-no-size": one_file({"digest": DIGEST}),
    "ref-no-digest": one_file({"size": 1}),
    "digest-upper": one_file({"digest": DIGEST.upper(), "size": 1}),
    "digest-path": one_file({"digest": "../../etc/passwd", "size": 1}),
    "size-negative": one_file({"digest": DIGEST, "size": -1}),
    "size-over-1TiB": one_file({"digest": DIGEST, "size": protocol.MAX_FILE_BYTES + 1}),
    "size-text": one_file({"digest": DIGEST, "size": "4096"}),
    "size-float": one_file({"digest": DIGEST, "size": 1.0}),
    "size-bool": one_file({"digest": DIGEST, "size": True}),
    "seconds-negative": with_(compile_seconds=-0.5),
    "seconds-text": with_(compile_seconds="12"),
    "seconds-bool": with_(compile_seconds=True),
    "seconds-inf": with_(compile_seconds=float("inf")),
    "seconds-nan": with_(compile_seconds=float("nan")),
    "seconds-huge-int": with_(compile_seconds=10**400),
    "model-empty": with_(model=""),
    "model-201": with_(model="m" * (protocol.MODEL_LABEL_MAX + 1)),
    "model-newline": with_(model="a\nb"),
    "model-del": with_(model="a\x7f"),
    "model-number": with_(model=3),
}


def protocol_accepts(manifest: object) -> bool:
    try:
        protocol.parse(manifest)
    except protocol.ManifestError:
        return False
    return True


def server_accepts(manifest: object) -> bool:
    try:
        ServerManifest.model_validate(manifest)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("manifest", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_both_accept(manifest: dict[str, Any]) -> None:
    assert protocol_accepts(manifest)
    assert server_accepts(manifest)


@pytest.mark.parametrize("manifest", REFUSED.values(), ids=REFUSED.keys())
def test_both_refuse(manifest: object) -> None:
    assert not protocol_accepts(manifest)
    assert not server_accepts(manifest)


def test_same_fields_and_required_set() -> None:
    fields = ServerManifest.model_fields
    assert tuple(fields) == protocol.FIELDS
    assert {name for name, info in fields.items() if info.is_required()} == protocol.REQUIRED
    assert tuple(ServerFileRef.model_fields) == protocol.FILE_REF_FIELDS
    assert all(info.is_required() for info in ServerFileRef.model_fields.values())
    assert ServerManifest.model_config.get("extra") == "allow"  # others kept, as parse does
    assert ServerFileRef.model_config.get("extra") == "forbid"


def _pattern(schema: dict[str, Any]) -> str:
    """A field's pattern, through ``anyOf`` for an optional one."""
    for option in [schema, *schema.get("anyOf", [])]:
        if "pattern" in option:
            return str(option["pattern"])
    raise AssertionError(f"no pattern in {schema}")


def test_same_patterns_and_bounds() -> None:
    schema = ServerManifest.model_json_schema()
    fields = schema["properties"]
    assert _pattern(fields["key"]) == f"^{protocol.HEX64}$"
    assert _pattern(fields["direct_key"]) == f"^{protocol.HEX64}$"
    assert _pattern(fields["neuron_address"]) == f"^{protocol.NEURON_ADDRESS}$"
    assert _pattern(fields["model"]) == f"^{protocol.MODEL_LABEL}$"
    assert fields["files"]["propertyNames"]["pattern"] == f"^{protocol.FILE_NAME}$"
    ref = ServerFileRef.model_json_schema()["properties"]
    assert ref["digest"]["pattern"] == f"^{protocol.HEX64}$"
    assert (ref["size"]["minimum"], ref["size"]["maximum"]) == (0, protocol.MAX_FILE_BYTES)
    model = next(o for o in fields["model"]["anyOf"] if o.get("type") == "string")
    assert model["maxLength"] == protocol.MODEL_LABEL_MAX


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = Path(tmp_path_factory.mktemp("openapi"))
    blobs, index = MemoryBlobStore(), MemoryIndex()
    try:
        app = create_app(ServerSettings(data_dir=data), blob_store=blobs, index=index)
        yield app.openapi()
    finally:
        blobs.close()  # its staging directory, else removed (and warned of) at exit
        index.close()


ROUTES = {
    routes.BLOB_ROUTE: {"get", "head", "put"},
    routes.BLOB_MISMATCH_ROUTE: {"post"},
    routes.BLOBS_MISSING: {"post"},
    routes.ENTRIES_ROUTE: {"get"},
    routes.ENTRY_ROUTE: {"get", "put"},
    routes.ALIAS_ROUTE: {"get", "put"},
    routes.FAILURE_ROUTE: {"get", "put"},
    routes.LEASE_ROUTE: {"post", "put", "delete"},
    routes.EXPLAIN_ROUTE: {"post"},
    routes.EVENTS: {"post"},
    routes.STATUS: {"get"},
}


@pytest.mark.parametrize(("template", "methods"), ROUTES.items(), ids=ROUTES.keys())
def test_every_route_is_served(openapi: dict[str, Any], template: str, methods: set[str]) -> None:
    assert template in openapi["paths"]
    assert methods <= set(openapi["paths"][template])


def test_the_paths_a_client_builds_fill_the_templates() -> None:
    def fill(template: str, **values: str) -> str:
        return template.format(**values)

    assert routes.entry_path("team", KEY) == fill(routes.ENTRY_ROUTE, namespace="team", key=KEY)
    assert routes.entries_path("team") == fill(routes.ENTRIES_ROUTE, namespace="team")
    assert routes.blob_path(DIGEST) == fill(routes.BLOB_ROUTE, digest=DIGEST)
    assert routes.blob_mismatch_path(DIGEST) == fill(routes.BLOB_MISMATCH_ROUTE, digest=DIGEST)
    assert routes.failure_path("t", KEY) == fill(routes.FAILURE_ROUTE, namespace="t", key=KEY)
    assert routes.explain_path("t") == fill(routes.EXPLAIN_ROUTE, namespace="t")
    assert routes.lease_path("t", KEY) == fill(routes.LEASE_ROUTE, namespace="t", name=KEY)
    assert routes.alias_path("t", KEY) == fill(routes.ALIAS_ROUTE, namespace="t", alias=KEY)


def _parameter(openapi: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    found = [p for p in openapi["paths"][path][method]["parameters"] if p["name"] == name]
    assert found, f"{method} {path} has no parameter {name}"
    schema: dict[str, Any] = found[0]["schema"]
    return schema


def test_path_parameters_use_the_protocol_patterns(openapi: dict[str, Any]) -> None:
    namespace = _parameter(openapi, routes.ENTRY_ROUTE, "get", "namespace")
    assert namespace["pattern"] == f"^{protocol.NAMESPACE}$"
    assert _parameter(openapi, routes.ENTRY_ROUTE, "get", "key")["pattern"] == (
        f"^{protocol.HEX64}$"
    )
    assert _parameter(openapi, routes.BLOB_ROUTE, "get", "digest")["pattern"] == (
        f"^{protocol.HEX64}$"
    )
    lease = _parameter(openapi, routes.LEASE_ROUTE, "put", "lease")
    assert lease["pattern"] == f"^{protocol.LEASE_ID}$"


def _states(schema: Any) -> set[str]:
    """Every value a ``state`` property may take anywhere in ``schema``."""
    found: set[str] = set()
    if isinstance(schema, dict):
        state = schema.get("properties", {}).get("state")
        if isinstance(state, dict):
            found.update(state.get("enum", []))
            if "const" in state:
                found.add(state["const"])
        for value in schema.values():
            found |= _states(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= _states(item)
    return found


def test_lease_answer_states_and_outcomes(openapi: dict[str, Any]) -> None:
    answers = openapi["paths"][routes.LEASE_ROUTE]["post"]["responses"]
    assert _states(answers) == protocol.ANSWER_STATES
    outcome = _parameter(openapi, routes.LEASE_ROUTE, "delete", "outcome")
    assert set(outcome["enum"]) == protocol.LEASE_OUTCOMES
    assert set(get_args(protocol.AnswerState)) == protocol.ANSWER_STATES
    # The grant policy answers in the protocol's words, whatever the routes say.
    assert get_type_hints(lease_service.Answer)["state"] == protocol.AnswerState


def test_lease_ids_use_the_protocol_pattern(openapi: dict[str, Any]) -> None:
    for method in ("put", "delete"):
        lease = _parameter(openapi, routes.LEASE_ROUTE, method, "lease")
        assert lease["pattern"] == f"^{protocol.LEASE_ID}$"
    granted = openapi["paths"][routes.LEASE_ROUTE]["post"]["responses"]["201"]
    schema = granted["content"]["application/json"]["schema"]
    assert schema["properties"]["lease"]["pattern"] == f"^{protocol.LEASE_ID}$"


def _model_label(model: type[BaseModel]) -> dict[str, Any]:
    field = model.model_json_schema()["properties"]["model"]
    found: dict[str, Any] = next(o for o in field["anyOf"] if o.get("type") == "string")
    return found


@pytest.mark.parametrize(
    "model",
    [ServerManifest, telemetry_schema.GraphEvent, telemetry_schema.CountersEvent, ExplainRequest],
)
def test_every_model_label_is_the_protocols(model: type[BaseModel]) -> None:
    label = _model_label(model)
    assert label["pattern"] == f"^{protocol.MODEL_LABEL}$"
    assert (label["minLength"], label["maxLength"]) == (1, protocol.MODEL_LABEL_MAX)


NAMES = [
    KEY,
    ADDRESS,
    "neuronxcc-2.20/MODULE_1+0123abcd",  # no build string: an alias all the same
    "neuronxcc-2/MODULE_x+0123abcd",
    "A" * 64,
    "a" * 63,
    "neuronxcc-x/MODULE_1+0123abcd",
    "neuronxcc-2.20/MODULE_1+0123ABCD",
    "neuronxcc-2.20/graph",
    "MODULE_1+0123abcd",
    "team/" + KEY,
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    data = Path(tmp_path_factory.mktemp("served"))
    blobs, index = MemoryBlobStore(), MemoryIndex()
    try:
        app = create_app(ServerSettings(data_dir=data), blob_store=blobs, index=index)
        with TestClient(app) as client:
            yield client
    finally:
        blobs.close()
        index.close()


def _pin_takes(name: str) -> bool:
    try:
        check_pin("address", name)
    except BadRequest:
        return False
    return True


@pytest.mark.parametrize("name", NAMES)
def test_alias_and_lease_names_are_the_protocols(served: TestClient, name: str) -> None:
    taken = protocol.is_alias(name)
    alias = served.get(routes.alias_path("team", name))
    assert alias.status_code == (404 if taken else 400), alias.text
    lease = served.post(routes.lease_path("team", name), json={"take": False})
    assert lease.status_code == (200 if taken else 400), lease.text
    assert _pin_takes(name) == taken


def test_counter_names() -> None:
    names = {member.value for member in counters.ClientCounter}
    assert server_counters.CLIENT_COUNTERS == names == counters.CLIENT_COUNTERS
    assert all(protocol.is_counter_name(name) for name in names)
    assert {m.name.lower() for m in counters.ClientCounter} == names  # member = its value


def server_takes_counter(name: str) -> bool:
    event = {"kind": "counters", "namespace": "team", "counts": {name: 1}}
    try:
        telemetry_schema.CountersEvent.model_validate(event)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    "name", ["hits_l1", "a", "x" * 64, "x" * 65, "", "Hits", "hits-l1", "hits l1", "é", "a\n"]
)
def test_counter_name_pattern(name: str) -> None:
    assert protocol.is_counter_name(name) == server_takes_counter(name)
