"""``GET /v1/reports/cost`` and ``GET /v1/reports/upgrade`` against a real app (Starlette's
TestClient) over in-memory and SQLite indexes, plus one run on a real Redis; events
go in through ``POST /v1/events`` as clients send them, entries through the entries
API. Every figure checked below was computed by hand from the seeded events."""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
from fastapi.testclient import TestClient
from reports.support import HOUR, NEW, OLD, key, keyed
from support.backends import backends, open_stores

from neffcache.server.app import create_app
from neffcache.server.blobs import BlobStore, open_blob_store
from neffcache.server.deps import Backends
from neffcache.server.index import Index, open_index
from neffcache.server.settings import ServerSettings

BIG = "trn1.32xlarge"  # $21.50 an hour (shipped)
EVENTS: list[dict[str, Any]] = [
    # team-a, all on trn1.32xlarge
    {"result": "hit", "source": "l1", "saved_seconds": HOUR, "job_id": "j1", "key": key(1)},
    {"result": "hit", "source": "server", "saved_seconds": 1800.0, "job_id": "j1"},
    {
        "result": "miss",
        "source": "compiler",
        "compile_seconds": 2 * HOUR,
        "outcome": "ok",
        "reason": "compiler-changed",
        "job_id": "j2",
        "key": key(3),
    },
    {
        "result": "miss",
        "source": "compiler",
        "compile_seconds": 900.0,
        "outcome": "failed",
        "reason": "failed-before",
        "job_id": "j2",
        "key": key(4),
    },
]
TEAM_A = [
    {"kind": "graph", "namespace": "team-a", "instance_type": BIG, "model": "llama", **e}
    for e in EVENTS
]
TEAM_B: list[dict[str, Any]] = [
    {
        "kind": "graph",
        "namespace": "team-b",
        "instance_type": "x9.huge",  # no price
        "result": "miss",
        "source": "compiler",
        "compile_seconds": HOUR,
        "outcome": "ok",
        "reason": "new-graph",
        "job_id": "j3",
        "key": key(5),
    },
    {"kind": "graph", "namespace": "team-b", "result": "hit", "source": "server"}
    | {"saved_seconds": 600.0, "job_id": "j4"},
    {"kind": "counters", "namespace": "team-b", "counts": {"server_errors": 2}},
]


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


class Cache:
    """An app, its stores and tokens: ``admin`` (for ``*``), ``team_a`` (read)."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.backends: Backends = client.app.state.backends  # type: ignore[attr-defined]
        self.admin = self._token(None, "admin", ["*"])
        self.team_a = self._token(self.admin, "read", ["team-a"])

    def _token(self, by: str | None, scope: str, namespaces: list[str]) -> str:
        body = {"scope": scope, "namespaces": namespaces, "name": f"{scope} {namespaces}"}
        headers = {"Authorization": f"Bearer {by}"} if by else {}
        made = self.client.post("/v1/admin/tokens", json=body, headers=headers)
        assert made.status_code == 201, made.text
        secret: str = made.json()["token"]
        return secret

    def get(self, path: str, token: str | None = "admin", **params: Any) -> httpx.Response:
        """A GET as ``token`` (a secret; "admin" for the admin's, None for no token)."""
        secret = self.admin if token == "admin" else token
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        answer: httpx.Response = self.client.get(path, params=params, headers=headers)
        return answer

    def report(self, token: str | None = "admin", **params: Any) -> dict[str, Any]:
        answer = self.get("/v1/reports/cost", token, **params)
        assert answer.status_code == 200, answer.text
        view: dict[str, Any] = answer.json()
        return view

    def send(self, events: list[dict[str, Any]]) -> None:
        headers = {"Authorization": f"Bearer {self.admin}"}
        sent = self.client.post("/v1/events", json={"events": events}, headers=headers)
        assert sent.status_code == 202, sent.text
        assert sent.json() == {"accepted": len(events)}

    def publish(
        self, namespace: str, name: str, size: int, entry_key: str | None = None, **fields: Any
    ) -> str:
        data = hashlib.sha256(name.encode()).digest() * (size // 32)
        headers = {"Authorization": f"Bearer {self.admin}"}
        stored = self.client.put(f"/v1/blobs/{digest(data)}", content=data, headers=headers)
        assert stored.status_code in (200, 201), stored.text
        entry_key = entry_key or key(name)
        body = {"key": entry_key, "files": {"model.neff": {"digest": digest(data), "size": size}}}
        made = self.client.put(
            f"/v1/ns/{namespace}/entries/{entry_key}", json={**body, **fields}, headers=headers
        )
        assert made.status_code == 201, made.text
        return entry_key


@pytest.fixture(params=backends("memory", "filesystem+sqlite"))
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[BlobStore, Index]]:
    yield from open_stores(request.param, request, tmp_path)


def _cache(stores: tuple[BlobStore, Index], tmp_path: Path) -> Iterator[Cache]:
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0)
    app = create_app(settings, blob_store=stores[0], index=stores[1])
    with TestClient(app) as client:
        yield Cache(client)


