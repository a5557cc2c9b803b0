"""The API half of the fuzzing: schemathesis fuzzes every operation of
the served OpenAPI schema (``/openapi.json``), with and without tokens.

Nothing lost: no request, however malformed, gets a 5xx; every answer has a status the
schema declares for its operation, a declared content type, and a body that matches the
declared schema (so a client reading by the schema never meets a shape it was not told
of, and an error is always ``{"detail": ...}``).

Each operation is called as four callers: no token (refused, the server has tokens),
the Authorization header schemathesis generates (a forged token, or none), a read token
for ``team-a``, and an admin token for every namespace (``EXAMPLES``: 34 requests per
operation). Requests are schema-valid ("positive"); for the admin also schema-invalid
("negative") and with any JSON value as the body; for the reader and the admin, some
name what the world holds (namespace ``team-a``, a published key, its aliases, the
blob, with bodies pointing at them), so hits, conflicts, held leases and stored records
are answered too, not only misses and refusals. Each operation and caller runs against
a fresh app over in-memory stores, seeded with one entry, its blob, a failure record, a
pin and a held lease; hypothesis is derandomized, so CI sends the same requests every
time.

The blob routes are also checked case by case (their answers are bytes, redirects
and ranges, which generated requests rarely reach). The dashboard (``/``, ``/assets/{name}``),
outside the schema, has its own small fuzz below. Not covered here: request bodies that
stall or stop (items 2 and 7), the Redis and S3 stores (the routes are the same; the
stores have their own suites), the S3 redirect (307) of a blob GET.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import blake3
import httpx
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, BaseSchema, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from neffcache.server.app import create_app
from neffcache.server.auth import new_token
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

ADMIN_SECRET = "nfc_fuzz_admin_secret"
NEFF = b"a neff for the fuzzer"
NEFF_DIGEST: str = blake3.blake3(NEFF).hexdigest()
KEY = "a" * 64  # published in team-a
DIRECT_KEY = "d" * 64
HELD_KEY = "b" * 64  # a lease the admin holds
FAILED_KEY = "c" * 64  # a failure record, no entry
ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
COMPILER = "2.20.9961.0+0acef03a"
MANIFEST = {
    "key": KEY,
    "direct_key": DIRECT_KEY,
    "neuron_address": ADDRESS,
    "components": {"compiler_version": COMPILER, "target": "trn2"},
    "files": {"model.neff": {"digest": NEFF_DIGEST, "size": len(NEFF)}},
    "compile_seconds": 12.5,
    "model": "fuzz",
}

ANONYMOUS = "anonymous"
FORGED = "forged"  # whatever Authorization schemathesis generates, if any
READER = "read team-a"
ADMIN = "admin *"
# Examples per operation and caller, by kind: schema-valid requests ("positive"),
# schema-invalid ones ("negative"), valid ones whose body is any JSON value at all
# ("garbage": not an object, nested, NaN), and valid ones naming what the seed holds
# ("known"). An operation without a body or without seeded paths gives those budgets
# to "positive". Most go to the admin, whom nothing refuses. Each kind is a hypothesis
# run of its own, so that every kind is tried whatever hypothesis draws first.
EXAMPLES = {
    ANONYMOUS: {"positive": 3},
    FORGED: {"positive": 3},
    READER: {"positive": 4, "known": 5},
    ADMIN: {"positive": 6, "negative": 5, "garbage": 2, "known": 6},
}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)

# Every operation of the schema, written out: a route added to the app without being
# listed here fails test_every_operation_is_fuzzed, so nothing is left unfuzzed.
OPERATIONS = (
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
    "PUT /v1/blobs/{digest}",
    "HEAD /v1/blobs/{digest}",
    "GET /v1/blobs/{digest}",
    "POST /v1/blobs/missing",
    "POST /v1/blobs/{digest}/mismatch",
    "PUT /v1/ns/{namespace}/entries/{key}",
    "GET /v1/ns/{namespace}/entries/{key}",
    "GET /v1/ns/{namespace}/entries/{key}/aliases",
    "GET /v1/ns/{namespace}/aliases/{alias}",
    "PUT /v1/ns/{namespace}/aliases/{alias}",
    "GET /v1/ns/{namespace}/entries",
    "PUT /v1/ns/{namespace}/failures/{key}",
    "GET /v1/ns/{namespace}/failures/{key}",
    "POST /v1/ns/{namespace}/leases/{name}",
    "PUT /v1/ns/{namespace}/leases/{name}",
    "DELETE /v1/ns/{namespace}/leases/{name}",
    "POST /v1/admin/tokens",
    "GET /v1/admin/tokens",
    "DELETE /v1/admin/tokens/{token_id}",
    "GET /v1/admin/namespaces",
    "GET /v1/admin/namespaces/{namespace}",
    "POST /v1/admin/namespaces/{namespace}",
    "PATCH /v1/admin/namespaces/{namespace}",
    "GET /v1/admin/namespaces/{namespace}/pins",
    "PUT /v1/admin/namespaces/{namespace}/pins",
    "DELETE /v1/admin/namespaces/{namespace}/pins",
    "POST /v1/admin/evict",
    "POST /v1/admin/expire",
    "GET /v1/admin/audit",
    "POST /v1/events",
    "GET /v1/reports/cost",
    "GET /v1/reports/upgrade",
    "GET /v1/ns/{namespace}/explain/{key}",
    "POST /v1/ns/{namespace}/explain",
    "GET /v1/status",
)

Operation = APIOperation[Any, Any, Any, Any]

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass
class World:
    """A fresh app over in-memory stores, seeded, with a token per caller."""

    client: TestClient
    tokens: dict[str, str]  # caller -> secret; none for the anonymous and forged ones
    answered: list[int] = field(default_factory=list)  # the statuses of the fuzzed calls

    def authorize(self, case: Case[Any], role: str) -> None:
        """Replace the generated Authorization header with the caller's (or none)."""
        if role == FORGED:
            return
        for name in [n for n in case.headers or {} if n.lower() == "authorization"]:
            del case.headers[name]
        if role in self.tokens:
            if case.headers is None:
                case.headers = {}
            case.headers["Authorization"] = f"Bearer {self.tokens[role]}"


