"""The HTTP requests the docs name are the app's routes, with the query parameters and
answers its OpenAPI schema declares; the ones that can run, run, in the docs' order,
against the real app; the documented JSON bodies are accepted by it and the answers
it gives have the documented fields."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
from docs.doctext import ROOT, Request, blocks, pages, requests
from fastapi.testclient import TestClient

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

ADMIN = "nfc_docs_examples_admin_secret"
REQUESTS = [r for page in pages() for r in requests(page)]
PROTOCOL = ROOT / "docs" / "protocol.md"
# What the docs' placeholders stand for when a request is run.
FILL = {"{ns}": "team-a", "{namespace}": "team-a"}
QUERY_FILL = {
    "kind": "model",
    "value": "llama-70b",
    "reason": "docs",
    "since": "0",
    "namespace": "team-a",
    "limit": "10",
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = ServerSettings(
        data_dir=tmp_path_factory.mktemp("data"),
        bootstrap_admin_token=ADMIN,
        eviction_interval_seconds=0,
    )
    blobs = MemoryBlobStore()
    app = create_app(settings, blob_store=blobs, index=MemoryIndex())
    try:
        with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as test_client:
            yield test_client
    finally:
        blobs.close()


@pytest.fixture(scope="module")
def schema(client: TestClient) -> dict[str, Any]:
    answer: dict[str, Any] = client.get("/openapi.json").json()
    return answer


def _template(path: str) -> str:
    """``/v1/ns/{ns}/pins`` and ``/assets/NAME`` alike as ``/v1/ns/{}/pins``."""
    return "/".join(
        "{}" if re.fullmatch(r"\{[^}]*\}|[A-Z][A-Z_]*", part) else part for part in path.split("/")
    )


def _hidden_routes() -> set[tuple[str, str]]:
    """Routes left out of the schema: the dashboard's page and assets, the schema."""
    from neffcache.server.api.dashboard import router

    routes = {("GET", "/openapi.json")}
    for route in router.routes:
        for method in getattr(route, "methods", ()):
            routes.add((method, _template(getattr(route, "path", ""))))
    return routes


def _operation(schema: dict[str, Any], request: Request) -> dict[str, Any] | None:
    for path, operations in schema["paths"].items():
        if _template(path) == _template(request.path):
            found: dict[str, Any] | None = operations.get(request.method.lower())
            return found
    return None


def _id(request: Request) -> str:
    return f"{request.where} {request.method} {request.target}"


def test_the_docs_name_every_route_and_the_extraction_finds_them(
    schema: dict[str, Any],
) -> None:
    assert len(REQUESTS) >= 60
    documented = {
        (r.method, _template(r.path)) for r in REQUESTS if r.where.startswith("docs/protocol")
    }
    declared = {
        (method.upper(), _template(path))
        for path, operations in schema["paths"].items()
        for method in operations
    }
    assert len(declared) >= 30
    assert sorted(declared - documented) == []


@pytest.mark.parametrize("request_", REQUESTS, ids=_id)
def test_every_documented_request_is_a_route_with_its_parameters_and_answers(
    request_: Request, schema: dict[str, Any]
) -> None:
    operation = _operation(schema, request_)
    if operation is None:
        assert (request_.method, _template(request_.path)) in _hidden_routes(), _id(request_)
        return
    query = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
    assert [name for name in request_.query if name not in query] == [], _id(request_)
    if request_.row.startswith("|"):
        # A table row: the statuses its answer column lists are declared.
        answer = request_.row.split("|")[2]
        statuses = set(re.findall(r"`([1-5][0-9][0-9])`", answer))
        assert statuses - set(operation["responses"]) == set(), _id(request_)


def _runnable(
    request: Request, filled: dict[str, str], schema: dict[str, Any]
) -> tuple[str, Any] | None:
    """The request's target and JSON body with the placeholders filled, or None when a
    placeholder is left (``{key}``, ``V``, ``[...]``) or it is only named (no required
    parameter, no body)."""
    operation = _operation(schema, request) or {}
    required = {
        p["name"] for p in operation.get("parameters", []) if p["in"] == "query" and p["required"]
    }
    if required - set(request.query):
        return None
    path, _, query = request.target.partition("?")
    for placeholder, value in filled.items():
        path = path.replace(placeholder, value)
    if "{" in path or re.search(r"/[A-Z]", path):
        return None
    pairs = [part.partition("=") for part in query.split("&") if part]
    if any(value in ("V", "N", "KEY", "ID") or "|" in value for _, _, value in pairs):
        return None
    query = "&".join(f"{name}={value or QUERY_FILL[name]}" for name, _, value in pairs)
    body = None
    if request.body is None and request.method in ("POST", "PUT", "PATCH"):
        return None  # its body is described, not shown
    if request.body is not None:
        try:
            body = json.loads(request.body)
        except ValueError:
            return None
    return (path + ("?" + query if query else ""), body)