@pytest.fixture
def cache(stores: tuple[BlobStore, Index], tmp_path: Path) -> Iterator[Cache]:
    yield from _cache(stores, tmp_path)


@pytest.fixture
def seeded(cache: Cache) -> Cache:
    cache.send(TEAM_A + TEAM_B)
    return cache


# --- the cost report


def test_every_namespace_for_an_admin_token(seeded: Cache) -> None:
    report = seeded.report(by="namespace")
    totals = report["totals"]
    assert (totals["lookups"], totals["hits"], totals["misses"]) == (6, 3, 3)
    assert (totals["hits_l1"], totals["hits_server"]) == (1, 2)
    assert (totals["compiles"], totals["failed_compiles"]) == (3, 1)
    assert totals["hit_rate"] == 0.5
    assert totals["compile_hours_spent"] == pytest.approx(3.25)
    assert totals["compile_hours_saved"] == pytest.approx(1.5 + 600 / HOUR)
    assert totals["cost_spent"] == pytest.approx(2.25 * 21.5)
    assert totals["cost_saved"] == pytest.approx(1.5 * 21.5)
    assert totals["unpriced_hours_spent"] == pytest.approx(1.0)
    assert totals["unpriced_hours_saved"] == pytest.approx(600 / HOUR)
    assert totals["miss_reasons"] == {"compiler-changed": 1, "failed-before": 1, "new-graph": 1}
    assert [row["group"]["namespace"] for row in report["rows"]] == ["team-a", "team-b"]
    assert report["rows"][1]["cost_spent"] is None
    assert report["runs"] == {
        "cold": 2,
        "warm": 2,
        "mixed": 0,
        "cold_compile_hours": pytest.approx(3.25),
        "warm_compile_hours": 0.0,
        "mixed_compile_hours": 0.0,
        "lookups_without_job": 0,
        "job_id_hint": None,
    }
    assert [m["key"] for m in report["top_misses"]] == [key(3), key(5), key(4)]
    assert report["prices"]["unpriced_instance_types"] == ["x9.huge"]
    assert report["prices"]["events_without_instance_type"] == 1
    assert report["currency"] == "USD"
    assert report["days"][-1]["lookups"] == 6
    assert {s["namespace"] for s in report["storage"]} == {"team-a", "team-b"}


def test_a_team_token_sees_only_its_namespace(seeded: Cache) -> None:
    report = seeded.report(seeded.team_a, by="namespace,job")
    assert {row["group"]["namespace"] for row in report["rows"]} == {"team-a"}
    assert [row["group"]["job"] for row in report["rows"]] == ["j1", "j2"]
    assert report["totals"]["lookups"] == 4
    assert report["totals"]["cost_spent"] == pytest.approx(2.25 * 21.5)
    assert report["runs"]["cold"] == 1
    assert report["runs"]["warm"] == 1
    assert [s["namespace"] for s in report["storage"]] == ["team-a"]
    assert all(m["namespace"] == "team-a" for m in report["top_misses"])


