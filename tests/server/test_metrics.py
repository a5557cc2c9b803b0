"""``GET /metrics``: Prometheus text that counts what the server did, per app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.metrics import Metrics
from neffcache.server.settings import ServerSettings

ROOT = Path(__file__).parents[2]


@pytest.fixture
def client() -> Iterator[TestClient]:
    blobs = MemoryBlobStore()
    settings = ServerSettings(eviction_interval_seconds=0, blob_grace_seconds=0)
    with TestClient(create_app(settings, blob_store=blobs, index=MemoryIndex())) as client:
        yield client
    blobs.close()


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def publish(client: TestClient, namespace: str, key: str, data: bytes, **fields: object) -> int:
    digest = blake3.blake3(data).hexdigest()
    assert client.put(f"/v1/blobs/{digest}", content=data).status_code in (200, 201)
    manifest = {
        "key": key,
        "files": {"model.neff": {"digest": digest, "size": len(data)}},
        "components": {"compiler_version": "2.21.1.0"},
        **fields,
    }
    status: int = client.put(f"/v1/ns/{namespace}/entries/{key}", json=manifest).status_code
    return status


def test_entry_requests_publishes_blobs_and_usage_are_counted(client: TestClient) -> None:
    key, other = "ab" * 32, "cd" * 32
    assert publish(client, "team-a", key, b"x" * 700, compile_seconds=30) == 201
    assert publish(client, "team-a", key, b"x" * 700, compile_seconds=30) == 200
    assert client.get(f"/v1/ns/team-a/entries/{key}").status_code == 200
    assert client.get(f"/v1/ns/team-a/entries/{other}").status_code == 404
    client.post(
        "/v1/admin/namespaces/team-b", json={"read_through": ["team-a"], "quota_bytes": 5000}
    )
    assert client.get(f"/v1/ns/team-b/entries/{key}").status_code == 200
    digest = blake3.blake3(b"x" * 700).hexdigest()
    assert client.get(f"/v1/blobs/{digest}").content == b"x" * 700
    assert client.get(f"/v1/blobs/{'00' * 32}").status_code == 404
    found = samples(client)
    assert (
        found[("neffcache_publishes_total", (("namespace", "team-a"), ("result", "created")))] == 1
    )
    assert found[("neffcache_publishes_total", (("namespace", "team-a"), ("result", "same")))] == 1
    requests = "neffcache_entry_requests_total"
    assert found[(requests, (("answer", "hit"), ("namespace", "team-a")))] == 1
    assert found[(requests, (("answer", "absent"), ("namespace", "team-a")))] == 1
    read_through = (("answer", "hit_read_through"), ("namespace", "team-b"))
    assert found[(requests, read_through)] == 1
    assert found[("neffcache_blob_reads_total", (("result", "hit"),))] == 1
    assert found[("neffcache_blob_reads_total", (("result", "miss"),))] == 1
    assert found[("neffcache_blob_bytes_served_total", ())] == 700
    assert found[("neffcache_namespace_entries", (("namespace", "team-a"),))] == 1
    assert found[("neffcache_namespace_bytes", (("namespace", "team-a"),))] == 700
    assert found[("neffcache_namespace_quota_bytes", (("namespace", "team-b"),))] == 5000
    assert ("neffcache_namespace_quota_bytes", (("namespace", "team-a"),)) not in found


def test_evictions_and_collected_blobs_are_counted(client: TestClient) -> None:
    assert publish(client, "team-a", "ab" * 32, b"y" * 300) == 201
    expired = client.post("/v1/admin/expire", json={"compiler_version": "2.21.*"})
    assert expired.json()["total"]["entries"] == 1
    assert client.post("/v1/admin/evict", json={"dry_run": False}).status_code == 200
    client.post("/v1/admin/evict", json={"dry_run": False})  # a second pass collects
    found = samples(client)
    labels = (("namespace", "team-a"), ("reason", "admin-expire"))
    assert found[("neffcache_evictions_total", labels)] == 1
    assert found[("neffcache_evicted_bytes_total", labels)] == 300
    assert found[("neffcache_blobs_collected_total", ())] == 1
    assert found[("neffcache_blob_bytes_collected_total", ())] == 300


def test_lease_answers_and_waits_are_counted(client: TestClient) -> None:
    name = "ef" * 32
    granted = client.post(f"/v1/ns/team-a/leases/{name}", json={"holder": "h1"})
    assert granted.json()["state"] == "granted"
    held = client.post(f"/v1/ns/team-a/leases/{name}", json={"holder": "h2", "wait": 0})
    assert held.json()["state"] == "held"
    found = samples(client)
    for state in ("granted", "held"):
        labels = (("namespace", "team-a"), ("state", state))
        assert found[("neffcache_lease_answers_total", labels)] == 1
    assert found[("neffcache_lease_wait_seconds_count", ())] == 2


def test_each_app_counts_its_own(client: TestClient) -> None:
    assert publish(client, "team-a", "ab" * 32, b"z") == 201
    blobs = MemoryBlobStore()
    settings = ServerSettings(eviction_interval_seconds=0)
    with TestClient(create_app(settings, blob_store=blobs, index=MemoryIndex())) as other:
        assert not any(name == "neffcache_publishes_total" for name, _ in samples(other))
    blobs.close()
    created = (("namespace", "team-a"), ("result", "created"))
    assert samples(client)[("neffcache_publishes_total", created)] == 1


def test_namespace_labels_are_bounded(monkeypatch: pytest.MonkeyPatch, client: TestClient) -> None:
    monkeypatch.setattr("neffcache.server.metrics.MAX_NAMESPACE_LABELS", 3)
    for n in range(6):
        assert client.get(f"/v1/ns/ns-{n}/entries/{'ab' * 32}").status_code == 404
    found = samples(client)
    labelled = {
        dict(labels)["namespace"]
        for name, labels in found
        if name == "neffcache_entry_requests_total"
    }
    assert labelled == {"ns-0", "ns-1", "ns-2", "_other"}
    other = (("answer", "absent"), ("namespace", "_other"))
    assert found[("neffcache_entry_requests_total", other)] == 3


def test_metrics_can_require_a_token_for_every_namespace() -> None:
    blobs = MemoryBlobStore()
    settings = ServerSettings(eviction_interval_seconds=0, metrics_require_token=True)
    with TestClient(create_app(settings, blob_store=blobs, index=MemoryIndex())) as client:

        def token(scope: str, namespaces: list[str], by: str | None = None) -> str:
            headers = {"Authorization": f"Bearer {by}"} if by else {}
            body = {"scope": scope, "namespaces": namespaces}
            made = client.post("/v1/admin/tokens", json=body, headers=headers)
            assert made.status_code == 201, made.text
            secret: str = made.json()["token"]
            return secret

        admin = token("admin", ["*"])
        scraper, team = token("read", ["*"], admin), token("admin", ["team-a"], admin)
        client.post(
            "/v1/admin/namespaces/team-secret", headers={"Authorization": f"Bearer {admin}"}
        )
        assert client.get("/metrics").status_code == 401
        refused = client.get("/metrics", headers={"Authorization": f"Bearer {team}"})
        assert refused.status_code == 403
        assert "'*'" in refused.json()["detail"]
        shown = client.get("/metrics", headers={"Authorization": f"Bearer {scraper}"})
        assert shown.status_code == 200
        assert "neffcache_entry_requests_total" in shown.text
    blobs.close()


def test_metrics_need_no_token_by_default(client: TestClient) -> None:
    made = client.post("/v1/admin/tokens", json={"scope": "admin", "namespaces": ["*"]})
    assert made.status_code == 201
    assert client.get("/metrics").status_code == 200


def test_graphs_are_counted_once_however_many_requests_they_took(client: TestClient) -> None:
    # One graph a client resolved: it probed the server three times (its direct key,
    # its key, its stock address) before it compiled, and reported the graph once.
    for _ in range(3):
        assert client.get(f"/v1/ns/team-a/entries/{'ab' * 32}").status_code == 404
    hit = {"kind": "graph", "namespace": "team-a", "result": "hit", "source": "l1"}
    compiled = {"kind": "graph", "namespace": "team-a", "result": "miss", "source": "compiler"}
    events = [
        compiled | {"compile_seconds": 60.0, "outcome": "ok"},
        compiled | {"compile_seconds": 5.0, "outcome": "failed"},
        compiled | {"compile_seconds": 5.0},  # no outcome: it compiled all the same
        {"kind": "graph", "namespace": "team-a", "result": "miss"},  # never compiled
        hit,
    ]
    assert client.post("/v1/events", json={"events": events}).status_code == 202
    found = samples(client)
    absent = (("answer", "absent"), ("namespace", "team-a"))
    assert found[("neffcache_entry_requests_total", absent)] == 3
    graphs = "neffcache_client_graphs_total"
    missed = (("namespace", "team-a"), ("result", "miss"), ("source", "compiler"))
    assert found[(graphs, missed)] == 3
    assert found[(graphs, (("namespace", "team-a"), ("result", "hit"), ("source", "l1")))] == 1
    compiles = "neffcache_client_compiles_total"
    assert found[(compiles, (("namespace", "team-a"), ("outcome", "ok")))] == 2
    assert found[(compiles, (("namespace", "team-a"), ("outcome", "failed")))] == 1


def test_the_probe_counter_says_it_is_no_hit_rate_and_the_docs_say_which_is() -> None:
    exposed = Metrics(list).exposition().decode()
    (help_line,) = [
        line for line in exposed.splitlines() if line.startswith("# HELP neffcache_entry_requests")
    ]
    assert "not graphs" in help_line
    assert "neffcache_client_graphs_total" in help_line
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert "### What is our hit rate" in operations
    section = operations.split("### What is our hit rate", 1)[1].split("\n#", 1)[0]
    assert "neffcache_client_graphs_total" in section
    assert "neffcache_entry_requests_total" in section
    for name in ("neffcache_entry_requests_total", "neffcache_client_compiles_total"):
        assert f"`{name}" in operations


def test_no_doc_or_deploy_file_names_the_old_lookup_counter() -> None:
    named = [
        str(path.relative_to(ROOT))
        for top in ("docs", "deploy", "server")
        for path in (ROOT / top).rglob("*")
        if path.is_file()
        and path.suffix in (".md", ".yml", ".yaml", ".json", ".py", ".html", ".js")
        and "neffcache_lookups_total" in path.read_text(errors="replace")
    ]
    assert named == []