def test_the_runnable_requests_run_in_the_docs_order(
    client: TestClient, schema: dict[str, Any]
) -> None:
    filled = dict(FILL)
    ran: list[str] = []
    for request in REQUESTS:
        runnable = _runnable(request, filled, schema)
        if runnable is None:
            continue
        target, body = runnable
        answer = client.request(request.method, target, json=body)
        listed = set(re.findall(r"`([1-5][0-9][0-9])`", request.row))
        assert answer.status_code < 300, f"{_id(request)}: {answer.status_code} {answer.text}"
        if request.row.startswith("|") and any(code < "300" for code in listed):
            assert str(answer.status_code) in listed, f"{_id(request)}: {answer.status_code}"
        if request.method == "POST" and request.path == "/v1/admin/tokens":
            filled["{token_id}"] = answer.json()["token_id"]
        ran.append(f"{request.method} {target}")
    assert len(ran) >= 25
    for needed in ("POST /v1/admin/tokens", "DELETE /v1/admin/tokens/", "PUT /v1/admin/namespaces"):
        assert any(r.startswith(needed) for r in ran), needed


def _example(path: Path, first: str) -> str:
    """The JSON block of a page that starts with ``first``."""
    found = [b.text for b in blocks(path) if b.lang == "json" and b.text.startswith(first)]
    assert len(found) == 1, f"{path.name}: {len(found)} blocks start {first!r}"
    return found[0]


def _hex(label: str) -> str:
    digest: str = blake3.blake3(label.encode()).hexdigest()
    return digest


def test_the_manifest_example_publishes_and_reads_back_with_the_stamps(
    client: TestClient,
) -> None:
    manifest = json.loads(_example(PROTOCOL, '{"key": "<64 hex>", "direct_key"'))
    manifest["key"], manifest["direct_key"] = _hex("key"), _hex("direct")
    manifest["components"]["fingerprint"] = _hex("fingerprint")
    for name, ref in manifest["files"].items():
        data = (name.encode() * ref["size"])[: ref["size"]]
        ref["digest"] = blake3.blake3(data).hexdigest()
        stored = client.put(f"/v1/blobs/{ref['digest']}", content=data)
        assert stored.status_code == 201, stored.text
    published = client.put(f"/v1/ns/team-a/entries/{manifest['key']}", json=manifest)
    assert published.status_code == 201, published.text
    read = client.get(f"/v1/ns/team-a/entries/{manifest['key']}")
    assert read.status_code == 200
    assert set(read.json()) == set(manifest) | {"namespace", "created_at", "writer"}
    listed = client.get("/v1/ns/team-a/entries?limit=1").json()
    assert set(listed) == {"entries", "next"}  # {"entries": [<entry>, ...], "next": ...}
    by_alias = client.get(f"/v1/ns/team-a/aliases/{manifest['neuron_address']}")
    assert by_alias.json()["key"] == manifest["key"]


def test_the_failure_record_example_is_what_the_server_stores(client: TestClient) -> None:
    record = json.loads(_example(PROTOCOL, '{"compiler_version"'))
    stamps = {"namespace", "key", "created_at", "writer", "log_truncated"}
    report = {k: v for k, v in record.items() if k not in stamps}
    stored = client.put(f"/v1/ns/team-a/failures/{_hex('failed')}", json=report)
    assert stored.status_code == 201, stored.text
    assert set(stored.json()) == set(record)


def _filled(value: Any) -> Any:
    """A documented body with its ``"...": "..."`` elisions dropped."""
    if isinstance(value, dict):
        return {k: _filled(v) for k, v in value.items() if k != "..."}
    if isinstance(value, list):
        return [_filled(v) for v in value]
    return _hex("placeholder") if value == "<64 hex>" else value


def test_the_events_example_is_accepted(client: TestClient) -> None:
    body = _filled(json.loads(_example(ROOT / "docs" / "telemetry.md", '{"events"')))
    answer = client.post("/v1/events", json=body)
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"accepted": len(body["events"])}


def _keys(text: str) -> set[str]:
    """The top-level keys of a documented JSON shape (``FIGURES``, ``...`` elided)."""
    shaped = re.sub(r",?\s*\.\.\.FIGURES", "", text).replace("FIGURES", "{}")
    return set(json.loads(shaped))


def test_the_report_examples_have_the_fields_the_server_answers(client: TestClient) -> None:
    reports = ROOT / "docs" / "reports.md"
    cost = client.get("/v1/reports/cost?since=7d&format=json")
    assert cost.status_code == 200, cost.text
    assert _keys(_example(reports, '{"since"')) == set(cost.json())
    upgrade = client.get("/v1/reports/upgrade?to_compiler=2.22.0&format=json")
    assert upgrade.status_code == 200, upgrade.text
    assert _keys(_example(reports, '{"to_compiler"')) == set(upgrade.json())


def test_the_explain_request_example_is_answered_with_the_documented_fields(
    client: TestClient,
) -> None:
    explain = ROOT / "docs" / "explain.md"
    body = _filled(json.loads(_example(explain, '{"key"')))
    graph = body["graph"]  # "shapes": ["parameter f32[]", "..."]: one per instruction
    graph["shapes"] = [graph["shapes"][0]] * graph["instructions"]
    answer = client.post("/v1/ns/team-a/explain", json=body)
    assert answer.status_code == 200, answer.text
    assert set(json.loads(_example(explain, '{"namespace"'))) == set(answer.json())