def test_asking_for_another_namespace_is_refused(seeded: Cache) -> None:
    answer = seeded.get("/v1/reports/cost", seeded.team_a, namespace="team-b")
    assert answer.status_code == 403
    assert "team-b" in answer.json()["detail"]
    answer = seeded.get("/v1/reports/upgrade", seeded.team_a, namespace="team-b", to_compiler="2")
    assert answer.status_code == 403


def test_a_token_is_needed_once_tokens_exist(seeded: Cache) -> None:
    assert seeded.get("/v1/reports/cost", None).status_code == 401
    assert seeded.get("/v1/reports/upgrade", None, to_compiler="2.22.0").status_code == 401


def test_namespaces_asked_narrow_the_report(seeded: Cache) -> None:
    report = seeded.report(namespace=["team-b"], by="model")
    assert report["totals"]["lookups"] == 2
    assert [row["group"] for row in report["rows"]] == [{"model": None}]


def test_storage_is_each_namespace_s_entries_bytes_and_quota(cache: Cache) -> None:
    created = cache.client.post(
        "/v1/admin/namespaces/team-a",
        json={"quota_bytes": 2**30},
        headers={"Authorization": f"Bearer {cache.admin}"},
    )
    assert created.status_code == 201, created.text
    cache.publish("team-a", "one", 3200)
    cache.publish("team-a", "two", 6400)
    report = cache.report(cache.team_a)
    assert report["storage"] == [
        {"namespace": "team-a", "entries": 2, "bytes": 9600, "quota_bytes": 2**30}
    ]


@pytest.mark.parametrize(
    ("fmt", "media"),
    [
        ("json", "application/json"),
        ("csv", "text/csv; charset=utf-8"),
        ("html", "text/html; charset=utf-8"),
        ("table", "text/plain; charset=utf-8"),
    ],
)
def test_every_format_has_its_content_type_and_the_same_figures(
    seeded: Cache, fmt: str, media: str
) -> None:
    answer = seeded.get("/v1/reports/cost", format=fmt, by="namespace")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == media
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(answer.text)))
        assert [(r["namespace"], r["lookups"]) for r in rows] == [("team-a", "4"), ("team-b", "2")]
    elif fmt == "html":
        assert answer.text.startswith("<!DOCTYPE html>")
        assert "$48.38" in answer.text
        # Client-supplied labels on the dashboard's origin: nothing in the page may run.
        assert answer.headers["content-security-policy"].startswith("default-src 'none';")
    elif fmt == "table":
        assert "compile-hours spent 3.25 (3.2h, $48.38)" in answer.text
    else:
        assert answer.json()["totals"]["lookups"] == 6


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"since": "yesterday"}, "since 'yesterday' is neither"),
        ({"since": "1d", "until": "2d"}, "must be before until"),
        ({"by": "host"}, "by: 'host' is not one of"),
        ({"by": ","}, "by: give one or more"),
        ({"by": "namespace," + "x" * 5000}, "by: 'xxxx"),  # quoted in part: one short line
        ({"format": "xml"}, "format 'xml' is not one of"),
        ({"top": "-1"}, "top"),
        ({"namespace": "Team A"}, "is not a namespace name"),
        # Both before the epoch: both the epoch, an empty window.
        ({"since": "0001-01-01T00:00+01:00", "until": "0001-01-01T12:00Z"}, "must be before"),
    ],
)
def test_bad_input_is_a_one_line_400(seeded: Cache, params: dict[str, str], message: str) -> None:
    answer = seeded.get("/v1/reports/cost", **params)
    assert answer.status_code == 400
    detail = answer.json()["detail"]
    assert message in detail
    assert "\n" not in detail
    assert len(detail) < 300


def test_since_takes_epoch_seconds_and_iso_dates(seeded: Cache) -> None:
    assert seeded.report(since="0")["totals"]["lookups"] == 6
    assert seeded.report(since="2000-01-01", until="2000-01-02")["totals"]["lookups"] == 0
    assert seeded.report(since="2000-01-01T00:00Z")["totals"]["lookups"] == 6


