"""Requests on the server's HTTP API through Starlette's TestClient, shared by the API
tests: blobs and manifests, tokens, leases."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
from fastapi.testclient import TestClient

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index import Index
from neffcache.server.settings import ServerSettings

ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
KEY = "a" * 64
LEASES = "/v1/ns/team-a/leases"


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def put_blob(client: TestClient, data: bytes, **headers: str) -> int:
    response = client.put(f"/v1/blobs/{digest(data)}", content=data, headers=headers)
    return response.status_code


def manifest(files: dict[str, bytes], key: str = KEY, **extra: Any) -> dict[str, Any]:
    return {
        "key": key,
        "files": {name: {"digest": digest(d), "size": len(d)} for name, d in files.items()},
        "compile_seconds": 12.5,
        **extra,
    }


def admin_token(client: TestClient) -> str:
    created = client.post("/v1/admin/tokens", json={"scope": "admin", "namespaces": ["*"]})
    assert created.status_code == 201
    token: str = created.json()["token"]
    return token


def make_token(client: TestClient, admin: str, scope: str, namespaces: list[str]) -> str:
    created = client.post(
        "/v1/admin/tokens",
        json={"scope": scope, "namespaces": namespaces, "name": f"{scope} for {namespaces}"},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert created.status_code == 201
    token: str = created.json()["token"]
    return token


@contextlib.contextmanager
def make_client(index: Index, tmp_path: Path, **settings: Any) -> Iterator[TestClient]:
    """The app over ``index`` and in-memory blobs, with 30 s leases."""
    values = {"lease_ttl_seconds": 30.0, "lease_recheck_seconds": 60.0, **settings}
    blobs = MemoryBlobStore()
    app = create_app(ServerSettings(data_dir=tmp_path, **values), blob_store=blobs, index=index)
    try:
        with TestClient(app) as client:
            yield client
    finally:
        blobs.close()


def ask(client: TestClient, name: str = KEY, **body: Any) -> dict[str, Any]:
    """Ask for lease ``name``; its status code must match its state."""
    response = client.post(f"{LEASES}/{name}", json=body)
    answer: dict[str, Any] = response.json()
    expected_status = {"done": 200, "granted": 201, "held": 202, "failed": 200}
    assert response.status_code == expected_status[answer["state"]], answer
    return answer


def publish(client: TestClient, key: str = KEY, **extra: Any) -> dict[str, Any]:
    """Publish an entry under ``key`` in team-a, with its one blob uploaded first."""
    neff = b"the neff of " + key.encode()
    assert put_blob(client, neff) in (200, 201)
    body = manifest({"model.neff": neff}, key=key, **extra)
    assert client.put(f"/v1/ns/team-a/entries/{key}", json=body).status_code == 201
    return body
