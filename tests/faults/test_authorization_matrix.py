"""The authorization matrix: every route the app serves, called by
every kind of caller, against one table written from the docs (protocol.md, admin.md,
telemetry.md, reports.md, explain.md, dashboard.md), not from the code.

Setup: tokens exist (so anonymous callers are not in protected mode); namespace
``team-a`` takes only trusted writers; ``writer_a`` is a trusted write token for it and
``untrusted_a`` an ordinary one. Every namespaced request names ``team-a``.

A refused call is ``401`` for an anonymous caller and ``403`` for a token ("No token
... 401. A token without the scope or the namespace: 403"). An allowed call answers
one of the statuses the docs give that request for the state set up here, never
``400`` (a bad body would hide the authorization answer) nor ``401``/``403``.

The app is built once for the module and shared by the cases, so each request is
chosen to leave the others' answers alone (dry runs, an absent pin, a throwaway token).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import BaseRoute, Route

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

ADMIN_SECRET = "nfc_matrix_admin_secret"
NEFF = b"a neff for the authorization matrix"
NEFF_DIGEST: str = blake3.blake3(NEFF).hexdigest()
KEY = "a" * 64  # published in team-a by the trusted writer
FREE_KEY = "b" * 64  # no entry: its lease can be granted or held
FAILED_KEY = "c" * 64  # a failure record, no entry
ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
BOGUS_LEASE = "0" * 32
COMPILER = "2.20.9961.0+0acef03a"

ANONYMOUS = "anonymous"
READER_A = "read team-a"
WRITER_A = "trusted write team-a"
UNTRUSTED_A = "untrusted write team-a"
WRITER_B = "write team-b"
ADMIN = "admin *"
ROLES = (ANONYMOUS, READER_A, WRITER_A, UNTRUSTED_A, WRITER_B, ADMIN)

EVERYONE = frozenset(ROLES)
ANY_TOKEN = EVERYONE - {ANONYMOUS}  # blobs: any read token, whatever its namespaces
ANY_WRITER = frozenset({WRITER_A, UNTRUSTED_A, WRITER_B, ADMIN})  # blob uploads
READS_A = frozenset({READER_A, WRITER_A, UNTRUSTED_A, ADMIN})  # read < write < admin
TRUSTED_A = frozenset({WRITER_A, ADMIN})  # admin tokens count as trusted
ADMINS = frozenset({ADMIN})

MANIFEST = {
    "key": KEY,
    "direct_key": "d" * 64,
    "neuron_address": ADDRESS,
    "files": {"model.neff": {"digest": NEFF_DIGEST, "size": len(NEFF)}},
    "compile_seconds": 12.5,
}


@dataclass(frozen=True)
class Case:
    """One route: how to call it validly, who may, and what an allowed call answers."""

    method: str
    route: str  # as the app names it, e.g. ``/v1/ns/{namespace}/aliases/{alias:path}``
    url: str
    allowed: frozenset[str]
    ok: frozenset[int]
    json: Any = None
    content: bytes | None = None


def case(
    method: str, route: str, url: str, allowed: frozenset[str], ok: set[int], **kw: Any
) -> Case:
    return Case(method, route, url, allowed, frozenset(ok), **kw)


NS = "/v1/ns/team-a"
ADM_NS = "/v1/admin/namespaces"
EVENT = {"kind": "counters", "namespace": "team-a", "counts": {"lookups": 1}}
# fmt: off
TABLE: list[Case] = [
    # protocol.md, Health; dashboard.md; the OpenAPI schema (public: it holds no data).
    case("GET", "/healthz", "/healthz", EVERYONE, {200}),
    case("GET", "/readyz", "/readyz", EVERYONE, {200}),
    case("GET", "/metrics", "/metrics", EVERYONE, {200}),
    case("GET", "/", "/", EVERYONE, {200}),
    case("GET", "/assets/{name}", "/assets/dashboard.js", EVERYONE, {200}),
    case("GET", "/openapi.json", "/openapi.json", EVERYONE, {200}),
    case("HEAD", "/openapi.json", "/openapi.json", EVERYONE, {200}),
    # protocol.md, Blobs: "any write token may upload them, any read token may fetch them".
    case("PUT", "/v1/blobs/{digest}", f"/v1/blobs/{NEFF_DIGEST}", ANY_WRITER, {200, 201},
         content=NEFF),
    case("GET", "/v1/blobs/{digest}", f"/v1/blobs/{NEFF_DIGEST}", ANY_TOKEN, {200}),
    case("HEAD", "/v1/blobs/{digest}", f"/v1/blobs/{NEFF_DIGEST}", ANY_TOKEN, {200}),
    case("POST", "/v1/blobs/missing", "/v1/blobs/missing", ANY_TOKEN, {200},
         json={"digests": [NEFF_DIGEST, FREE_KEY]}),
    case("POST", "/v1/blobs/{digest}/mismatch", f"/v1/blobs/{NEFF_DIGEST}/mismatch",
         ANY_TOKEN, {202}),
    # protocol.md, Entries: reads need read for the namespace; every write naming a key
    # in a trusted-writers-only namespace needs a trusted token.
    case("PUT", "/v1/ns/{namespace}/entries/{key}", f"{NS}/entries/{KEY}", TRUSTED_A,
         {200, 201}, json=MANIFEST),
    case("GET", "/v1/ns/{namespace}/entries/{key}", f"{NS}/entries/{KEY}", READS_A, {200}),
    case("GET", "/v1/ns/{namespace}/entries", f"{NS}/entries?limit=10", READS_A, {200}),
    case("GET", "/v1/ns/{namespace}/entries/{key}/aliases", f"{NS}/entries/{KEY}/aliases",
         READS_A, {200}),
    case("GET", "/v1/ns/{namespace}/aliases/{alias:path}", f"{NS}/aliases/{ADDRESS}",
         READS_A, {200}),
    case("PUT", "/v1/ns/{namespace}/aliases/{alias:path}", f"{NS}/aliases/{'e' * 64}",
         TRUSTED_A, {200, 201}, json={"key": KEY}),
    # protocol.md, Failure records.
    case("PUT", "/v1/ns/{namespace}/failures/{key}", f"{NS}/failures/{FAILED_KEY}",
         TRUSTED_A, {201}, json={"compiler_version": COMPILER, "exit_code": 70}),
    case("GET", "/v1/ns/{namespace}/failures/{key}", f"{NS}/failures/{FAILED_KEY}",
         READS_A, {200}),
    # protocol.md, Compile leases: write for the namespace, trusted here. Renewing or
    # releasing a lease nobody was given is 409.
    case("POST", "/v1/ns/{namespace}/leases/{name:path}", f"{NS}/leases/{FREE_KEY}",
         TRUSTED_A, {201, 202}, json={"holder": "matrix", "wait": 0}),
    case("PUT", "/v1/ns/{namespace}/leases/{name:path}",
         f"{NS}/leases/{FREE_KEY}?lease={BOGUS_LEASE}", TRUSTED_A, {409}),
    case("DELETE", "/v1/ns/{namespace}/leases/{name:path}",
         f"{NS}/leases/{FREE_KEY}?lease={BOGUS_LEASE}&outcome=done", TRUSTED_A, {409}),
    # protocol.md, Administration: tokens need admin for '*'.
    case("POST", "/v1/admin/tokens", "/v1/admin/tokens", ADMINS, {201},
         json={"scope": "read", "namespaces": ["team-a"], "name": "matrix"}),
    case("GET", "/v1/admin/tokens", "/v1/admin/tokens", ADMINS, {200}),
    case("DELETE", "/v1/admin/tokens/{token_id}", "/v1/admin/tokens/{victim}", ADMINS, {204}),
    # Namespaces, pins, eviction and audit need admin for the namespaces concerned.
    case("GET", ADM_NS, ADM_NS, ADMINS, {200}),
    case("GET", f"{ADM_NS}/{{namespace}}", f"{ADM_NS}/team-a", ADMINS, {200}),
    case("POST", f"{ADM_NS}/{{namespace}}", f"{ADM_NS}/team-a", ADMINS, {409},
         json={"ttl_seconds": 604800}),
    case("PATCH", f"{ADM_NS}/{{namespace}}", f"{ADM_NS}/team-a", ADMINS, {200},
         json={"ttl_seconds": 604800}),
    case("GET", f"{ADM_NS}/{{namespace}}/pins", f"{ADM_NS}/team-a/pins", ADMINS, {200}),
    case("PUT", f"{ADM_NS}/{{namespace}}/pins", f"{ADM_NS}/team-a/pins", ADMINS, {200, 201},
         json={"kind": "model", "value": "llama-70b", "reason": "matrix"}),
    case("DELETE", f"{ADM_NS}/{{namespace}}/pins",
         f"{ADM_NS}/team-a/pins?kind=model&value=never-pinned&reason=matrix", ADMINS, {404}),
    case("POST", "/v1/admin/evict", "/v1/admin/evict", ADMINS, {200},
         json={"dry_run": True, "namespaces": ["team-a"]}),
    case("POST", "/v1/admin/expire", "/v1/admin/expire", ADMINS, {200},
         json={"compiler_version": "2.19.*", "dry_run": True, "namespaces": ["team-a"]}),
    case("GET", "/v1/admin/audit", "/v1/admin/audit?since=0&namespace=team-a&limit=10",
         ADMINS, {200}),
    # telemetry.md: any scope covers the namespaces an event names.
    case("POST", "/v1/events", "/v1/events", READS_A, {202}, json={"events": [EVENT]}),
    # reports.md: a token of any scope, for the namespaces it reads.
    case("GET", "/v1/reports/cost", "/v1/reports/cost?since=7d&namespace=team-a", READS_A,
         {200}),
    case("GET", "/v1/reports/upgrade", "/v1/reports/upgrade?to_compiler=2.22.0&namespace=team-a",
         READS_A, {200}),
    # protocol.md, Status: any token; a namespace asked for must be one it reads.
    case("GET", "/v1/status", "/v1/status?namespace=team-a&window=3600", READS_A, {200}),
    # explain.md: read for the namespace.
    case("GET", "/v1/ns/{namespace}/explain/{key}", f"{NS}/explain/{KEY}", READS_A, {200}),
    case("POST", "/v1/ns/{namespace}/explain", f"{NS}/explain", READS_A, {200},
         json={"key": KEY}),
]
# fmt: on


@dataclass
class World:
    app: FastAPI
    client: TestClient
    tokens: dict[str, str]  # role -> secret; no entry for the anonymous caller
    victim: str  # the id of a token only the DELETE case revokes

    def call(self, entry: Case, role: str) -> int:
        headers = {}
        if role in self.tokens:
            headers["Authorization"] = f"Bearer {self.tokens[role]}"
        url = entry.url.replace("{victim}", self.victim)
        response = self.client.request(
            entry.method, url, json=entry.json, content=entry.content, headers=headers
        )
        status: int = response.status_code
        return status


def make_token(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    created = client.post(
        "/v1/admin/tokens", json=body, headers={"Authorization": f"Bearer {ADMIN_SECRET}"}
    )
    assert created.status_code == 201, created.text
    record: dict[str, Any] = created.json()
    return record


def setup_world(app: FastAPI, client: TestClient) -> World:
    admin = {"Authorization": f"Bearer {ADMIN_SECRET}"}
    # Trusted-writers-only while still empty, as admin.md requires.
    created = client.post(f"{ADM_NS}/team-a", json={"trusted_writers_only": True}, headers=admin)
    assert created.status_code == 201, created.text
    specs: dict[str, dict[str, Any]] = {
        READER_A: {"scope": "read", "namespaces": ["team-a"]},
        WRITER_A: {"scope": "write", "namespaces": ["team-a"], "trusted": True},
        UNTRUSTED_A: {"scope": "write", "namespaces": ["team-a"]},
        WRITER_B: {"scope": "write", "namespaces": ["team-b"]},
    }
    tokens = {
        role: make_token(client, {**body, "name": role})["token"] for role, body in specs.items()
    }
    tokens[ADMIN] = ADMIN_SECRET
    victim = make_token(client, {"scope": "read", "namespaces": ["team-a"], "name": "victim"})
    trusted = {"Authorization": f"Bearer {tokens[WRITER_A]}"}
    assert client.put(f"/v1/blobs/{NEFF_DIGEST}", content=NEFF, headers=trusted).status_code == 201
    assert client.put(f"{NS}/entries/{KEY}", json=MANIFEST, headers=trusted).status_code == 201
    report = {"compiler_version": COMPILER}
    assert (
        client.put(f"{NS}/failures/{FAILED_KEY}", json=report, headers=trusted).status_code == 201
    )
    return World(app, client, tokens, victim["token_id"])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    data_dir: Path = tmp_path_factory.mktemp("matrix")
    settings = ServerSettings(data_dir=data_dir, bootstrap_admin_token=ADMIN_SECRET)
    blobs, index = MemoryBlobStore(), MemoryIndex()
    app = create_app(settings, blob_store=blobs, index=index)
    try:
        with TestClient(app) as client:
            yield setup_world(app, client)
    finally:  # stores passed in belong to the caller, not the app
        blobs.close()
        index.close()


def served_routes(routes: list[BaseRoute], prefix: str = "") -> set[tuple[str, str]]:
    """(method, path) of every route, through included routers; a kind of route this
    does not know (a mount, a websocket) is returned as ``("?", ...)`` so it fails."""
    found: set[tuple[str, str]] = set()
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI >= 0.16x keeps includes
        if inner is not None:
            context = getattr(route, "include_context", None)
            found |= served_routes(inner.routes, prefix + getattr(context, "prefix", ""))
        elif isinstance(route, (APIRoute, Route)):
            found |= {(method, prefix + route.path) for method in route.methods or ()}
        else:
            found.add(("?", f"{type(route).__name__} {getattr(route, 'path', '')}"))
    return found


def test_the_table_lists_every_served_route_and_no_other(world: World) -> None:
    served = served_routes(world.app.routes)
    listed = {(entry.method, entry.route) for entry in TABLE}
    assert len(listed) == len(TABLE), "a route is listed twice"
    assert served - listed == set(), "served but missing from the authorization table"
    assert listed - served == set(), "in the table but not served"


# (method, route, role) -> the defect, for cases that fail today: marked xfail(strict).
DEFECTS: dict[tuple[str, str, str], str] = {}


def matrix() -> Iterator[Any]:
    for entry in TABLE:
        for role in ROLES:
            marks = []
            reason = DEFECTS.get((entry.method, entry.route, role))
            if reason is not None:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            yield pytest.param(
                entry, role, id=f"{entry.method} {entry.route} [{role}]", marks=marks
            )


@pytest.mark.parametrize(("entry", "role"), matrix())
def test_authorization(world: World, entry: Case, role: str) -> None:
    status = world.call(entry, role)
    if role in entry.allowed:
        assert status in entry.ok, f"allowed, expected one of {sorted(entry.ok)}, got {status}"
    else:
        refused = 401 if role == ANONYMOUS else 403
        assert status == refused, f"refused, expected {refused}, got {status}"