@pytest.mark.parametrize("fmt", ["json", "table", "html", "csv"])
def test_times_past_what_a_date_can_show_are_bounded_not_a_500(seeded: Cache, fmt: str) -> None:
    # A duration of 400 digits is infinite; a year past 9999 has no date to print.
    for params in ({"since": "9" * 400 + "d"}, {"since": "0", "until": "9" * 12}):
        answer = seeded.get("/v1/reports/cost", format=fmt, **params)
        assert answer.status_code == 200, answer.text
        if fmt == "json":
            report = answer.json()
            assert report["since"] == 0.0
            assert report["until"] <= 253402214400.0  # 9999-12-31
            assert report["totals"]["lookups"] == 6
    seeded.publish("team-a", "x", 320, compile_seconds=HOUR,
                   components={"compiler_version": "2.21.1"})  # fmt: skip
    answer = seeded.get("/v1/reports/upgrade", to_compiler="2.22.0", active="9" * 400 + "d")
    assert answer.status_code == 200, answer.text
    (part,) = answer.json()["namespaces"]
    assert 0.0 <= part["active_since"] < 60.0  # from the epoch (give or take the request)


# --- the upgrade report


def test_upgrade_lists_the_graphs_in_use_with_hours_money_and_a_plan(seeded: Cache) -> None:
    a20 = seeded.publish("team-a", "a20", 320, compile_seconds=900.0, model="llama",
                         components={"compiler_version": "2.20.0"})  # fmt: skip
    seeded.get(f"/v1/ns/team-a/entries/{a20}")
    fields = {"components": {"compiler_version": "2.21.1"}}
    big = seeded.publish("team-a", "big", 320, compile_seconds=HOUR, model="llama", **fields)
    hot = seeded.publish("team-a", "hot", 320, compile_seconds=1800.0, model="llama", **fields)
    bert = seeded.publish("team-a", "bert", 320, compile_seconds=600.0, model="bert", **fields)
    for entry, times in ((big, 1), (hot, 3)):
        for _ in range(times):
            assert seeded.get(f"/v1/ns/team-a/entries/{entry}").status_code == 200
    seeded.backends.maintenance.flush()  # hits and last access into the index

    answer = seeded.get("/v1/reports/upgrade", seeded.team_a, to_compiler="2.22.0")
    assert answer.status_code == 200, answer.text
    report = answer.json()
    (part,) = report["namespaces"]
    assert part["namespace"] == "team-a"
    assert part["from_compiler"] == "2.21.1"
    assert part["graphs"] == 3
    assert part["compile_hours"] == pytest.approx(1.5 + 600 / HOUR)
    # llama compiles on trn1.32xlarge (its events); bert has none: the namespace's.
    assert part["cost"] == pytest.approx((1.5 + 600 / HOUR) * 21.5)
    assert part["instance_type"] == BIG
    plan = part["prewarm"]
    assert [m["model"] for m in plan["models"]] == ["llama", "bert"]
    assert [g["key"] for g in plan["graphs"]] == [hot, big, bert]  # by hits x seconds
    assert plan["graphs"][0]["hits"] == 3
    assert "NEFFCACHE_URL=neffcache+http://testserver/team-a" in plan["models"][0]["run"]
    assert report["totals"]["graphs"] == 3

    table = seeded.get("/v1/reports/upgrade", to_compiler="2.22.0", format="table")
    assert "team-a: prewarm plan from neuronx-cc 2.21.1" in table.text
    done = seeded.get("/v1/reports/upgrade", to_compiler="2.21.*", namespace="team-a").json()
    assert done["namespaces"][0]["already_on_target"] is True


def test_upgrade_counts_graphs_built_under_the_new_compiler_as_done(cache: Cache) -> None:
    check_graphs_built_under_the_new_compiler_are_done(cache)