def settings_for(data_dir: Path) -> ServerSettings:
    return ServerSettings(
        data_dir=data_dir,
        bootstrap_admin_token=ADMIN_SECRET,
        lease_wait_max_seconds=0,  # a generated wait of 600 s answers at once
        eviction_interval_seconds=0,  # no background pass: each case sees the seed
    )


def seed(client: TestClient) -> None:
    """One entry (with both aliases) and its blob, a failure record, a pin and a held
    lease in ``team-a``, so that fuzzed requests naming them find something."""
    admin = {"Authorization": f"Bearer {ADMIN_SECRET}"}
    put = client.put(f"/v1/blobs/{NEFF_DIGEST}", content=NEFF, headers=admin)
    assert put.status_code == 201, put.text
    entry = client.put(f"/v1/ns/team-a/entries/{KEY}", json=MANIFEST, headers=admin)
    assert entry.status_code == 201, entry.text
    report = {"compiler_version": COMPILER, "exit_code": 70, "log": "error", "compile_seconds": 3}
    failed = client.put(f"/v1/ns/team-a/failures/{FAILED_KEY}", json=report, headers=admin)
    assert failed.status_code == 201, failed.text
    pin = {"kind": "model", "value": "fuzz", "reason": "seed"}
    pinned = client.put("/v1/admin/namespaces/team-a/pins", json=pin, headers=admin)
    assert pinned.status_code == 201, pinned.text
    lease = client.post(f"/v1/ns/team-a/leases/{HELD_KEY}", json={"holder": "seed"}, headers=admin)
    assert lease.status_code == 201, lease.text


@contextlib.contextmanager
def running_world(data_dir: Path) -> Iterator[World]:
    blobs, index = MemoryBlobStore(), MemoryIndex()
    reader, secret = new_token("read", ("team-a",), "fuzz reader")
    index.put_token(reader)
    app = create_app(settings_for(data_dir), blob_store=blobs, index=index)
    try:
        with TestClient(app) as client:
            seed(client)
            yield World(client, {READER: secret, ADMIN: ADMIN_SECRET})
    finally:  # stores passed in belong to the caller, not the app
        blobs.close()
        index.close()


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> BaseSchema:
    """The schema the app serves, as a client would fetch it."""
    with running_world(tmp_path_factory.mktemp("schema")) as world:
        served = world.client.get("/openapi.json")
        assert served.status_code == 200
        loaded: BaseSchema = schemathesis.openapi.from_dict(served.json())
        return loaded


