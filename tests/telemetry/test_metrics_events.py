"""The metrics counted from clients' events (``GET /metrics``), and the bounds on their
labels: namespaces, reasons and counter names."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

import neffcache.server.metrics as metrics_module
from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings
from neffcache.server.telemetry.counters import CLIENT_COUNTERS, counter_label

KEY = "ab" * 32
CLIENT = Path(__file__).parents[2] / "client" / "neffcache" / "client"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    blobs = MemoryBlobStore()
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0)
    with TestClient(create_app(settings, blob_store=blobs, index=MemoryIndex())) as client:
        yield client
    blobs.close()


def samples(client: TestClient) -> Samples:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    found = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: Samples, metric: str, **labels: str) -> float:
    return found.get((metric, tuple(sorted(labels.items()))), 0.0)


def graph(namespace: str = "team-a", **fields: Any) -> dict[str, Any]:
    return {"kind": "graph", "namespace": namespace, "key": KEY, "result": "hit", **fields}


def post(client: TestClient, *events: dict[str, Any]) -> int:
    status: int = client.post("/v1/events", json={"events": list(events)}).status_code
    return status


def test_graphs_misses_and_times_are_counted(client: TestClient) -> None:
    assert (
        post(
            client,
            graph(source="l1", fetch_seconds=0.002),
            graph(source="server", fetch_seconds=3.0, saved_seconds=600.0),
            graph(
                result="miss", source="compiler", reason="compiler-changed", compile_seconds=5000
            ),
            graph(result="miss", source="compiler", reason="made-up", compile_seconds=30.0),
            graph(result="miss", namespace="team-b"),  # no reason, no source
            {"kind": "counters", "namespace": "team-a", "counts": {"compiles": 2}},
        )
        == 202
    )
    found = samples(client)
    assert value(found, "neffcache_events_received_total", kind="graph") == 5
    assert value(found, "neffcache_events_received_total", kind="counters") == 1
    graphs = "neffcache_client_graphs_total"
    assert value(found, graphs, namespace="team-a", result="hit", source="l1") == 1
    assert value(found, graphs, namespace="team-a", result="hit", source="server") == 1
    assert value(found, graphs, namespace="team-a", result="miss", source="compiler") == 2
    assert value(found, graphs, namespace="team-b", result="miss", source="unknown") == 1
    misses = "neffcache_client_misses_total"
    assert value(found, misses, namespace="team-a", reason="compiler-changed") == 1
    # A reason outside the shared codes is counted as unknown, never as a new label.
    assert value(found, misses, namespace="team-a", reason="unknown") == 1
    assert value(found, misses, namespace="team-a", reason="made-up") == 0
    assert value(found, misses, namespace="team-b", reason="unknown") == 1
    assert value(found, "neffcache_client_fetch_seconds_count") == 2
    assert value(found, "neffcache_client_fetch_seconds_sum") == pytest.approx(3.002)
    assert value(found, "neffcache_client_fetch_seconds_bucket", le="0.005") == 1
    assert value(found, "neffcache_client_compile_seconds_count") == 2
    assert value(found, "neffcache_client_compile_seconds_sum") == 5030
    # Buckets reach hours: a 5000 s compile is past one hour, within two.
    assert value(found, "neffcache_client_compile_seconds_bucket", le="3600.0") == 1
    assert value(found, "neffcache_client_compile_seconds_bucket", le="7200.0") == 2


def test_counters_are_summed_by_known_name(client: TestClient) -> None:
    def counters(counts: dict[str, int]) -> dict[str, Any]:
        return {"kind": "counters", "namespace": "team-a", "counts": counts}

    sent = counters({"server_errors": 2, "publish_failures": 1, "brand_new": 4, "zeroed": 0})
    assert post(client, sent, counters({"server_errors": 3, "other_new": 1})) == 202
    found = samples(client)
    name = "neffcache_client_counters_total"
    assert value(found, name, name="server_errors") == 5
    assert value(found, name, name="publish_failures") == 1
    assert value(found, name, name="other") == 5  # brand_new and other_new
    assert value(found, name, name="brand_new") == 0
    assert ("neffcache_client_counters_total", (("name", "zeroed"),)) not in found


def test_a_refused_batch_counts_nothing(client: TestClient) -> None:
    assert post(client, graph(), graph(result="maybe")) == 400
    found = samples(client)
    assert value(found, "neffcache_events_received_total", kind="graph") == 0
    assert (
        value(
            found,
            "neffcache_client_graphs_total",
            namespace="team-a",
            result="hit",
            source="unknown",
        )
        == 0
    )


def test_namespace_labels_are_bounded(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "MAX_NAMESPACE_LABELS", 1)
    assert post(client, graph("team-a", source="l1"), graph("team-b", source="l1")) == 202
    found = samples(client)
    graphs = "neffcache_client_graphs_total"
    assert value(found, graphs, namespace="team-a", result="hit", source="l1") == 1
    assert value(found, graphs, namespace="_other", result="hit", source="l1") == 1


def test_counters_events_take_no_namespace_label(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No counters metric is labelled by namespace: a namespace that only sends
    # counters must not use up one of the bounded labels.
    monkeypatch.setattr(metrics_module, "MAX_NAMESPACE_LABELS", 1)
    counters = {"kind": "counters", "namespace": "team-z", "counts": {"compiles": 1}}
    assert post(client, counters, graph("team-a", source="l1")) == 202
    found = samples(client)
    graphs = "neffcache_client_graphs_total"
    assert value(found, graphs, namespace="team-a", result="hit", source="l1") == 1


def _client_counter_names() -> set[str]:
    """Every name the client counts with ``STATS.count(...)``: literal names, both
    branches of a conditional, and each source of ``f"hits_{source}"``."""
    names: set[str] = set()
    for path in CLIENT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "count"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "STATS"
            ):
                names |= _names(node.args[0], path)
    return names


# Names the client formats, and what they can be.
_FORMATTED = {
    "f'hits_{source}'": {"hits_l1", "hits_server"},  # where a hit's NEFF came from
    # remote.py's scopes: only TELEMETRY (telemetry and explanations) so far.
    "f'{scope}_errors'": {"telemetry_errors"},
    "f'{scope}_skipped'": {"telemetry_skipped"},
}


def _names(arg: ast.expr, path: Path) -> set[str]:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.Attribute) and ast.unparse(arg.value) == "ClientCounter":
        return {arg.attr.lower()}  # a member's value is its name in lower case
    if isinstance(arg, ast.IfExp):
        return _names(arg.body, path) | _names(arg.orelse, path)
    if isinstance(arg, ast.JoinedStr) and ast.unparse(arg) in _FORMATTED:
        return _FORMATTED[ast.unparse(arg)]
    raise AssertionError(f"{path}: a counter name the test cannot read: {ast.unparse(arg)}")


def test_every_client_counter_is_labelled_by_name() -> None:
    names = _client_counter_names()
    assert len(names) > 20  # the scan found the client's counters
    missing = sorted(names - CLIENT_COUNTERS)
    assert missing == [], f"add to neffcache/protocol/counters.py: {missing}"
    assert counter_label("compiles") == "compiles"
    assert counter_label("nonsense") == "other"