def check_graphs_built_under_the_new_compiler_are_done(cache: Cache) -> None:
    """Four graphs in use in team-a under OLD; a prewarm (published, not yet served)
    built the first under NEW in team-a and the second in the namespace team-a reads
    through; the third only under other flags, the fourth only in a namespace team-a
    does not read."""
    made = cache.client.post(
        "/v1/admin/namespaces/team-a",
        json={"read_through": ["shared"]},
        headers={"Authorization": f"Bearer {cache.admin}"},
    )
    assert made.status_code == 201, made.text
    in_use = []
    for n in range(4):
        entry_key, components = keyed(n)
        fields = {"compile_seconds": HOUR, "model": "llama", "components": components}
        in_use.append(cache.publish("team-a", f"old{n}", 320, entry_key, **fields))
        assert cache.get(f"/v1/ns/team-a/entries/{entry_key}").status_code == 200
    cache.backends.maintenance.flush()  # the hits into the index
    for namespace, graph in (
        ("team-a", keyed(0, NEW)),
        ("shared", keyed(1, NEW)),
        ("team-a", keyed(2, NEW, flags=["--model-type=transformer", "-O1"])),
        ("team-c", keyed(3, NEW)),
    ):
        name = f"new-{namespace}-{graph[0][:8]}"
        cache.publish(namespace, name, 320, graph[0], compile_seconds=HOUR, components=graph[1])
    for wanted in ("2.22.*", NEW):
        answer = cache.get("/v1/reports/upgrade", to_compiler=wanted, namespace="team-a")
        assert answer.status_code == 200, answer.text
        report = answer.json()
        (part,) = report["namespaces"]
        assert part["from_compiler"] == OLD  # the prewarm's entries serve no job yet
        assert (part["graphs"], part["graphs_done"]) == (2, 2)
        assert part["compile_hours"] == pytest.approx(2.0)
        assert {g["key"] for g in part["prewarm"]["graphs"]} == {in_use[2], in_use[3]}
        (step,) = part["prewarm"]["models"]
        assert (step["graphs"], step["graphs_done"]) == (2, 2)
        assert report["totals"]["graphs_done"] == 2
    table = cache.get("/v1/reports/upgrade", to_compiler=NEW, namespace="team-a", format="table")
    assert "(2 graphs built under the new version already)" in table.text


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "to_compiler"),
        ({"to_compiler": "2.22 beta"}, "is not a compiler version"),
        ({"to_compiler": "2.22.0", "active": "0s"}, "give a duration"),
        ({"to_compiler": "2.22.0", "format": "pdf"}, "format 'pdf'"),
    ],
)
def test_bad_upgrade_input_is_a_one_line_400(
    seeded: Cache, params: dict[str, str], message: str
) -> None:
    answer = seeded.get("/v1/reports/upgrade", **params)
    assert answer.status_code == 400
    assert message in answer.json()["detail"]


# --- Redis


def test_reports_on_a_redis_index(redis_server: str, tmp_path: Path) -> None:
    import redis

    with redis.Redis.from_url(redis_server) as connection:
        connection.flushdb()
    stores = (open_blob_store((tmp_path / "blobs").as_uri()), open_index(redis_server))
    try:
        for cache in _cache(stores, tmp_path):
            cache.send(TEAM_A + TEAM_B)
            entry = cache.publish("team-a", "r", 320, compile_seconds=HOUR,
                                  components={"compiler_version": "2.21.1"})  # fmt: skip
            report = cache.report(cache.team_a, by="day")
            assert report["totals"]["lookups"] == 4
            assert report["totals"]["cost_spent"] == pytest.approx(2.25 * 21.5)
            assert report["storage"][0]["entries"] == 1
            upgrade = cache.get("/v1/reports/upgrade", to_compiler="2.22.0").json()
            (part,) = [p for p in upgrade["namespaces"] if p["namespace"] == "team-a"]
            assert [g["key"] for g in part["prewarm"]["graphs"]] == [entry]
            assert part["cost"] == pytest.approx(21.5)
            check_graphs_built_under_the_new_compiler_are_done(cache)
    finally:
        for store in stores:
            store.close()