def labels(schema: BaseSchema) -> set[str]:
    found = set()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # an operation schemathesis cannot read
        found.add(result.ok().label)
    return found


def test_every_operation_is_fuzzed(schema: BaseSchema) -> None:
    assert len(set(OPERATIONS)) == len(OPERATIONS), "an operation is listed twice"
    assert labels(schema) == set(OPERATIONS)


# Path parameters naming what the seed holds, by parameter name.
KNOWN: dict[str, list[str]] = {
    "namespace": ["team-a"],
    "key": [KEY, FAILED_KEY],
    "alias": [ADDRESS, DIRECT_KEY],
    "name": [KEY, HELD_KEY, ADDRESS, FAILED_KEY],
    "digest": [NEFF_DIGEST],
}


def known_paths(operation: Operation) -> list[dict[str, str]]:
    """Path parameters that name seeded things, one set per value of the longest list;
    empty when the operation has a path parameter nothing seeded fits (a token id)."""
    names = [p.name for p in operation.path_parameters]
    if not names or any(n not in KNOWN for n in names):
        return []
    width = max(len(KNOWN[n]) for n in names)
    return [{n: KNOWN[n][i % len(KNOWN[n])] for n in names} for i in range(width)]


def with_seed(case: Case[Any]) -> Case[Any]:
    """A generated body made to name what the seed holds (the blob, an entry, the
    compiler), so that the fields fuzzed around it reach the deeper answers: a publish,
    a conflict, a stored record, not only the 400 of a dangling reference."""
    body = case.body
    if not isinstance(body, dict):
        return case
    label = case.operation.label
    if label == "PUT /v1/ns/{namespace}/entries/{key}":
        body["key"] = case.path_parameters["key"]
        body["files"] = {"model.neff": {"digest": NEFF_DIGEST, "size": len(NEFF)}}
    elif label == "PUT /v1/ns/{namespace}/aliases/{alias}":
        body["key"] = KEY
    elif label == "PUT /v1/ns/{namespace}/failures/{key}":
        body["compiler_version"] = COMPILER
        if "neuron_address" in body:
            body["neuron_address"] = ADDRESS
    return case


# GenerationMode is a StrEnum, which mypy reads as str for Python 3.10.
POSITIVE: Any = GenerationMode.POSITIVE
NEGATIVE: Any = GenerationMode.NEGATIVE


def negatable(operation: Operation) -> bool:
    """Whether a request can break the schema somewhere but in the Authorization header
    (any string, as a plain-string path parameter is): a body, or a parameter with a
    type, pattern or bound. Schemathesis finds nothing to negate otherwise."""
    if operation.body:
        return True
    plain = {"type": "string"}
    for group in (operation.path_parameters, operation.query, operation.headers):
        for parameter in group:
            schema = {
                k: v
                for k, v in parameter.definition.get("schema", {}).items()
                if k not in ("title", "description")
            }
            if parameter.name.lower() != "authorization" and schema != plain:
                return True
    return False


def cases(operation: Operation, role: str) -> list[tuple[st.SearchStrategy[Case[Any]], int]]:
    """The strategies a caller's requests come from, each with its number of examples."""
    budget = dict(EXAMPLES[role])
    known = known_paths(operation)
    if not known:
        budget["positive"] += budget.pop("known", 0)
    if not operation.body:
        budget["positive"] += budget.pop("garbage", 0)
    if not negatable(operation):
        budget["positive"] += budget.pop("negative", 0)
    runs = [(operation.as_strategy(generation_mode=POSITIVE), budget["positive"])]
    if "negative" in budget:
        runs.append((operation.as_strategy(generation_mode=NEGATIVE), budget["negative"]))
    if "garbage" in budget:
        # At seeded paths where there are some: a route checks its path first.
        paths = st.sampled_from(known) if known else st.none()
        garbage = st.tuples(paths, JSON_VALUES).flatmap(
            lambda drawn: operation.as_strategy(path_parameters=drawn[0], body=drawn[1])
        )
        runs.append((garbage, budget["garbage"]))
    if "known" in budget:
        seeded = (
            st.sampled_from(known)
            .flatmap(lambda path: operation.as_strategy(path_parameters=path))
            .map(with_seed)
        )
        runs.append((seeded, budget["known"]))
    return runs


