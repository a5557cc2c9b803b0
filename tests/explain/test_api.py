"""``GET /v1/ns/{ns}/explain/{key}`` and ``POST /v1/ns/{ns}/explain`` against a real
app (Starlette's TestClient) over in-memory and SQLite indexes, and the main flows once
over a real redis-server. Entries are published through the API, so the program map
is written the way a server writes it (after the answer to each publish)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from explain.graphs import NEW, OLD, Graph, digest, hlo
from fastapi.testclient import TestClient
from support.backends import backends, stores_of

from neffcache.server.api import explain as explain_api
from neffcache.server.app import create_app
from neffcache.server.deps import Backends
from neffcache.server.explain import gather as gather_module
from neffcache.server.explain.notes import MissNote, note_misses
from neffcache.server.index.base import Event
from neffcache.server.services import publish as publish_module
from neffcache.server.settings import ServerSettings

DAY = 86400.0


class Api:
    """A running app in protected mode (no tokens: requests need none)."""

    def __init__(self, client: TestClient, backends: Backends) -> None:
        self.client = client
        self.backends = backends
        self.headers: dict[str, str] = {}

    def put_blob(self, data: bytes) -> None:
        done = self.client.put(f"/v1/blobs/{digest(data)}", content=data, headers=self.headers)
        assert done.status_code in (200, 201), done.text

    def publish(self, namespace: str, graph: Graph, neff: bytes = b"neff", **extra: Any) -> None:
        for data in graph.files(neff):
            self.put_blob(data)
        done = self.client.put(
            f"/v1/ns/{namespace}/entries/{graph.key}",
            json=graph.manifest(neff, **extra),
            headers=self.headers,
        )
        assert done.status_code in (200, 201), done.text  # 200: published already

    def post(self, namespace: str, body: Any, **kwargs: Any) -> httpx.Response:
        answer: httpx.Response = self.client.post(
            f"/v1/ns/{namespace}/explain", json=body, headers=self.headers, **kwargs
        )
        return answer

    def explain(self, namespace: str, graph: Graph, **extra: Any) -> dict[str, Any]:
        answer = self.post(namespace, graph.request(**extra))
        assert answer.status_code == 200, answer.text
        view: dict[str, Any] = answer.json()
        return view

    def explain_key(self, namespace: str, key: str) -> dict[str, Any]:
        answer = self.client.get(f"/v1/ns/{namespace}/explain/{key}", headers=self.headers)
        assert answer.status_code == 200, answer.text
        view: dict[str, Any] = answer.json()
        return view

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        done = self.client.request(method, path, json=body, headers=self.headers)
        assert done.status_code in (200, 201), done.text
        return done.json()

    def event(self, namespace: str, key: str, at: float, **body: Any) -> None:
        stored = {"kind": "graph", "namespace": namespace, "key": key, "at": at, **body}
        text = json.dumps(stored, sort_keys=True, separators=(",", ":"))
        event = Event(at, namespace, "graph", key, text)
        self.backends.index.append_events([event], 1000, 0.0)


MakeApi = Callable[[], Api]


@pytest.fixture(params=backends("memory", "filesystem+sqlite"))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def api(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Api]:
    blobs, index = stores_of(backend, request, tmp_path)
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0, blob_grace_seconds=0)
    app = create_app(settings, blob_store=blobs, index=index)
    with TestClient(app) as client:
        yield Api(client, app.state.backends)
    blobs.close()
    index.close()


BLOCK = Graph(hlo("block_a"))


# --- the same program under another key


def test_compiler_flags_target_and_env_changes(api: Api) -> None:
    api.publish("team-a", BLOCK, model="llama", compile_seconds=1800.0)
    upgraded = api.explain("team-a", BLOCK.with_(version=NEW))
    assert upgraded["reason"] == "compiler-changed"
    assert upgraded["summary"] == (
        "compiled before under neuronx-cc 2.20.9961.0; you have 2.21.1.0: a compiler upgrade "
        "misses every graph"
    )
    (nearest,) = upgraded["nearest"]
    assert (nearest["key"], nearest["present"], nearest["model"]) == (BLOCK.key, True, "llama")
    assert nearest["differences"] == [
        {"component": "compiler_version", "yours": NEW, "theirs": OLD}
    ]
    flags = api.explain("team-a", BLOCK.with_(flags=("--model-type=transformer", "-O2")))
    assert (flags["reason"], flags["summary"]) == (
        "flags-changed",
        "flag --optlevel differs: 1 vs 2",
    )
    target = api.explain("team-a", BLOCK.with_(target="trn2"))
    assert (target["reason"], target["summary"]) == (
        "target-changed",
        "same program, target trn1 vs trn2",
    )
    env = api.explain("team-a", BLOCK.with_(env={"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}))
    assert env["reason"] == "env-changed"
    assert "variable XLA_FLAGS is set now" in env["summary"]


def test_components_are_compared_as_keys_spell_them(api: Api) -> None:
    # Flags as a user types them (the command word, "-O 1", a --target flag that
    # agrees with the target) and XLA's dump options are no difference: only the
    # target is.
    api.publish("team-a", BLOCK)
    theirs = BLOCK.with_(target="trn2")
    request = theirs.request()
    del request["key"]
    request["components"] = {
        **theirs.components,
        "flags": ["compile", "--model-type", "transformer", "-O", "1", "--target=trn2"],
        "env": {"XLA_FLAGS": "--xla_dump_to=/tmp/dump"},
    }
    got = api.post("team-a", request).json()
    assert got["key"] == theirs.key
    assert (got["reason"], got["summary"]) == (
        "target-changed",
        "same program, target trn1 vs trn2",
    )
    assert got["nearest"][0]["differences"] == [
        {"component": "target", "yours": "trn2", "theirs": "trn1"}
    ]


def test_a_shape_variant_is_compared_instruction_by_instruction(api: Api) -> None:
    api.publish("team-a", BLOCK)
    got = api.explain("team-a", Graph(hlo("variant_shape")))
    assert got["reason"] == "shapes-changed"
    assert got["summary"] == (
        "never seen: no entry shares this program's fingerprint; closest graph differs in "
        "8 of 18 instructions' shapes"
    )
    assert got["graph"]["examples"][0] == {
        "instruction": 3,
        "yours": "parameter f32[4,16]",
        "theirs": "parameter f32[8,16]",
    }
    assert got["nearest"][0]["key"] == BLOCK.key
    # Without the shapes (a large graph's event), still the same structure.
    request = Graph(hlo("variant_shape")).request()
    del request["graph"]["shapes"]
    answer = api.post("team-a", request).json()
    assert answer["reason"] == "shapes-changed"
    assert answer["graph"]["differing"] is None


def test_same_structure_and_shapes_other_constants(api: Api) -> None:
    api.publish("team-a", BLOCK)
    got = api.explain("team-a", Graph(hlo("variant_constant")))
    assert got["reason"] == "graph-changed"
    assert got["graph"]["differing"] == 0


def test_the_latest_graph_of_the_same_model(api: Api) -> None:
    api.publish("team-a", BLOCK, model="llama")
    got = api.explain("team-a", Graph(hlo("variant_op")), model="llama")
    assert got["reason"] == "graph-changed"
    assert (
        "the latest graph of model llama is another program (18 instructions vs your 18)"
        in (got["summary"])
    )
    assert "Operations, counted: +1 sine, -1 tanh." in got["sentences"]
    unlabelled = api.explain("team-a", Graph(hlo("variant_op")))
    assert unlabelled["reason"] == "new-graph"


def test_the_latest_other_graph_of_the_model_when_the_graph_missed_before(api: Api) -> None:
    # The model's newest graph is the asked one, noted by its own miss: the one before
    # it is the comparison.
    api.publish("team-a", BLOCK, model="llama")
    missed = Graph(hlo("variant_op"))
    components = {**missed.components, "graph": missed.summary.as_json()}
    api.event("team-a", missed.key, time.time(), result="miss", components=components)
    note_misses(
        api.backends.index, [MissNote("team-a", missed.key, components, "llama", time.time())]
    )
    got = api.explain("team-a", missed, model="llama")
    assert got["reason"] == "graph-changed"
    assert got["graph"]["fingerprint"] == BLOCK.components["fingerprint"]


def test_a_new_graph(api: Api) -> None:
    api.publish("team-a", BLOCK)
    got = api.explain("team-a", Graph(hlo("allreduce_groups_pair")))
    assert got["reason"] == "new-graph"
    assert got["summary"].startswith("never seen: no entry shares this program's fingerprint")
    assert got["nearest"] == []


# --- what happened to this key


def test_a_key_published_after_its_reported_miss(api: Api) -> None:
    # The upgraded job missed (its event), compiled and published: asked later, the
    # miss is still a compiler upgrade, and the entry is there now.
    api.publish("team-a", BLOCK)
    upgraded = BLOCK.with_(version=NEW)
    components = {**upgraded.components, "graph": upgraded.summary.as_json()}
    api.event("team-a", upgraded.key, time.time(), result="miss", components=components)
    api.publish("team-a", upgraded)
    got = api.explain_key("team-a", upgraded.key)
    assert got["reason"] == "compiler-changed"
    assert got["sentences"][-1].startswith("Also: an entry exists now: published ")
    assert "after the miss at" in got["sentences"][-1]
    assert got["entry"]["key"] == upgraded.key
    # A shape variant the same way: compared instruction by instruction all the same.
    wider = Graph(hlo("variant_shape"))
    components = {**wider.components, "graph": wider.summary.as_json(shapes_max=None)}
    api.event("team-a", wider.key, time.time(), result="miss", components=components)
    api.publish("team-a", wider)
    got = api.explain_key("team-a", wider.key)
    assert got["reason"] == "shapes-changed"
    assert "8 of 18 instructions' shapes" in got["summary"]


def test_a_miss_reported_after_its_compile_is_dated_from_its_lookup(api: Api) -> None:
    # The client sends a graph's event when its compile ends, and publishes then too:
    # the event may come in after the entry. The lookup was a compile earlier.
    api.publish("team-a", BLOCK)
    published = api.backends.index.get_entry("team-a", BLOCK.key)
    assert published is not None
    api.event(
        "team-a",
        BLOCK.key,
        published.created_at + 1.0,
        result="miss",
        outcome="ok",
        compile_seconds=600.0,
        components=BLOCK.components,
    )
    got = api.explain_key("team-a", BLOCK.key)
    assert got["reason"] == "new-graph"  # as of the miss; the entry came after it
    assert "after the miss at" in got["sentences"][-1], got["sentences"]
    assert "did not reach the server" not in json.dumps(got)


def test_explanations_are_worked_out_off_the_event_loop(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dozens of index reads and an 8 MiB body to validate: never where every other
    # request waits, whatever the stores (local ones run single calls inline).
    seen: list[str] = []

    def checked(real: Callable[..., Any], name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            try:
                asyncio.get_running_loop()
                seen.append(f"{name} on the loop")
            except RuntimeError:
                seen.append(name)
            return real(*args)

        return call

    monkeypatch.setattr(explain_api, "gather", checked(explain_api.gather, "gather"))
    monkeypatch.setattr(explain_api, "parse_request", checked(explain_api.parse_request, "parse"))
    api.explain("team-a", BLOCK)
    api.explain_key("team-a", BLOCK.key)
    assert seen == ["parse", "gather", "gather"]


def test_only_the_compared_graphs_module_is_read(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    # Three stored graphs of the same structure; one is compared, one module read.
    for name in ("block_a", "variant_constant", "variant_layout"):
        api.publish("team-a", Graph(hlo(name)))
    read: list[str] = []
    real = gather_module.summary_of_blob

    def summary(blobs: Any, digest: str) -> Any:
        read.append(digest)
        return real(blobs, digest)

    monkeypatch.setattr(gather_module, "summary_of_blob", summary)
    got = api.explain("team-a", Graph(hlo("variant_shape")))
    assert got["reason"] == "shapes-changed"
    assert got["graph"]["differing"] == 8
    assert len(read) == 1


def test_asking_is_not_a_use_of_the_entry(api: Api) -> None:
    api.publish("team-a", BLOCK)
    api.backends.access.drain()
    assert api.explain_key("team-a", BLOCK.key)["reason"] == "published-since"
    assert api.explain("team-a", BLOCK.with_(version=NEW))["nearest"][0]["present"] is True
    assert api.backends.access.drain() == []  # no hit recorded: expiry is not pushed back


def test_the_writer_is_named_as_people_know_it(api: Api) -> None:
    body = {"scope": "write", "namespaces": ["team-a"], "name": "team-a-training"}
    made = api.admin("POST", "/v1/admin/tokens", body)
    api.headers = {"Authorization": f"Bearer {made['token']}"}
    api.publish("team-a", BLOCK)
    got = api.explain_key("team-a", BLOCK.key)
    assert got["sentences"][0].startswith(f"Published by team-a-training ({made['token_id']})")
    assert got["entry"]["writer"] == made["token_id"]


def test_read_through_and_other_namespaces(api: Api) -> None:
    api.publish("shared", BLOCK)
    other = api.explain_key("reader", BLOCK.key)
    assert other["reason"] == "other-namespace"
    assert other["summary"] == (
        "an entry exists in namespace shared, which reader does not read through"
    )
    api.admin("POST", "/v1/admin/namespaces/reader", {"read_through": ["shared"]})
    through = api.explain_key("reader", BLOCK.key)
    assert through["reason"] == "published-since"
    assert through["entry"]["namespace"] == "shared"


def test_an_entry_gone_from_a_namespace_read_through_without_an_audit_record(api: Api) -> None:
    api.admin("POST", "/v1/admin/namespaces/reader", {"read_through": ["shared"]})
    api.publish("shared", BLOCK)
    # A client of reader missed it too (the server was down, say): reader's own note.
    components = {**BLOCK.components, "graph": BLOCK.summary.as_json()}
    note_misses(api.backends.index, [MissNote("reader", BLOCK.key, components, "", time.time())])
    entry = api.backends.index.get_entry("shared", BLOCK.key)
    assert entry is not None
    assert api.backends.index.delete_entry("shared", BLOCK.key, entry.created_at)
    got = api.explain("reader", BLOCK)
    assert got["reason"] == "evicted"
    assert (
        "in namespace shared); it is gone and the audit log no longer says why" in (got["summary"])
    )


def test_another_namespace_the_token_cannot_read_is_not_named(api: Api) -> None:
    api.publish("secret-team", BLOCK)
    admin = api.admin("POST", "/v1/admin/tokens", {"scope": "admin", "namespaces": ["*"]})
    reader = api.client.post(
        "/v1/admin/tokens",
        json={"scope": "read", "namespaces": ["team-a"]},
        headers={"Authorization": f"Bearer {admin['token']}"},
    ).json()
    api.headers = {"Authorization": f"Bearer {reader['token']}"}
    got = api.explain_key("team-a", BLOCK.key)
    # Not even that some namespace holds the key: that would tell a token for team-a
    # which graphs (and settings) another team compiles.
    assert got["reason"] == "unknown"
    assert "namespace" not in got["summary"].replace("namespace team-a", "")
    assert "secret-team" not in json.dumps(got)
    # Nor is its program map read: the same program there is no variant here.
    assert api.explain("team-a", BLOCK.with_(version=NEW))["reason"] == "new-graph"


def test_the_namespaces_a_token_names_are_looked_into_however_many_exist(api: Api) -> None:
    # 40 namespaces sort before the one this token may also read: the index's first
    # 32 would not include it.
    for n in range(40):
        api.publish(f"aa-{n:02}", BLOCK.with_(target="inf2"))
    api.publish("zz-team", BLOCK)
    admin = api.admin("POST", "/v1/admin/tokens", {"scope": "admin", "namespaces": ["*"]})
    reader = api.client.post(
        "/v1/admin/tokens",
        json={"scope": "read", "namespaces": ["team-a", "zz-team"]},
        headers={"Authorization": f"Bearer {admin['token']}"},
    ).json()
    api.headers = {"Authorization": f"Bearer {reader['token']}"}
    got = api.explain_key("team-a", BLOCK.key)
    assert got["reason"] == "other-namespace"
    assert got["summary"] == (
        "an entry exists in namespace zz-team, which team-a does not read through"
    )
    upgraded = api.explain("team-a", BLOCK.with_(version=NEW))
    assert upgraded["reason"] == "compiler-changed"
    assert {n["namespace"] for n in upgraded["nearest"]} == {"zz-team"}


def test_evicted_by_the_quota(api: Api) -> None:
    # Each entry is its NEFF and its HLO module, about 3 kB: two do not fit.
    api.admin("POST", "/v1/admin/namespaces/small", {"quota_bytes": 5000, "ranking": "lru"})
    first, second = BLOCK.with_(target="inf2"), BLOCK.with_(target="trn3")
    api.publish("small", first, neff=b"a" * 1000)
    api.publish("small", second, neff=b"b" * 1000)
    done = api.admin("POST", "/v1/admin/evict", {"dry_run": False})
    assert [e["key"] for e in done["removed"]["entries"]] == [first.key]
    got = api.explain_key("small", first.key)
    assert got["reason"] == "evicted"
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert got["summary"] == f"evicted {today} by namespace small's quota"
    assert (got["removed"]["reason"], got["removed"]["actor"]) == ("quota", "anonymous")
    # Its own program map entry says it was published, so a miss of it now says so.
    assert api.explain("small", first)["reason"] == "evicted"


def test_expired_after_its_ttl_unused(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    # Published 31 days ago (the publishing route's clock), never used since: the
    # default TTL of 30 days expires it at the next pass.
    real = time.time
    with monkeypatch.context() as patched:
        patched.setattr(publish_module, "time", SimpleNamespace(time=lambda: real() - 31 * DAY))
        api.publish("team-a", BLOCK)
    api.admin("POST", "/v1/admin/evict", {"dry_run": False})
    got = api.explain_key("team-a", BLOCK.key)
    assert (got["reason"], got["summary"]) == ("expired", "expired after 31 days unused")
    assert got["removed"]["reason"] == "expired"
    assert got["sentences"][0].startswith("Namespace team-a's TTL removed it on ")


def test_expired_by_an_admin_retiring_a_compiler(api: Api) -> None:
    api.publish("team-a", BLOCK)
    api.admin("POST", "/v1/admin/expire", {"compiler_version": "2.20.*"})
    got = api.explain_key("team-a", BLOCK.key)
    assert got["reason"] == "evicted"
    assert got["summary"].endswith(f"an admin retired compiler {OLD}")
    assert got["removed"]["action"] == "expire"


def test_failed_before_from_a_failure_record(api: Api) -> None:
    api.publish("team-a", BLOCK)
    failing = BLOCK.with_(version=NEW)
    report = {
        "compiler_version": NEW,
        "exit_code": 70,
        "log": "step 1\nERROR: NCC_EVRF009 out of memory\n",
        "components": failing.components,
        "host": "ip-10-0-0-7",
    }
    put = api.client.put(f"/v1/ns/team-a/failures/{failing.key}", json=report)
    assert put.status_code == 201, put.text
    got = api.explain_key("team-a", failing.key)
    assert got["reason"] == "failed-before"
    assert got["summary"].endswith("(log attached)")
    assert got["failure"]["log"].endswith("out of memory\n")
    # The components came with the record: the same program is compared too.
    assert got["nearest"][0]["key"] == BLOCK.key
    assert any(s.startswith("Also: compiled before under neuronx-cc") for s in got["sentences"])


def test_failed_before_from_a_clients_event(api: Api) -> None:
    api.event("team-a", BLOCK.key, time.time() - 60, result="miss", outcome="failed", host="h1")
    got = api.explain_key("team-a", BLOCK.key)
    assert got["reason"] == "failed-before"
    assert got["summary"].endswith("(no log)")
    assert got["failure"]["host"] == "h1"


def test_a_key_known_from_its_miss_event(api: Api) -> None:
    api.publish("team-a", BLOCK)
    missed = BLOCK.with_(flags=("--optlevel=3",))
    components = {**missed.components, "graph": missed.summary.as_json()}
    api.event("team-a", missed.key, time.time(), result="miss", components=components)
    got = api.explain_key("team-a", missed.key)
    assert got["reason"] == "flags-changed"
    assert got["summary"] == "flag --optlevel differs: 1 vs 3"


def test_misses_noted_by_the_ingest_are_variants(api: Api) -> None:
    missed = BLOCK.with_(target="trn2")
    components = {**missed.components, "graph": missed.summary.as_json()}
    note_misses(api.backends.index, [MissNote("team-a", missed.key, components, "", time.time())])
    got = api.explain("team-a", BLOCK)
    assert got["reason"] == "target-changed"
    assert got["nearest"][0]["seen"] == "missed"
    assert got["nearest"][0]["present"] is False


def test_an_unknown_key_is_a_value_not_an_error(api: Api) -> None:
    got = api.explain_key("team-a", "0" * 64)
    assert got["reason"] == "unknown"
    assert got["key"] == "0" * 64
    assert set(got) == {
        "namespace",
        "key",
        "reason",
        "summary",
        "sentences",
        "entry",
        "nearest",
        "removed",
        "failure",
        "graph",
    }


def test_post_computes_the_key_from_complete_components(api: Api) -> None:
    request = BLOCK.request()
    del request["key"]
    got = api.post("team-a", request).json()
    assert got["key"] == BLOCK.key
    partial = api.post("team-a", {"components": {"fingerprint": BLOCK.components["fingerprint"]}})
    assert partial.status_code == 200
    assert partial.json()["key"] is None


# --- bad input and access


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "JSON object"),
        (b"{}", "give a key, components, or both"),
        (b'{"key": "abc"}', "key"),
        (b'{"key": "' + b"a" * 64 + b'", "colour": 1}', "colour"),
        (b'{"components": {"flags": "-O2"}}', "flags"),
        (b'{"components": {"target": 1}}', "target"),
        (
            b'{"components": {}, "graph": {"structure": "' + b"5" * 64 + b'", "instructions": 2, '
            b'"shapes": ["add f32[]"]}}',
            "shapes lists 1 instructions; instructions says 2",
        ),
    ],
)
def test_bad_requests_are_one_line_400s(api: Api, body: bytes, said: str) -> None:
    answer = api.client.post(
        "/v1/ns/team-a/explain", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert said in detail
    assert "\n" not in detail


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            {
                "key": "a" * 64,
                "graph": {"structure": "5" * 64, "instructions": 1, "shapes": [1] * 200_000},
            },
            "graph.shapes.0: a string of at most 4096 characters",
        ),
        (
            {
                "components": {
                    "graph": {
                        "structure": "5" * 64,
                        "instructions": 2,
                        "shapes": ["add f32[]", "x" * 4097],
                    }
                }
            },
            "components.graph.shapes.1: a string of at most 4096 characters",
        ),
        (
            {"components": {"env": {f"V{n}": 1 for n in range(100_000)}}},
            "components.env: at most 64 names, not 100000",
        ),
    ],
)
def test_a_large_bad_request_is_one_short_400(api: Api, body: Any, said: str) -> None:
    # Not a problem per element: 8 MiB of them took half a minute and answered 200 MB.
    answer = api.post("team-a", body)
    assert answer.status_code == 400
    detail = answer.json()["detail"]
    assert said in detail
    assert len(detail) < 300


def test_a_bad_key_or_namespace_in_the_path_is_400(api: Api) -> None:
    assert api.client.get("/v1/ns/team-a/explain/XYZ").status_code == 400
    assert api.client.get(f"/v1/ns/Team_A!/explain/{'0' * 64}").status_code == 400


def test_a_body_over_8_mib_is_refused(api: Api) -> None:
    answer = api.client.post(
        "/v1/ns/team-a/explain",
        content=b" " * (8 * 2**20 + 1),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 413


def test_the_token_is_checked_before_the_body_is_read(api: Api) -> None:
    api.admin("POST", "/v1/admin/tokens", {"scope": "admin", "namespaces": ["*"]})
    # Tokens exist now: no token, no answer, whatever the body (not a 413 or a 400).
    huge = api.client.post("/v1/ns/team-a/explain", content=b"x" * (9 * 2**20))
    assert huge.status_code == 401
    assert api.client.get(f"/v1/ns/team-a/explain/{'0' * 64}").status_code == 401


def test_a_read_token_of_another_namespace_is_refused(api: Api) -> None:
    admin = api.admin("POST", "/v1/admin/tokens", {"scope": "admin", "namespaces": ["*"]})
    reader = api.client.post(
        "/v1/admin/tokens",
        json={"scope": "read", "namespaces": ["team-b"]},
        headers={"Authorization": f"Bearer {admin['token']}"},
    ).json()
    api.headers = {"Authorization": f"Bearer {reader['token']}"}
    assert api.post("team-a", BLOCK.request()).status_code == 403
    assert api.post("team-b", BLOCK.request()).status_code == 200


# --- the main flows over Redis


@pytest.mark.e2e
@pytest.mark.backend("filesystem", "redis")
def test_main_flows_over_redis(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    flows = [
        test_compiler_flags_target_and_env_changes,
        test_a_shape_variant_is_compared_instruction_by_instruction,
        test_failed_before_from_a_failure_record,
        test_evicted_by_the_quota,
        test_read_through_and_other_namespaces,
        test_a_key_known_from_its_miss_event,
    ]
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0, blob_grace_seconds=0)
    for flow in flows:
        blobs, index = stores_of("filesystem+redis", request, tmp_path / flow.__name__)
        app = create_app(settings, blob_store=blobs, index=index)
        try:
            with TestClient(app) as client:
                flow(Api(client, app.state.backends))
        finally:
            blobs.close()
            index.close()
