"""``POST /v1/events`` (docs/telemetry.md): who may report, what is refused and why,
and exactly what is stored, through Starlette's TestClient."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import neffcache.server.api.body as body_module
from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index import Index
from neffcache.server.index.base import Event, event_size
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings
from neffcache.server.telemetry.ingest import stored_events
from neffcache.server.telemetry.schema import EVENT_MAX_BYTES, parse_events

KEY = "ab" * 32
DIRECT = "cd" * 32
STRUCTURE = "ef" * 32
ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
EVENTS = "/v1/events"


def graph(**fields: Any) -> dict[str, Any]:
    return {"kind": "graph", "namespace": "team-a", "key": KEY, "result": "hit", **fields}


def counters(**fields: Any) -> dict[str, Any]:
    return {"kind": "counters", "namespace": "team-a", "counts": {"compiles": 2}, **fields}


def components(**fields: Any) -> dict[str, Any]:
    return {
        "key_version": "1",
        "fingerprint": "12" * 32,
        "compiler_version": "2.21.1.0",
        "target": "trn1",
        "flags": ["--optlevel", "2"],
        "env": {"NEURON_CC_FLAGS": ""},
        "frameworks": {"torch": "2.5"},
        "graph": {"structure": STRUCTURE, "instructions": 3, "shapes": ["a", "b", "c"]},
        **fields,
    }


def stored(index: Index) -> list[Event]:
    page, cursor = index.events(0.0, 1e12, None, None, 10_000)
    assert cursor is None
    return page


@pytest.fixture
def index() -> MemoryIndex:
    return MemoryIndex()


@contextmanager
def serve(index: Index, tmp_path: Path, **settings: Any) -> Iterator[TestClient]:
    """A test client of an app on ``index``, with no eviction passes of its own."""
    chosen = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0, **settings)
    blobs = MemoryBlobStore()
    try:
        with TestClient(create_app(chosen, blob_store=blobs, index=index)) as client:
            yield client
    finally:
        blobs.close()


@pytest.fixture
def client(index: Index, tmp_path: Path) -> Iterator[TestClient]:
    with serve(index, tmp_path) as client:
        yield client


def post(client: TestClient, events: list[Any], token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post(EVENTS, json={"events": events}, headers=headers)


# --- what is stored ----------------------------------------------------------------------


def every_field_miss() -> dict[str, Any]:
    return graph(
        at=1712000000.5,
        job_id="slurm-4242",
        host="ip-10-0-0-1",
        instance_type="trn1.32xlarge",
        model="llama-3 8b",
        via="wrapper",
        pid=4242,
        direct_key=DIRECT,
        neuron_address=ADDRESS,
        result="miss",
        source="compiler",
        reason="compiler-changed",
        fetch_seconds=0.25,
        compile_seconds=5400.0,
        outcome="ok",
        bytes=1 << 30,
        fallback=None,
        compiler_version="2.21.1.0",
        components=components(),
    )


def test_a_batch_is_accepted_and_stored_exactly(any_index: Index, tmp_path: Path) -> None:
    sent = [every_field_miss(), counters(namespace="team-b", host="h"), graph(key=None)]
    with serve(any_index, tmp_path) as client:
        before = time.time()
        answer = post(client, sent)
        after = time.time()
    assert answer.status_code == 202
    assert answer.json() == {"accepted": 3}
    found = stored(any_index)
    assert [(e.namespace, e.kind, e.key) for e in found] == [
        ("team-a", "graph", KEY),
        ("team-b", "counters", ""),
        ("team-a", "graph", ""),
    ]
    at = found[0].at
    assert before <= at <= after
    assert all(e.at == at for e in found)  # one receipt time per request
    # The event as sent, nulls left out, the client's clock kept as client_at and the
    # server's as at; canonical JSON (sorted keys, no spaces).
    expected = {k: v for k, v in every_field_miss().items() if v is not None}
    expected.update(at=at, client_at=1712000000.5)
    body = json.loads(found[0].body)
    assert body == expected
    assert found[0].body == json.dumps(expected, sort_keys=True, separators=(",", ":"))
    assert json.loads(found[1].body) == {**counters(namespace="team-b", host="h"), "at": at}
    assert json.loads(found[2].body) == {
        "kind": "graph",
        "namespace": "team-a",
        "result": "hit",
        "at": at,
    }
    assert [e.body for e in any_index.events_for_key("team-a", KEY, 5)] == [found[0].body]


def test_the_openapi_schema_describes_the_body_on_its_own(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()["paths"][EVENTS]["post"]["requestBody"]
    body = schema["content"]["application/json"]["schema"]
    assert body["properties"]["events"]["maxItems"] == 1000
    kinds = body["properties"]["events"]["items"]["oneOf"]
    assert [k["properties"]["kind"]["const"] for k in kinds] == ["graph", "counters"]
    assert "$ref" not in json.dumps(schema)  # nothing points at definitions left behind


def test_an_empty_batch_is_accepted(client: TestClient, index: Index) -> None:
    answer = post(client, [])
    assert (answer.status_code, answer.json()) == (202, {"accepted": 0})
    assert stored(index) == []


def test_retention_applies_on_append(index: Index, tmp_path: Path) -> None:
    old = time.time() - 7200
    index.append_events([Event(old, "team-a", "graph", KEY, "{}")], 10_000, 0.0)
    with serve(index, tmp_path, events_keep=1000, events_retention_seconds=3600) as client:
        assert post(client, [graph()] * 600).status_code == 202
        assert len(stored(index)) == 600  # the one older than an hour is gone
        assert post(client, [graph()] * 600).status_code == 202
    assert len(stored(index)) == 1000


def test_a_maintenance_pass_applies_retention_without_appends(tmp_path: Path) -> None:
    index = MemoryIndex()
    now = time.time()
    events = [
        Event(now - 7200, "team-a", "graph", KEY, "{}"),
        Event(now, "team-a", "graph", KEY, "{}"),
    ]
    index.append_events(events, 10_000, 0.0)
    with serve(index, tmp_path, events_retention_seconds=3600) as client:
        maintenance = client.app.state.backends.maintenance  # type: ignore[attr-defined]
        assert maintenance.run("test") is not None  # this replica leads
    assert [e.at for e in stored(index)] == [now]


# --- who may report ----------------------------------------------------------------------


def make_token(client: TestClient, admin: str | None, scope: str, namespaces: list[str]) -> str:
    headers = {"Authorization": f"Bearer {admin}"} if admin else {}
    created = client.post(
        "/v1/admin/tokens", json={"scope": scope, "namespaces": namespaces}, headers=headers
    )
    assert created.status_code == 201
    token: str = created.json()["token"]
    return token


def test_protected_mode_takes_events_without_a_token(client: TestClient, index: Index) -> None:
    assert post(client, [graph()]).status_code == 202
    assert len(stored(index)) == 1


def test_authorization_matrix(client: TestClient, index: Index) -> None:
    admin = make_token(client, None, "admin", ["*"])  # the first token: no tokens yet
    reader = make_token(client, admin, "read", ["team-a"])
    writer = make_token(client, admin, "write", ["team-a", "team-b"])
    other = make_token(client, admin, "write", ["team-c"])
    both = [graph(), counters(namespace="team-b")]
    cases: list[tuple[str | None, list[Any], int]] = [
        (None, [graph()], 401),
        ("nfc_nope_nothing", [graph()], 401),
        (reader, [graph()], 202),  # a read-only token reports too
        (reader, both, 403),  # one namespace it does not cover refuses all
        (writer, both, 202),
        (other, [graph()], 403),
        (admin, [graph(namespace="anything")], 202),
    ]
    accepted = 0
    for token, events, status in cases:
        answer = post(client, events, token)
        assert answer.status_code == status, (token, events, answer.text)
        if status == 202:
            accepted += len(events)
        assert len(stored(index)) == accepted  # nothing of a refused batch is stored
    refused = post(client, both, reader)
    assert refused.json()["detail"] == "your token does not cover namespace 'team-b'"


def test_the_body_is_read_only_after_the_token_and_capped(client: TestClient) -> None:
    admin = make_token(client, None, "admin", ["*"])
    huge = b'{"events": []}' + b" " * (4 << 20)
    assert client.post(EVENTS, content=huge).status_code == 401
    authorized = {"Authorization": f"Bearer {admin}"}
    assert client.post(EVENTS, content=huge, headers=authorized).status_code == 413
    exact = b'{"events": []}'
    exact += b" " * ((4 << 20) - len(exact))
    assert client.post(EVENTS, content=exact, headers=authorized).status_code == 202

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
        yield b'{"events": ['
        for _ in range(5):
            yield b" " * (1 << 20)
        yield b"]}"

    assert client.post(EVENTS, content=chunks(), headers=authorized).status_code == 413


def test_a_stalled_body_is_408(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Driven through ASGI directly: TestClient reads a request body whole before sending.
    monkeypatch.setattr(body_module.body_chunks, "__defaults__", (0.05,))
    calls: list[int] = []
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            return {"type": "http.request", "body": b'{"events": [', "more_body": True}
        if len(calls) == 2:
            await asyncio.sleep(30)  # the stall, cut off after the idle limit
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": EVENTS,
        "raw_path": EVENTS.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 80),
    }
    blobs = MemoryBlobStore()
    app = create_app(ServerSettings(data_dir=tmp_path), blob_store=blobs, index=index)
    asyncio.run(app(scope, receive, send))
    blobs.close()
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [408]
    assert stored(index) == []


# --- what is refused ---------------------------------------------------------------------

BAD_EVENTS: list[tuple[str, Any, str]] = [
    ("not an object", "graph", "is not a JSON object"),
    ("no kind", {"namespace": "team-a"}, ': kind must be "graph" or "counters"'),
    ("other kind", graph(kind="lookup"), "kind must be"),
    ("kind not a string", graph(kind=1), "kind must be"),
    ("unknown field", graph(colour="red"), "unknown field(s) colour (a graph event has"),
    ("stamp", graph(client_at=1.0), "the server sets client_at"),
    ("trimmed", graph(trimmed=["components.graph.shapes"]), "the server sets trimmed"),
    ("both", graph(client_at=1.0, zz=1), "unknown field(s) zz"),
    ("no namespace", {"kind": "graph", "result": "hit"}, "namespace: Field required"),
    ("bad namespace", graph(namespace="Team A"), "namespace: String should match"),
    ("at as text", graph(at="1712000000"), "at: Input should be a valid number"),
    ("negative at", graph(at=-1), "at: Input should be greater than or equal to 0"),
    ("job id too long", graph(job_id="j" * 256), "job_id: String should have at most 255"),
    ("host with a newline", graph(host="a\nb"), "host: String should match pattern"),
    (
        "instance type not text",
        graph(instance_type=5),
        "instance_type: Input should be a valid string",
    ),
    ("empty model", graph(model=""), "model: String should have at least 1"),
    ("long model", graph(model="m" * 201), "model: String should have at most 200"),
    ("other via", graph(via="cli"), "via: Input should be 'hook', 'wrapper' or 'prewarm'"),
    ("pid as bool", graph(pid=True), "pid: Input should be a valid integer"),
    ("negative pid", graph(pid=-1), "pid: Input should be greater than or equal to 0"),
    ("key not hex", graph(key="xy" * 32), "key: String should match pattern"),
    ("key upper case", graph(key="AB" * 32), "key: String should match pattern"),
    ("short direct key", graph(direct_key="ab"), "direct_key: String should match pattern"),
    ("bad address", graph(neuron_address="MODULE_1"), "neuron_address: Value error"),
    ("no result", {"kind": "graph", "namespace": "team-a"}, "result: Field required"),
    ("other result", graph(result="maybe"), "result: Input should be 'hit' or 'miss'"),
    ("other source", graph(source="disk"), "source: Input should be 'l1', 'server' or 'compiler'"),
    ("long reason", graph(reason="r" * 65), "reason: String should have at most 64"),
    ("empty reason", graph(reason=""), "reason: String should have at least 1"),
    ("negative fetch", graph(fetch_seconds=-0.1), "fetch_seconds: Input should be greater"),
    (
        "compile over 7 days",
        graph(compile_seconds=604800.5),
        "compile_seconds: Input should be less",
    ),
    (
        "compile as text",
        graph(compile_seconds="5"),
        "compile_seconds: Input should be a valid number",
    ),
    ("saved over 7 days", graph(saved_seconds=1e9), "saved_seconds: Input should be less"),
    ("other outcome", graph(outcome="crashed"), "outcome: Input should be 'ok' or 'failed'"),
    ("negative bytes", graph(bytes=-1), "bytes: Input should be greater than or equal to 0"),
    ("fractional bytes", graph(bytes=1.5), "bytes: Input should be a valid integer"),
    ("bytes past int64", graph(bytes=2**63), "bytes: Input should be less than or equal to"),
    ("long fallback", graph(fallback="f" * 65), "fallback: String should have at most 64"),
    ("components not an object", graph(components=[1]), "components: Input should be"),
    ("bad fingerprint", graph(components=components(fingerprint="no")), "components.fingerprint"),
    ("flags not a list", graph(components=components(flags="-O2")), "components.flags"),
    ("env of numbers", graph(components=components(env={"A": 1})), "components.env.A"),
    (
        "graph without structure",
        graph(components=components(graph={"instructions": 3})),
        "components.graph.structure: Field required",
    ),
    (
        "graph with more",
        graph(components=components(graph={"structure": STRUCTURE, "instructions": 1, "ops": 1})),
        "components.graph.ops: Extra inputs are not permitted",
    ),
    (
        "shapes of a large graph",
        graph(
            components=components(
                graph={"structure": STRUCTURE, "instructions": 3000, "shapes": ["a"]}
            )
        ),
        "shapes are sent only for graphs of at most 2048 instructions",
    ),
    (
        "too many shapes",
        graph(
            components=components(
                graph={"structure": STRUCTURE, "instructions": 5, "shapes": ["a"] * 2049}
            )
        ),
        "components.graph.shapes: List should have at most 2048 items",
    ),
    (
        "components over 64 KiB",
        graph(components=components(notes="n" * (64 << 10))),
        "components take 65",
    ),
    (
        "counters without counts",
        {"kind": "counters", "namespace": "team-a"},
        "counts: Field required",
    ),
    (
        "counter name",
        counters(counts={"Fall-backs": 1}),
        "counts.Fall-backs.[key]: String should match",
    ),
    (
        "negative counter",
        counters(counts={"compiles": -1}),
        "counts.compiles: Input should be greater",
    ),
    (
        "fractional counter",
        counters(counts={"compiles": 1.0}),
        "counts.compiles: Input should be a valid integer",
    ),
    (
        "65 counters",
        counters(counts={f"c{i}": 1 for i in range(65)}),
        "counts: Dictionary should have at most 64 items",
    ),
    (
        "graph field on counters",
        counters(result="hit"),
        "unknown field(s) result (a counters event",
    ),
    ("counts on a graph", graph(counts={}), "unknown field(s) counts (a graph event"),
]


@pytest.mark.parametrize(
    ("event", "why"), [(e, w) for _, e, w in BAD_EVENTS], ids=[n for n, _, _ in BAD_EVENTS]
)
def test_a_bad_event_refuses_the_batch_with_a_clear_400(
    client: TestClient, index: Index, event: Any, why: str
) -> None:
    answer = post(client, [graph(), event])  # the good first event is not stored either
    assert answer.status_code == 400
    detail = answer.json()["detail"]
    assert why in detail
    assert "event 1" in detail  # which one, counted from 0
    assert "\n" not in detail
    assert stored(index) == []


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"{", "the events body is not JSON"),
        (b"[]", 'the events body is a JSON object {"events": [event, ...]}'),
        (b"{}", 'the events body is a JSON object {"events": [event, ...]}'),
        (b'{"events": [], "batch": 1}', "unknown field(s) batch (the body has only events)"),
        (b'{"events": {}}', "events must be a JSON array of events"),
        (b'{"events": [{"kind": "graph", "at": NaN}]}', "NaN is not a JSON number"),
        (b'{"events": [{"kind": "graph", "at": Infinity}]}', "Infinity is not a JSON number"),
        (b'{"events": [{"kind": "graph", "at": 1e999}]}', "1e999 is too large for a JSON number"),
        (b'{"events": ["\xff"]}', "the events body is not JSON"),
    ],
)
def test_a_bad_body_is_400(client: TestClient, index: Index, body: bytes, why: str) -> None:
    answer = client.post(EVENTS, content=body)
    assert answer.status_code == 400
    assert why in answer.json()["detail"]
    assert stored(index) == []


def test_at_most_1000_events_per_request(client: TestClient, index: Index) -> None:
    answer = post(client, [counters()] * 1001)
    assert answer.status_code == 400
    assert answer.json()["detail"] == "1001 events in one request; send at most 1000"
    assert post(client, [counters()] * 1000).json() == {"accepted": 1000}


def test_bounds_are_inclusive(client: TestClient, index: Index) -> None:
    edge = graph(
        job_id="j" * 255,
        model="m" * 200,
        reason="r" * 64,
        compile_seconds=7 * 86400,
        bytes=2**63 - 1,
        at=0,
        components=components(
            graph={"structure": STRUCTURE, "instructions": 2048, "shapes": ["s"] * 2048}
        ),
    )
    many = counters(counts={f"c{i}": 0 for i in range(64)})
    assert post(client, [edge, many]).status_code == 202
    assert len(stored(index)) == 2


# --- stored bytes -------------------------------------------------------------------------


def largest_miss(job: str) -> dict[str, Any]:
    """A miss that takes nearly EVENT_MAX_BYTES as stored (the server's clock, which
    the stored event carries, takes up to 18 characters): the largest a client may
    make any number of, its flags padded."""
    event = graph(result="miss", job_id=job, at=time.time(), components=components())
    (bare,) = stored_events(parse_events(json.dumps({"events": [event]}).encode()), 1e9)
    pad = EVENT_MAX_BYTES - event_size(bare) - 32
    event["components"]["flags"] = ["--optlevel", "2", "-" + "x" * pad]
    return event


def test_an_event_too_large_to_store_is_refused_naming_the_limit(
    any_index: Index, tmp_path: Path
) -> None:
    # Within every field's bound (components take 20 KiB of the 64 KiB allowed), but
    # over the stored size: nothing of the batch is stored.
    fat = graph(result="miss", components=components(flags=["-O1"] * 5000))
    with serve(any_index, tmp_path) as client:
        answer = post(client, [graph(), fat])
    assert answer.status_code == 413
    detail = answer.json()["detail"]
    assert "event 1 takes" in detail
    assert f"over the {EVENT_MAX_BYTES}-byte limit of a stored event" in detail
    assert stored(any_index) == []
    assert any_index.events_bytes("team-a") == 0


def test_a_large_graph_s_shapes_are_left_out_to_fit(client: TestClient, index: Index) -> None:
    # 2048 instructions of real-looking shapes: 51 KiB of components, all allowed.
    shapes = [f"dot f32[{i % 97},4096]{{1,0}}" for i in range(2048)]
    summary = {"structure": STRUCTURE, "instructions": 2048, "shapes": shapes}
    sent = every_field_miss() | {"components": components(graph=summary)}
    assert post(client, [sent, graph()]).json() == {"accepted": 2}
    found = stored(index)
    assert event_size(found[0]) <= EVENT_MAX_BYTES
    body = json.loads(found[0].body)
    assert body["trimmed"] == ["components.graph.shapes"]
    assert body["components"] == components(graph={"structure": STRUCTURE, "instructions": 2048})
    # Everything else as sent: what reports and explanations read.
    left = {k: v for k, v in body.items() if k not in ("components", "trimmed")}
    expected = {k: v for k, v in sent.items() if v is not None and k != "components"}
    assert left == expected | {"at": found[0].at, "client_at": sent["at"]}
    assert "trimmed" not in json.loads(found[1].body)
    assert index.events_for_key("team-a", KEY, 5) == [found[1], found[0]]


def test_one_client_cannot_grow_its_namespace_past_its_bytes(
    any_index: Index, tmp_path: Path
) -> None:
    bound = 16 << 20  # the least events_max_bytes
    per_request = 240  # as many of the largest events as a 4 MiB body holds
    with serve(any_index, tmp_path, events_max_bytes=bound) as client:
        assert post(client, [counters(namespace="team-b")]).status_code == 202
        for r in range(6):  # 23 MiB of events, sent as fast as the server takes them
            answer = post(client, [largest_miss(f"r{r}")] * per_request)
            assert answer.json() == {"accepted": per_request}
            assert any_index.events_bytes("team-a") <= bound
        ours = [e for e in stored(any_index) if e.namespace == "team-a"]
        # The running total is what is stored, every event nearly the largest.
        assert any_index.events_bytes("team-a") == sum(event_size(e) for e in ours)
        assert all(EVENT_MAX_BYTES - 64 <= event_size(e) <= EVENT_MAX_BYTES for e in ours)
        # As many as fit: no more, and not one fewer.
        assert bound - EVENT_MAX_BYTES < any_index.events_bytes("team-a") <= bound
        # The newest kept, the oldest dropped; no other namespace lost anything.
        jobs = [json.loads(e.body)["job_id"] for e in ours]
        assert jobs[-2 * per_request :] == ["r4"] * per_request + ["r5"] * per_request
        assert "r0" not in jobs
        assert [e.kind for e in stored(any_index) if e.namespace == "team-b"] == ["counters"]
        # Reports see the newest events.
        answer = client.get("/v1/reports/cost", params={"by": "job", "namespace": "team-a"})
        assert answer.status_code == 200, answer.text
        lookups = {row["group"]["job"]: row["lookups"] for row in answer.json()["rows"]}
        assert lookups["r5"] == lookups["r4"] == per_request
        assert sum(lookups.values()) == len(ours)


# --- explanations' notes -----------------------------------------------------------------


def test_misses_with_components_are_noted_after_storing(
    client: TestClient, index: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    import neffcache.server.explain.notes as notes_module

    noted: list[Any] = []
    monkeypatch.setattr(
        notes_module, "note_misses", lambda idx, misses: noted.append((idx, misses))
    )
    miss = graph(result="miss", model="llama", components=components())
    sent = [miss, graph(result="miss"), graph(components=components()), counters()]
    assert post(client, sent).status_code == 202
    assert len(noted) == 1
    noted_index, misses = noted[0]
    # The app's index: the injected one, in the wrapper that keeps its documents.
    assert getattr(noted_index, "inner", noted_index) is index
    assert [(m.namespace, m.key, m.model, m.components) for m in misses] == [
        ("team-a", KEY, "llama", components())
    ]
    assert misses[0].at == stored(index)[0].at
    assert post(client, [graph(result="miss"), counters()]).status_code == 202
    assert len(noted) == 1  # no miss with components: nothing to note


def test_trouble_noting_misses_never_fails_the_request(
    client: TestClient,
    index: Index,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import neffcache.server.explain.notes as notes_module

    def broken(idx: Index, misses: Any) -> None:
        raise RuntimeError("program map unavailable")

    monkeypatch.setattr(notes_module, "note_misses", broken)
    with caplog.at_level(logging.ERROR, logger="neffcache.server.telemetry"):
        answer = post(client, [graph(result="miss", components=components())])
    assert (answer.status_code, answer.json()) == (202, {"accepted": 1})
    assert len(stored(index)) == 1
    assert "cannot note 1 missed graph(s)" in caplog.text
    assert "program map unavailable" in caplog.text


def test_at_most_a_few_batches_are_noted_at_once(
    index: Index, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Each batch being noted holds a worker thread that remote stores' calls share: a
    # burst of misses must not take them all. Past the bound, a batch is not noted.
    import neffcache.server.explain.notes as notes_module
    import neffcache.server.telemetry.ingest as ingest
    from neffcache.server.telemetry.schema import parse_events

    noted: list[int] = []
    monkeypatch.setattr(notes_module, "note_misses", lambda idx, misses: noted.append(len(misses)))
    monkeypatch.setattr(ingest, "_skipped", {"graphs": 0, "logged": float("-inf")})
    body = {"events": [graph(result="miss", components=components())] * 3}
    missed = ingest.misses(parse_events(json.dumps(body).encode()))
    held = 0
    try:
        while ingest._noting.acquire(blocking=False):  # every slot busy elsewhere
            held += 1
        assert held == ingest.NOTE_BATCHES
        with caplog.at_level(logging.WARNING, logger="neffcache.server.telemetry"):
            ingest.note(index, missed, 1.0)
        assert noted == []
        assert "3 missed graph(s) not noted" in caplog.text
    finally:
        for _ in range(held):
            ingest._noting.release()
    ingest.note(index, missed, 1.0)
    assert noted == [3]