def send(client: TestClient, case: Case[Any]) -> httpx.Response:
    """The case through the app, in process (schemathesis serializes it as for
    ``requests``; TestClient speaks httpx)."""
    sent = case.as_transport_kwargs(base_url="http://testserver")
    body: dict[str, Any] = {}
    if "json" in sent:  # NaN and infinities too, as some clients send them
        body["content"] = json.dumps(sent["json"], allow_nan=True).encode()
    data = sent.get("data")
    if isinstance(data, (bytes, str)):
        body["content"] = data
    elif data is not None:
        body["data"] = data
    if sent.get("files"):
        body["files"] = sent["files"]
    headers = {str(k): _latin1(v) for k, v in (sent.get("headers") or {}).items()}
    response: httpx.Response = client.request(
        sent["method"], sent["url"], params=sent.get("params"), headers=headers, **body
    )
    return response


def _latin1(value: Any) -> bytes:
    # As a server reads a header; httpx would refuse a str that is not ASCII.
    return str(value).encode("latin-1", "replace")


@pytest.mark.parametrize("role", list(EXAMPLES))
@pytest.mark.parametrize("label", OPERATIONS)
def test_fuzz(schema: BaseSchema, tmp_path: Path, label: str, role: str) -> None:
    operation = schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in the schema"
    with running_world(tmp_path) as world:
        for strategy, examples in cases(operation, role):

            @settings(
                max_examples=examples,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def fuzz(case: Case[Any]) -> None:
                world.authorize(case, role)
                response = send(world.client, case)
                world.answered.append(response.status_code)
                case.validate_response(response, checks=CHECKS)

            fuzz()
    assert world.answered, f"{label} was never called"
    if role == ADMIN:
        # The admin's requests reach the routes, not only the token check.
        assert set(world.answered) - {401, 403}, f"{label}: every answer was a refusal"
        if label.startswith("GET ") and known_paths(operation):
            # ... and those naming what the seed holds find it.
            assert 200 in world.answered, f"{label}: nothing seeded was found"


# --- outside the schema: the dashboard and the schema itself


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One world for hypothesis tests (a fresh one per example would cost more than
    the example): for requests that change nothing."""
    with running_world(tmp_path_factory.mktemp("shared")) as running:
        yield running


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    name=st.text(min_size=1, max_size=40),
    version=st.one_of(st.none(), st.text(max_size=20)),
    etag=st.one_of(st.none(), st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126))),
)
def test_dashboard_assets_answer_an_asset_or_a_clean_error(
    shared: World, name: str, version: str | None, etag: str | None
) -> None:
    """The dashboard's routes are outside the schema (they hold no data): any asset
    name, ``?v=`` and ``If-None-Match`` is answered 200 or 304, or a JSON 400 or 404."""
    headers = {"If-None-Match": etag} if etag is not None else {}
    params = {"v": version} if version is not None else {}
    url = f"/assets/{quote(name, safe='')}"
    response = shared.client.get(url, params=params, headers=headers)
    assert response.status_code in {200, 304, 400, 404}, (url, response.text)
    if response.status_code in {400, 404}:
        assert isinstance(response.json()["detail"], str)
    assert shared.client.get("/", params=params).status_code == 200


def test_no_operation_declares_a_status_the_app_never_answers(schema: BaseSchema) -> None:
    """FastAPI declares 422 for every route with parameters; the app answers request
    validation errors with 400 (app._validation_error), so the schema says 400."""
    raw = schema.raw_schema
    for path, operations in raw["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], f"{method.upper()} {path}"
    assert "HTTPValidationError" not in raw.get("components", {}).get("schemas", {})


def test_every_schema_stands_alone(schema: BaseSchema) -> None:
    """Found by the fuzzer: the explain request's schema referred to ``#/$defs/...``,
    which the OpenAPI document does not hold (pydantic puts a model's nested models
    there), so no client generator and no fuzzer could resolve it."""
    assert "#/$defs/" not in json.dumps(schema.raw_schema)


# --- regressions: each bug the fuzzer found, with the exact input


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with running_world(tmp_path) as running:
        yield running


def test_a_lease_name_with_a_newline_is_400_not_an_unrouted_404(world: World) -> None:
    """Found by the fuzzer (POST /v1/ns/{namespace}/leases/{name}, admin): a name with
    a newline matched no route (Starlette's ``{name:path}`` is ``.*``, which stops at a
    newline), so the answer was an undeclared ``404 {"detail": "Not Found"}``. A
    malformed path is 400 (protocol.md); now so is any path with a control character."""
    admin = {"Authorization": f"Bearer {ADMIN_SECRET}"}
    asked = world.client.post(
        "/v1/ns/vl/leases/%0A%C2%95L.%F4%86%B7%83%C3%8D", json={}, headers=admin
    )
    assert asked.status_code == 400, asked.text
    assert "control character" in asked.json()["detail"]


def test_an_alias_with_a_trailing_newline_is_not_served_as_the_alias(world: World) -> None:
    """The same cause, the other way round: ``$`` matches before a last newline, so
    ``aliases/<address>%0A`` was routed, and answered, as ``aliases/<address>``."""
    admin = {"Authorization": f"Bearer {ADMIN_SECRET}"}
    assert world.client.get(f"/v1/ns/team-a/aliases/{ADDRESS}", headers=admin).status_code == 200
    got = world.client.get(f"/v1/ns/team-a/aliases/{ADDRESS}%0A", headers=admin)
    assert got.status_code == 400, got.text


@pytest.mark.parametrize("size", ["21", 21.0])
def test_a_file_size_that_is_not_an_integer_is_refused(world: World, size: Any) -> None:
    """Found checking accepted manifests against the schema of the entry GET answers
    (test_fuzz_parsers.py): the manifest model coerced ``"size": "21"`` (and 21.0) to
    the blob's size, but the stored manifest is the JSON sent, so the entry was
    published and served with a string size: a schema violation on every GET, a miss
    for every client (which reads only integer sizes), and 0 bytes for eviction's quota
    (``entry_facts`` reads only integers). Manifests are now validated strictly: 400,
    and nothing stored."""
    admin = {"Authorization": f"Bearer {ADMIN_SECRET}"}
    key = "e" * 64
    manifest = {
        **MANIFEST,
        "key": key,
        "files": {"model.neff": {"digest": NEFF_DIGEST, "size": size}},
    }
    manifest.pop("direct_key")
    manifest.pop("neuron_address")
    put = world.client.put(f"/v1/ns/team-a/entries/{key}", json=manifest, headers=admin)
    assert put.status_code == 400, put.text
    assert world.client.get(f"/v1/ns/team-a/entries/{key}", headers=admin).status_code == 404


# --- api/blobs.py: its answers are not declared yet (reported, with a patch)


def blob_case(schema: BaseSchema, label: str, **parts: Any) -> Case[Any]:
    operation = schema.find_operation_by_label(label)
    assert operation is not None
    return operation.Case(**parts)


BLOB_CASES = [
    # (label, case parts, caller): answers 401, 404, 200 as octet-stream, ...
    ("GET /v1/blobs/{digest}", {"path_parameters": {"digest": "0" * 64}}, ANONYMOUS),
    ("GET /v1/blobs/{digest}", {"path_parameters": {"digest": "0" * 64}}, ADMIN),
    ("GET /v1/blobs/{digest}", {"path_parameters": {"digest": NEFF_DIGEST}}, ADMIN),
    ("HEAD /v1/blobs/{digest}", {"path_parameters": {"digest": "0" * 64}}, ADMIN),
    ("POST /v1/blobs/missing", {"body": {"digests": []}}, ANONYMOUS),
    ("PUT /v1/blobs/{digest}", {"path_parameters": {"digest": NEFF_DIGEST}}, READER),
]


@pytest.mark.parametrize(
    ("label", "parts", "role"),
    BLOB_CASES,
    ids=["401", "404", "200 bytes", "HEAD 404", "missing 401", "PUT 403"],
)
def test_blob_answers_are_declared(
    schema: BaseSchema, world: World, label: str, parts: dict[str, Any], role: str
) -> None:
    case = blob_case(schema, label, **parts)
    world.authorize(case, role)
    response = send(world.client, case)
    case.validate_response(response, checks=CHECKS)
