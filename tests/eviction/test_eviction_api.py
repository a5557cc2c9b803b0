"""Eviction and ownership through the HTTP API, in process: namespace
policies, read-through, trusted writers, limits, the eviction rules, pins, expiry,
blob collection and the audit log.

Each test drives a real app (Starlette's TestClient) over in-memory, SQLite and Redis
indexes, with no background passes (``eviction_interval_seconds=0``): passes run when
a test asks for one (``POST /v1/admin/evict {"dry_run": false}``). Time passes on
``Clock``, the server's clock as the code that stamps entries and hits and the
evictor read it; real time passes only where a test sleeps (failure TTLs, grace).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import blake3
import httpx
import pytest
from fastapi.testclient import TestClient
from support.backends import backends, open_stores

from neffcache.server import access as access_module
from neffcache.server.app import create_app
from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.deps import Backends
from neffcache.server.eviction import evictor as evictor_module
from neffcache.server.index import Index
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.services import publish as publish_module
from neffcache.server.settings import ServerSettings

DAY = 86400.0
ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
OTHER_ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_42+3cc9a3cb"
REPORT = {"compiler_version": "2.20.9961.0+0acef03a"}
# Eviction over each index; blobs in memory or on the filesystem.
BACKENDS = ["memory", "filesystem+sqlite", "filesystem+redis"]
_REAL_TIME = time.time


def key(n: int | str) -> str:
    return hashlib.sha256(f"key {n}".encode()).hexdigest()


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def neff(label: str, size: int = 1000) -> bytes:
    """``size`` bytes, different for every label."""
    seed = hashlib.sha256(label.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def manifest(
    key_: str,
    files: dict[str, bytes],
    *,
    compile_seconds: float | None = None,
    version: str | None = None,
    model: str | None = None,
    address: str | None = None,
    direct_key: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "key": key_,
        "files": {name: {"digest": digest(d), "size": len(d)} for name, d in files.items()},
        **extra,
    }
    if compile_seconds is not None:
        body["compile_seconds"] = compile_seconds
    if version is not None:
        body["components"] = {"compiler_version": version}
    if model is not None:
        body["model"] = model
    if address is not None:
        body["neuron_address"] = address
    if direct_key is not None:
        body["direct_key"] = direct_key
    return body


class Clock:
    """The server's clock: real time plus ``offset`` seconds."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return _REAL_TIME() + self.offset


@dataclass(frozen=True)
class Token:
    secret: str
    token_id: str
    name: str

    @property
    def label(self) -> str:
        """How the audit log names the token's holder."""
        return f"{self.token_id} ({self.name})"


class Cache:
    """A running app and its admin token ("ops", for every namespace)."""

    def __init__(
        self, client: TestClient, backends: Backends, clock: Clock, admin: Token | None = None
    ) -> None:
        self.client = client
        self.backends = backends
        self.clock = clock
        # Protected mode: the first token needs none.
        self.admin = admin or self._token(None, "admin", ["*"], "ops", trusted=False)

    # --- plumbing

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        by: Token | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        who = by or self.admin
        headers: dict[str, str] = {
            "Authorization": f"Bearer {who.secret}",
            **kwargs.pop("headers", {}),
        }
        answer: httpx.Response = self.client.request(
            method, path, json=body, headers=headers, **kwargs
        )
        return answer

    def _token(
        self, by: Token | None, scope: str, namespaces: list[str], name: str, *, trusted: bool
    ) -> Token:
        body = {"scope": scope, "namespaces": namespaces, "name": name, "trusted": trusted}
        headers = {} if by is None else {"Authorization": f"Bearer {by.secret}"}
        made = self.client.post("/v1/admin/tokens", json=body, headers=headers)
        assert made.status_code == 201, made.text
        answer = made.json()
        assert answer["trusted"] is trusted
        return Token(answer["token"], answer["token_id"], name)

    def token(
        self, scope: str, namespaces: list[str], name: str = "", *, trusted: bool = False
    ) -> Token:
        return self._token(
            self.admin, scope, namespaces, name or f"{scope} {namespaces}", trusted=trusted
        )

    # --- data

    def put_blob(self, data: bytes, by: Token | None = None) -> None:
        stored = self.request("PUT", f"/v1/blobs/{digest(data)}", None, by, content=data)
        assert stored.status_code in (200, 201), stored.text

    def has_blob(self, data: bytes) -> bool:
        found = self.request("HEAD", f"/v1/blobs/{digest(data)}")
        assert found.status_code in (200, 404)
        return found.status_code == 200

    def publish(
        self,
        namespace: str,
        key_: str,
        files: dict[str, bytes],
        by: Token | None = None,
        headers: dict[str, str] | None = None,
        **fields: Any,
    ) -> httpx.Response:
        for data in files.values():
            self.put_blob(data)
        body = manifest(key_, files, **fields)
        return self.request(
            "PUT", f"/v1/ns/{namespace}/entries/{key_}", body, by, headers=headers or {}
        )

    def published(self, namespace: str, key_: str, files: dict[str, bytes], **fields: Any) -> None:
        done = self.publish(namespace, key_, files, **fields)
        assert done.status_code == 201, done.text

    def entry(self, namespace: str, key_: str, by: Token | None = None) -> httpx.Response:
        return self.request("GET", f"/v1/ns/{namespace}/entries/{key_}", None, by)

    def present(self, namespace: str, key_: str) -> bool:
        """Whether the namespace itself holds the entry; a listing, not a lookup, so
        that asking is not a hit."""
        listed = self.request("GET", f"/v1/ns/{namespace}/entries", params={"limit": 1000})
        assert listed.status_code == 200, listed.text
        return key_ in {e["key"] for e in listed.json()["entries"]}

    # --- admin

    def create(self, namespace: str, by: Token | None = None, **policy: Any) -> dict[str, Any]:
        made = self.request("POST", f"/v1/admin/namespaces/{namespace}", policy, by)
        assert made.status_code == 201, made.text
        view: dict[str, Any] = made.json()
        return view

    def policy(self, namespace: str) -> dict[str, Any]:
        shown = self.request("GET", f"/v1/admin/namespaces/{namespace}")
        assert shown.status_code == 200, shown.text
        view: dict[str, Any] = shown.json()
        return view

    def pin(self, namespace: str, kind: str, value: str, reason: str = "") -> httpx.Response:
        body = {"kind": kind, "value": value, "reason": reason}
        return self.request("PUT", f"/v1/admin/namespaces/{namespace}/pins", body)

    def dry_run(self, **body: Any) -> dict[str, Any]:
        done = self.request("POST", "/v1/admin/evict", {"dry_run": True, **body})
        assert done.status_code == 200, done.text
        view: dict[str, Any] = done.json()
        assert view["dry_run"] is True
        return view

    def run_pass(self) -> dict[str, Any]:
        done = self.request("POST", "/v1/admin/evict", {"dry_run": False})
        assert done.status_code == 200, done.text
        view: dict[str, Any] = done.json()
        assert view["dry_run"] is False
        return view

    def expire(self, spec: str, by: Token | None = None, **body: Any) -> httpx.Response:
        return self.request("POST", "/v1/admin/expire", {"compiler_version": spec, **body}, by)

    def audit(self, by: Token | None = None, **query: Any) -> list[dict[str, Any]]:
        found = self.request("GET", "/v1/admin/audit", None, by, params=query)
        assert found.status_code == 200, found.text
        records: list[dict[str, Any]] = found.json()["records"]
        return records


def keys_of(view: dict[str, Any]) -> set[tuple[str, str]]:
    """(namespace, key) of the entries a dry run, a pass or an expiry lists."""
    return {(e["namespace"], e["key"]) for e in view["entries"]}


def removed(done: dict[str, Any]) -> set[tuple[str, str]]:
    return keys_of(done["removed"])


@pytest.fixture(params=backends(*BACKENDS))
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[BlobStore, Index]]:
    yield from open_stores(request.param, request, tmp_path)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The clock entries are stamped with and hits are recorded on (the evictor's is
    set per app): only the server's own modules see it."""
    made = Clock()
    fake = SimpleNamespace(time=made.time)
    monkeypatch.setattr(publish_module, "time", fake)
    monkeypatch.setattr(access_module, "time", fake)
    return made


MakeCache = Callable[..., Cache]


@pytest.fixture
def make_cache(
    stores: tuple[BlobStore, Index], clock: Clock, tmp_path: Path
) -> Iterator[MakeCache]:
    """An app over ``stores`` with settings overriding the test defaults (no background
    passes, no blob grace); one per test."""
    open_clients: list[TestClient] = []

    def make(**settings: Any) -> Cache:
        assert not open_clients, "one app per test: they would share the stores"
        values = {"eviction_interval_seconds": 0, "blob_grace_seconds": 0, **settings}
        app = create_app(
            ServerSettings(data_dir=tmp_path, **values), blob_store=stores[0], index=stores[1]
        )
        backends: Backends = app.state.backends
        backends.evictor.clock = clock.time
        client = TestClient(app)
        client.__enter__()
        open_clients.append(client)
        return Cache(client, backends, clock)

    yield make
    for client in open_clients:
        client.__exit__(None, None, None)


@pytest.fixture
def cache(make_cache: MakeCache) -> Cache:
    return make_cache()


# --- policies ---------------------------------------------------------------------------


def test_policy_create_show_set_list_round_trip(cache: Cache) -> None:
    created = cache.create("team-a", ttl_seconds=7 * DAY, quota_bytes=2**30, compiler_versions=2)
    assert created["namespace"] == "team-a"
    assert created["created"] is True
    assert (created["ttl_seconds"], created["quota_bytes"], created["compiler_versions"]) == (
        7 * DAY,
        2**30,
        2,
    )
    # What was not named has the defaults.
    assert created["failure_ttl_seconds"] == 3600
    assert created["max_entry_bytes"] is None
    assert created["read_through"] == []
    assert created["trusted_writers_only"] is False
    assert created["ranking"] == "value"

    shown = cache.policy("team-a")
    assert {name: shown[name] for name in created} == created
    assert shown["pins"] == []
    assert shown["usage"]["entries"] == 0

    changed = cache.request(
        "PATCH", "/v1/admin/namespaces/team-a", {"quota_bytes": None, "ranking": "lru"}
    )
    assert changed.status_code == 200, changed.text
    after = cache.policy("team-a")
    assert after["quota_bytes"] is None
    assert after["ranking"] == "lru"
    assert after["ttl_seconds"] == 7 * DAY  # kept: a change names only what it changes
    assert after["compiler_versions"] == 2

    # A namespace that only holds entries is listed too, with its usage.
    cache.published("team-b", key(1), {"model.neff": neff("b1", 1234)}, compile_seconds=7200)
    listing = cache.request("GET", "/v1/admin/namespaces")
    assert listing.status_code == 200
    by_name = {ns["namespace"]: ns for ns in listing.json()["namespaces"]}
    assert set(by_name) == {"team-a", "team-b"}
    assert by_name["team-a"]["ranking"] == "lru"
    assert by_name["team-a"]["quota_bytes"] is None
    assert by_name["team-b"]["created"] is False
    assert by_name["team-b"]["usage"]["entries"] == 1
    assert by_name["team-b"]["usage"]["bytes"] == 1234
    assert by_name["team-b"]["usage"]["compile_hours"] == 2.0


def test_an_uncreated_namespace_has_the_defaults(cache: Cache) -> None:
    shown = cache.policy("team-z")
    assert shown["created"] is False
    assert shown["ttl_seconds"] == 30 * DAY
    assert shown["failure_ttl_seconds"] == 3600
    assert shown["quota_bytes"] is None
    assert shown["max_entry_bytes"] is None
    assert shown["compiler_versions"] is None
    assert shown["read_through"] == []
    assert shown["trusted_writers_only"] is False


def test_changing_an_uncreated_namespace_is_404_and_creating_twice_409(cache: Cache) -> None:
    missing = cache.request("PATCH", "/v1/admin/namespaces/team-a", {"quota_bytes": 10**9})
    assert missing.status_code == 404
    assert "create it first" in missing.json()["detail"]
    assert cache.policy("team-a")["created"] is False
    cache.create("team-a", quota_bytes=10**9)
    again = cache.request("POST", "/v1/admin/namespaces/team-a", {"quota_bytes": 5})
    assert again.status_code == 409
    assert "exists" in again.json()["detail"]
    assert cache.policy("team-a")["quota_bytes"] == 10**9


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"quota_bytes": -1}, "quota_bytes"),
        ({"quota_bytes": 0}, "quota_bytes"),
        ({"max_entry_bytes": -5}, "max_entry_bytes"),
        ({"ttl_seconds": 10}, "ttl_seconds"),
        ({"failure_ttl_seconds": 0}, "failure_ttl_seconds"),
        ({"compiler_versions": 0}, "compiler_versions"),
        ({"ranking": "random"}, "ranking"),
        ({"colour": "blue"}, "colour"),
        ({"read_through": ["Team B"]}, "not a namespace name"),
        ({"read_through": ["../etc"]}, "not a namespace name"),
        ({"read_through": ["shared", "shared"]}, "twice"),
        ({"read_through": ["team-a"]}, "itself"),
    ],
)
def test_invalid_policies_are_400_with_a_clear_message(
    cache: Cache, body: dict[str, Any], words: str
) -> None:
    refused = cache.request("POST", "/v1/admin/namespaces/team-a", body)
    assert refused.status_code == 400
    assert words in refused.json()["detail"]
    assert cache.policy("team-a")["created"] is False
    before = cache.create("team-a")
    changed = cache.request("PATCH", "/v1/admin/namespaces/team-a", body)
    assert changed.status_code == 400
    assert words in changed.json()["detail"]
    after = cache.policy("team-a")
    assert {name: after[name] for name in before} == before


def test_a_policy_that_is_not_json_or_changes_nothing_is_400(cache: Cache) -> None:
    cache.create("team-a")
    path = "/v1/admin/namespaces/team-a"
    headers = {"Authorization": f"Bearer {cache.admin.secret}"}
    broken = cache.client.patch(path, content=b'{"quota_bytes": ', headers=headers)
    assert broken.status_code == 400
    assert "not JSON" in broken.json()["detail"]
    empty = cache.request("PATCH", path, {})
    assert empty.status_code == 400
    assert "at least one" in empty.json()["detail"]


def test_a_namespace_admin_manages_its_namespaces_only(cache: Cache) -> None:
    team_a = cache.token("admin", ["team-a"], "team-a admins")
    platform = cache.token("admin", ["team-a", "team-b"], "platform")
    cache.create("team-b", quota_bytes=10**9)
    base = "/v1/admin/namespaces"
    assert cache.request("POST", f"{base}/team-a", {}, team_a).status_code == 201
    assert (
        cache.request("PATCH", f"{base}/team-a", {"quota_bytes": 10**6}, team_a).status_code == 200
    )
    assert cache.request("PATCH", f"{base}/team-b", {"quota_bytes": 1}, team_a).status_code == 403
    assert cache.request("GET", f"{base}/team-b", None, team_a).status_code == 403
    assert cache.request("POST", f"{base}/team-c", {}, team_a).status_code == 403
    assert cache.policy("team-b")["quota_bytes"] == 10**9
    assert cache.policy("team-c")["created"] is False
    # Reading team-b through team-a would grant team-a's readers team-b: it needs
    # admin rights over team-b too.
    grab = cache.request("PATCH", f"{base}/team-a", {"read_through": ["team-b"]}, team_a)
    assert grab.status_code == 403
    assert "team-b" in grab.json()["detail"]
    assert cache.policy("team-a")["read_through"] == []
    allowed = cache.request("PATCH", f"{base}/team-a", {"read_through": ["team-b"]}, platform)
    assert allowed.status_code == 200
    assert cache.policy("team-a")["read_through"] == ["team-b"]
    # Listing shows only what the caller administers; pins and tokens follow suit.
    listed = cache.request("GET", base, None, team_a).json()["namespaces"]
    assert [ns["namespace"] for ns in listed] == ["team-a"]
    pin = {"kind": "model", "value": "llama"}
    assert cache.request("PUT", f"{base}/team-b/pins", pin, team_a).status_code == 403
    assert cache.request("PUT", f"{base}/team-a/pins", pin, team_a).status_code == 201
    token = {"scope": "write", "namespaces": ["team-a"], "trusted": True}
    assert cache.request("POST", "/v1/admin/tokens", token, team_a).status_code == 403


@pytest.mark.parametrize("scope", ["read", "write"])
def test_read_and_write_tokens_cannot_use_the_admin_api(cache: Cache, scope: str) -> None:
    user = cache.token(scope, ["*"], f"every namespace, {scope}")
    cache.create("team-a")
    base = "/v1/admin/namespaces"
    pins = f"{base}/team-a/pins"
    attempts: list[tuple[str, str, Any]] = [
        ("GET", base, None),
        ("GET", f"{base}/team-a", None),
        ("POST", f"{base}/team-b", {}),
        ("PATCH", f"{base}/team-a", {"quota_bytes": 5}),
        ("GET", pins, None),
        ("PUT", pins, {"kind": "key", "value": key(1)}),
        ("DELETE", f"{pins}?kind=key&value={key(1)}", None),
        ("POST", "/v1/admin/evict", {"dry_run": True}),
        ("POST", "/v1/admin/evict", {"dry_run": False}),
        ("POST", "/v1/admin/expire", {"compiler_version": "2.20.*", "dry_run": True}),
        ("POST", "/v1/admin/expire", {"compiler_version": "2.20.*"}),
        ("GET", "/v1/admin/audit", None),
        ("POST", "/v1/admin/tokens", {"scope": "write", "namespaces": ["*"], "trusted": True}),
    ]
    for method, path, body in attempts:
        answer = cache.request(method, path, body, user)
        assert answer.status_code == 403, (method, path, answer.text)
    assert cache.policy("team-a")["quota_bytes"] is None
    assert cache.policy("team-b")["created"] is False
    actions = [r["action"] for r in cache.audit()]
    assert actions == ["namespace.create", "token.create", "token.create"]


# --- failure records --------------------------------------------------------------------


def test_the_failure_ttl_is_per_namespace(cache: Cache) -> None:
    cache.create("quick", failure_ttl_seconds=0.5)
    for namespace in ("quick", "steady"):
        put = cache.request("PUT", f"/v1/ns/{namespace}/failures/{key(1)}", REPORT)
        assert put.status_code == 201, put.text
        assert cache.request("GET", f"/v1/ns/{namespace}/failures/{key(1)}").status_code == 200
    time.sleep(0.8)
    assert cache.request("GET", f"/v1/ns/quick/failures/{key(1)}").status_code == 404
    kept = cache.request("GET", f"/v1/ns/steady/failures/{key(1)}")
    assert kept.status_code == 200
    assert len(kept.json()["failures"]) == 1


# --- read-through -----------------------------------------------------------------------


def test_read_through_comes_after_the_own_namespace_and_says_where_from(cache: Cache) -> None:
    shared_neff, own_neff = neff("shared"), neff("own")
    cache.published("shared", key(1), {"model.neff": shared_neff})
    assert cache.entry("team-a", key(1)).status_code == 404
    cache.create("team-a", read_through=["shared"])
    got = cache.entry("team-a", key(1))
    assert got.status_code == 200
    assert got.json()["namespace"] == "shared"
    assert got.json()["files"]["model.neff"]["digest"] == digest(shared_neff)
    assert cache.entry("team-b", key(1)).status_code == 404  # no read-through there
    # The own entry wins.
    cache.published("team-a", key(1), {"model.neff": own_neff})
    own = cache.entry("team-a", key(1)).json()
    assert own["namespace"] == "team-a"
    assert own["files"]["model.neff"]["digest"] == digest(own_neff)
    assert cache.entry("shared", key(1)).json()["namespace"] == "shared"


def test_read_through_follows_the_stated_order(cache: Cache) -> None:
    cache.published("first", key(1), {"model.neff": neff("first")})
    cache.published("second", key(1), {"model.neff": neff("second")})
    cache.published("second", key(2), {"model.neff": neff("second only")})
    cache.create("team-a", read_through=["first", "second"])
    assert cache.entry("team-a", key(1)).json()["namespace"] == "first"
    assert cache.entry("team-a", key(2)).json()["namespace"] == "second"
    assert cache.entry("team-a", key(3)).status_code == 404
    flipped = cache.request(
        "PATCH", "/v1/admin/namespaces/team-a", {"read_through": ["second", "first"]}
    )
    assert flipped.status_code == 200
    assert cache.entry("team-a", key(1)).json()["namespace"] == "second"
    assert (
        cache.request("PATCH", "/v1/admin/namespaces/team-a", {"read_through": []}).status_code
        == 200
    )
    assert cache.entry("team-a", key(1)).status_code == 404


def test_aliases_read_through(cache: Cache) -> None:
    direct = key("direct")
    cache.published("shared", key(1), {"model.neff": neff("s")}, address=ADDRESS, direct_key=direct)
    cache.create("team-a", read_through=["shared"])
    for alias in (ADDRESS, direct):
        found = cache.request("GET", f"/v1/ns/team-a/aliases/{alias}")
        assert found.status_code == 200, found.text
        assert found.json()["namespace"] == "shared"
        assert found.json()["key"] == key(1)
        assert cache.request("GET", f"/v1/ns/team-b/aliases/{alias}").status_code == 404


def test_a_lease_on_a_graph_a_source_holds_is_done(cache: Cache) -> None:
    writer = cache.token("write", ["team-a", "team-b"], "trainer")
    cache.published("shared", key(1), {"model.neff": neff("s")}, address=ADDRESS)
    cache.create("team-a", read_through=["shared"])
    for name in (key(1), ADDRESS):
        asked = cache.request("POST", f"/v1/ns/team-a/leases/{name}", {"holder": "h1"}, writer)
        assert asked.status_code == 200, asked.text
        assert asked.json()["state"] == "done"
        assert asked.json()["entry"]["namespace"] == "shared"
        assert asked.json()["entry"]["key"] == key(1)
    # Without read-through, the graph is missing: compile it.
    other = cache.request("POST", f"/v1/ns/team-b/leases/{key(1)}", {"holder": "h2"}, writer)
    assert other.status_code == 201
    assert other.json()["state"] == "granted"


def test_a_team_token_reads_a_source_only_through_its_namespace(cache: Cache) -> None:
    reader = cache.token("read", ["team-a"], "team-a reader")
    cache.published("shared", key(1), {"model.neff": neff("s")}, address=ADDRESS)
    cache.create("team-a", read_through=["shared"])
    through = cache.entry("team-a", key(1), reader)
    assert through.status_code == 200
    assert through.json()["namespace"] == "shared"
    assert cache.request("GET", f"/v1/ns/team-a/aliases/{ADDRESS}", None, reader).status_code == 200
    assert cache.entry("shared", key(1), reader).status_code == 403
    assert cache.request("GET", f"/v1/ns/shared/aliases/{ADDRESS}", None, reader).status_code == 403
    assert cache.request("GET", "/v1/ns/shared/entries", None, reader).status_code == 403


# --- trusted writers --------------------------------------------------------------------


def test_an_untrusted_writer_never_changes_what_a_trusted_reader_receives(cache: Cache) -> None:
    cache.create("main", trusted_writers_only=True)
    cache.create("dev", read_through=["main"])
    ci = cache.token("write", ["main"], "ci", trusted=True)
    reader = cache.token("read", ["main"], "trainer")
    branch = cache.token("write", ["main", "dev"], "branch build")
    laptop = cache.token("write", ["*"], "laptop")
    good, evil = neff("ci build", 4096), neff("poisoned", 4096)
    k, fresh = key("graph"), key("fresh graph")
    first = cache.publish("main", k, {"model.neff": good}, ci, address=ADDRESS, compile_seconds=90)
    assert first.status_code == 201, first.text

    def seen() -> tuple[Any, ...]:
        """Everything a reader of main receives about these graphs."""
        entry = cache.entry("main", k, reader)
        blob = cache.request("GET", f"/v1/blobs/{entry.json()['files']['model.neff']['digest']}")
        alias = cache.request("GET", f"/v1/ns/main/aliases/{ADDRESS}", None, reader)
        other = cache.request("GET", f"/v1/ns/main/aliases/{OTHER_ADDRESS}", None, reader)
        fresh_entry = cache.entry("main", fresh, reader)
        failures = cache.request("GET", f"/v1/ns/main/failures/{k}", None, reader)
        fresh_failures = cache.request("GET", f"/v1/ns/main/failures/{fresh}", None, reader)
        return (
            entry.status_code,
            entry.content,
            blob.content,
            alias.status_code,
            alias.content,
            other.status_code,
            fresh_entry.status_code,
            failures.status_code,
            fresh_failures.status_code,
        )

    before = seen()
    assert before[0] == 200
    assert before[2] == good
    assert before[3] == 200
    assert before[5:] == (404, 404, 404, 404)
    cache.put_blob(evil, by=laptop)  # blobs are shared and content-addressed: harmless
    lease_id = "0" * 32
    for mallory in (branch, laptop):
        attempts: list[tuple[str, str, Any]] = [
            ("PUT", f"/v1/ns/main/entries/{fresh}", manifest(fresh, {"model.neff": evil})),
            ("PUT", f"/v1/ns/main/entries/{k}", manifest(k, {"model.neff": evil})),
            ("PUT", f"/v1/ns/main/entries/{k}", manifest(k, {"model.neff": good}, extra="x")),
            ("PUT", f"/v1/ns/main/aliases/{ADDRESS}", {"key": fresh}),
            ("PUT", f"/v1/ns/main/aliases/{OTHER_ADDRESS}", {"key": k}),
            ("PUT", f"/v1/ns/main/failures/{k}", REPORT),
            ("PUT", f"/v1/ns/main/failures/{fresh}", REPORT),
            ("POST", f"/v1/ns/main/leases/{fresh}", {"holder": "mallory"}),
            ("POST", f"/v1/ns/main/leases/{k}", {"holder": "mallory"}),
            ("POST", f"/v1/ns/main/leases/{fresh}", {"holder": "mallory", "take": False}),
            ("PUT", f"/v1/ns/main/leases/{fresh}?lease={lease_id}", None),
            ("DELETE", f"/v1/ns/main/leases/{fresh}?lease={lease_id}&outcome=failed", None),
        ]
        for method, path, body in attempts:
            answer = cache.request(method, path, body, mallory)
            assert answer.status_code == 403, (mallory.name, method, path, answer.text)
            assert "trusted" in answer.json()["detail"]
    assert seen() == before
    # Nobody holds a lease on the fresh graph: CI may compile it.
    granted = cache.request("POST", f"/v1/ns/main/leases/{fresh}", {"holder": "ci"}, ci)
    assert granted.status_code == 201
    # The untrusted writer publishes into its own namespace, which reads main through.
    own = cache.publish("dev", k, {"model.neff": evil}, branch, address=ADDRESS)
    assert own.status_code == 201, own.text
    assert cache.entry("dev", k).json()["files"]["model.neff"]["digest"] == digest(evil)
    cache.published("main", key("ci only"), {"model.neff": neff("ci 2")}, by=ci)
    assert cache.entry("dev", key("ci only")).json()["namespace"] == "main"
    assert seen() == before


def test_a_trusted_namespace_reads_through_trusted_namespaces_only(cache: Cache) -> None:
    cache.create("dev")
    cache.create("vendor", trusted_writers_only=True)
    refused = cache.request(
        "POST",
        "/v1/admin/namespaces/main",
        {"trusted_writers_only": True, "read_through": ["vendor", "dev"]},
    )
    assert refused.status_code == 400
    assert "dev" in refused.json()["detail"]
    assert cache.policy("main")["created"] is False
    cache.create("main", trusted_writers_only=True, read_through=["vendor"])
    widened = cache.request(
        "PATCH", "/v1/admin/namespaces/main", {"read_through": ["vendor", "dev"]}
    )
    assert widened.status_code == 400
    assert "dev" in widened.json()["detail"]
    assert cache.policy("main")["read_through"] == ["vendor"]


def test_turning_trust_on_is_refused_while_reading_an_open_namespace(cache: Cache) -> None:
    """The same rule from the other side: a namespace that reads ``dev`` through may
    not start taking only trusted writers while it does."""
    cache.create("dev")
    cache.create("stage", read_through=["dev"])
    changed = cache.request("PATCH", "/v1/admin/namespaces/stage", {"trusted_writers_only": True})
    assert changed.status_code == 400, changed.text
    assert "dev" in changed.json()["detail"]
    assert cache.policy("stage")["trusted_writers_only"] is False


def test_a_source_that_loses_its_trust_is_no_longer_read(cache: Cache) -> None:
    """Opening a source that a trusted namespace reads through is either refused or
    makes the trusted namespace stop reading it; never are its new entries served."""
    cache.create("vendor", trusted_writers_only=True)
    cache.create("main", trusted_writers_only=True, read_through=["vendor"])
    reader = cache.token("read", ["main"], "trainer")
    mallory = cache.token("write", ["vendor"], "mallory")
    cache.published("vendor", key(1), {"model.neff": neff("vendor")})
    assert cache.entry("main", key(1), reader).json()["namespace"] == "vendor"
    opened = cache.request("PATCH", "/v1/admin/namespaces/vendor", {"trusted_writers_only": False})
    assert opened.status_code in (200, 400), opened.text
    if opened.status_code == 400:
        assert "main" in opened.json()["detail"]
        assert (
            cache.publish("vendor", key(2), {"model.neff": neff("m")}, mallory).status_code == 403
        )
    else:
        assert (
            cache.publish("vendor", key(2), {"model.neff": neff("m")}, mallory).status_code == 201
        )
    assert cache.entry("main", key(2), reader).status_code == 404


def test_a_source_that_loses_its_trust_is_not_read_on_another_replica_either(
    stores: tuple[BlobStore, Index], clock: Clock, tmp_path: Path
) -> None:
    """The same through two replicas sharing the stores: the change is made on one,
    the untrusted entry published through it, and main read through the other."""
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0)
    apps = [create_app(settings, blob_store=stores[0], index=stores[1]) for _ in range(2)]
    with TestClient(apps[0]) as client_a, TestClient(apps[1]) as client_b:
        a = Cache(client_a, apps[0].state.backends, clock)
        b = Cache(client_b, apps[1].state.backends, clock, admin=a.admin)
        a.create("vendor", trusted_writers_only=True)
        a.create("main", trusted_writers_only=True, read_through=["vendor"])
        reader = a.token("read", ["main"], "trainer")
        mallory = a.token("write", ["vendor"], "mallory")
        a.published("vendor", key(1), {"model.neff": neff("vendor")})
        assert b.entry("main", key(1), reader).json()["namespace"] == "vendor"
        opened = a.request("PATCH", "/v1/admin/namespaces/vendor", {"trusted_writers_only": False})
        assert opened.status_code in (200, 400), opened.text
        poisoned = a.publish("vendor", key(2), {"model.neff": neff("m")}, mallory)
        assert poisoned.status_code == (201 if opened.status_code == 200 else 403)
        served = b.entry("main", key(2), reader)
        assert served.status_code == 404, f"main's reader got an untrusted entry: {served.text}"


def test_turning_trust_on_applies_on_every_replica_at_once(
    stores: tuple[BlobStore, Index], clock: Clock, tmp_path: Path
) -> None:
    """Once main takes only trusted writers (changed through one replica), no replica
    accepts an untrusted publish into it: such an entry would stay for good."""
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0)
    apps = [create_app(settings, blob_store=stores[0], index=stores[1]) for _ in range(2)]
    with TestClient(apps[0]) as client_a, TestClient(apps[1]) as client_b:
        a = Cache(client_a, apps[0].state.backends, clock)
        b = Cache(client_b, apps[1].state.backends, clock, admin=a.admin)
        a.create("main")
        mallory = a.token("write", ["main"], "branch build")
        reader = a.token("read", ["main"], "trainer")
        # B reads main's policy (open) on a lookup miss: now in its cache.
        assert b.entry("main", key(1), reader).status_code == 404
        locked = a.request("PATCH", "/v1/admin/namespaces/main", {"trusted_writers_only": True})
        assert locked.status_code == 200
        after = b.publish("main", key(2), {"model.neff": neff("after")}, mallory)
        assert after.status_code == 403, after.text
        assert b.entry("main", key(2), reader).status_code == 404


def test_trust_is_refused_while_untrusted_entries_are_held(cache: Cache) -> None:
    """Turning trusted-writers-only on would vouch for what untrusted writers already
    published: refused until none is left."""
    cache.create("main")
    mallory = cache.token("write", ["main"], "branch build")
    assert cache.publish("main", key(1), {"model.neff": neff("early")}, mallory).status_code == 201
    refused = cache.request("PATCH", "/v1/admin/namespaces/main", {"trusted_writers_only": True})
    assert refused.status_code == 400
    assert "holds entries" in refused.json()["detail"]
    assert cache.request("GET", "/v1/admin/namespaces/main").json()["trusted_writers_only"] is False


# --- limits -----------------------------------------------------------------------------


def test_an_entry_over_max_entry_bytes_is_413_and_nothing_is_stored(cache: Cache) -> None:
    cache.create("small", max_entry_bytes=1000)
    files = {"model.neff": neff("big", 600), "extra.bin": neff("big 2", 401)}
    refused = cache.publish("small", key(1), files, address=ADDRESS)
    assert refused.status_code == 413
    assert "1001" in refused.json()["detail"]
    assert cache.entry("small", key(1)).status_code == 404
    assert cache.request("GET", f"/v1/ns/small/aliases/{ADDRESS}").status_code == 404
    assert cache.request("GET", "/v1/ns/small/entries").json()["entries"] == []
    fits = {"model.neff": neff("fits", 600), "extra.bin": neff("fits 2", 400)}
    assert cache.publish("small", key(2), fits).status_code == 201


def test_an_entry_larger_than_the_quota_is_413(cache: Cache) -> None:
    cache.create("q", quota_bytes=2000, max_entry_bytes=10**6)
    refused = cache.publish("q", key(1), {"model.neff": neff("big", 2001)})
    assert refused.status_code == 413
    assert "quota" in refused.json()["detail"]
    assert cache.entry("q", key(1)).status_code == 404
    assert cache.publish("q", key(2), {"model.neff": neff("fits", 2000)}).status_code == 201


# --- eviction rules ---------------------------------------------------------------------


def test_ttl_expiry_counts_from_the_last_server_side_access(cache: Cache) -> None:
    cache.create("team-a", ttl_seconds=60)
    cache.create("shared", ttl_seconds=60)
    cache.create("reader", read_through=["shared"])
    for name in ("used", "unused", "also unused"):
        cache.published("team-a", key(name), {"model.neff": neff(name)})
    cache.published("shared", key("shared"), {"model.neff": neff("shared")})
    cache.published("team-b", key("default ttl"), {"model.neff": neff("default")})
    cache.clock.offset = 50
    assert cache.entry("team-a", key("used")).status_code == 200
    # A hit through read-through is a hit of the source's entry.
    assert cache.entry("reader", key("shared")).json()["namespace"] == "shared"
    cache.clock.offset = 100
    done = cache.run_pass()
    assert removed(done) == {("team-a", key("unused")), ("team-a", key("also unused"))}
    assert {e["reason"] for e in done["removed"]["entries"]} == {"expired"}
    assert cache.present("team-a", key("used"))
    assert cache.present("shared", key("shared"))
    assert cache.present("team-b", key("default ttl"))
    assert not cache.present("team-a", key("unused"))
    # The hit at +50 counts for 60 s: at +111 that entry goes too.
    cache.clock.offset = 111
    assert removed(cache.run_pass()) == {("team-a", key("used")), ("shared", key("shared"))}


def test_a_client_clock_changes_nothing(cache: Cache) -> None:
    cache.create("team-a", ttl_seconds=60)
    now = _REAL_TIME()
    past = {"Date": formatdate(now - 365 * DAY, usegmt=True)}
    future = {
        "Date": formatdate(now + 365 * DAY, usegmt=True),
        "If-Modified-Since": formatdate(now + 365 * DAY, usegmt=True),
    }
    published = cache.publish(
        "team-a",
        key(1),
        {"model.neff": neff("n")},
        headers=past,
        # Fields a client may add to a manifest: kept, never read as times.
        last_access=now + 365 * DAY,
        accessed_at=now + 365 * DAY,
        client_time=now - 365 * DAY,
    )
    assert published.status_code == 201
    assert abs(cache.entry("team-a", key(1)).json()["created_at"] - now) < 30
    hit = cache.request("GET", f"/v1/ns/team-a/entries/{key(1)}", headers=future)
    assert hit.status_code == 200
    cache.clock.offset = 30
    assert removed(cache.run_pass()) == set()  # a year-old Date did not age it
    cache.clock.offset = 90
    listed = cache.dry_run()["entries"]
    assert [e["key"] for e in listed] == [key(1)]
    assert abs(listed[0]["last_access"] - now) < 30  # the server's time of the hit
    # Nor did a hit dated a year ahead keep it.
    assert removed(cache.run_pass()) == {("team-a", key(1))}


def test_compiler_retention_keeps_the_most_recently_used_versions(cache: Cache) -> None:
    cache.create("team-a", compiler_versions=2)
    files = {"model.neff": neff("x")}
    cache.published("team-a", key("old"), files, version="2.19.1")
    cache.published("team-a", key("unversioned"), files)
    cache.published("team-a", key("middle early"), files, version="2.20.1")
    cache.clock.offset = 10
    cache.published("team-a", key("middle"), files, version="2.20.1")
    cache.clock.offset = 20
    cache.published("team-a", key("new"), files, version="2.21.0")
    cache.published("team-b", key("old elsewhere"), files, version="2.19.0")
    cache.clock.offset = 30
    # Used now: 2.19.1 is among the two most recently used, 2.20.1 is not.
    assert cache.entry("team-a", key("old")).status_code == 200
    cache.clock.offset = 31
    done = cache.run_pass()
    assert removed(done) == {("team-a", key("middle early")), ("team-a", key("middle"))}
    assert {e["reason"] for e in done["removed"]["entries"]} == {"compiler-retention"}
    for name in ("old", "unversioned", "new"):
        assert cache.present("team-a", key(name)), name
    assert cache.present("team-b", key("old elsewhere"))


@pytest.mark.parametrize(("ranking", "survivor"), [("value", "forty minutes"), ("lru", "ten s")])
def test_a_quota_evicts_the_least_worth_first(cache: Cache, ranking: str, survivor: str) -> None:
    cache.create("team-a", quota_bytes=1500, ranking=ranking)
    cache.published("team-a", key("forty minutes"), {"m.neff": neff("40")}, compile_seconds=2400)
    cache.clock.offset = 10
    cache.published("team-a", key("ten s"), {"m.neff": neff("10")}, compile_seconds=10)
    cache.clock.offset = 20
    done = cache.run_pass()
    assert len(done["removed"]["entries"]) == 1
    assert done["removed"]["entries"][0]["reason"] == "quota"
    assert cache.present("team-a", key(survivor))
    assert done["namespaces"][0]["bytes_after"] <= 1500


def test_value_decays_with_recency(cache: Cache) -> None:
    cache.create("team-a", quota_bytes=1500, ttl_seconds=None)
    cache.published("team-a", key("stale"), {"m.neff": neff("stale")}, compile_seconds=2400)
    cache.clock.offset = 8 * 7 * DAY  # eight half-lives: worth 2400/256 s now
    cache.published("team-a", key("in use"), {"m.neff": neff("use")}, compile_seconds=10)
    assert cache.entry("team-a", key("in use")).status_code == 200
    cache.clock.offset += 10
    assert removed(cache.run_pass()) == {("team-a", key("stale"))}


def test_a_quota_goes_down_to_below_the_quota(cache: Cache) -> None:
    cache.create("team-a", quota_bytes=3000)
    for i in range(5):
        cache.clock.offset = i
        cache.published("team-a", key(i), {"m.neff": neff(f"q{i}")}, compile_seconds=60)
    cache.clock.offset = 10
    done = cache.run_pass()
    assert done["namespaces"][0]["bytes"] == 5000
    assert done["namespaces"][0]["bytes_after"] <= 3000
    left = cache.request("GET", "/v1/ns/team-a/entries").json()["entries"]
    assert sum(e["files"]["m.neff"]["size"] for e in left) == done["namespaces"][0]["bytes_after"]
    assert cache.policy("team-a")["usage"]["bytes"] <= 3000


def test_pinned_entries_survive_every_rule_and_expire(cache: Cache) -> None:
    cache.create("team-a", ttl_seconds=60, compiler_versions=1, quota_bytes=2500)
    files = {"model.neff": neff("p")}
    cache.published("team-a", key("by key"), files, version="2.19.1")
    cache.published("team-a", key("by address"), files, version="2.19.1", address=ADDRESS)
    cache.published("team-a", key("by model"), files, version="2.19.1", model="llama-70b")
    cache.published("team-a", key("by version"), files, version="2.18.3")
    cache.published("team-a", key("loose"), files, version="2.19.1", model="llama-8b")
    cache.clock.offset = 5
    cache.published("team-a", key("newest"), files, version="2.21.0")
    pins = [
        ("key", key("by key")),
        ("address", ADDRESS),
        ("model", "llama-70b"),
        ("compiler-version", "2.18.*"),
    ]
    for kind, value in pins:
        assert cache.pin("team-a", kind, value, "release 7").status_code == 201
    again = cache.pin("team-a", "key", key("by key"))
    assert again.status_code == 200
    assert "already" in again.json()["detail"]
    cache.clock.offset = 1000
    done = cache.run_pass()
    assert removed(done) == {("team-a", key("loose")), ("team-a", key("newest"))}
    plan = done["namespaces"][0]
    assert plan["pinned_bytes"] == 4000
    assert plan["over_quota_pinned"] is True
    expired = cache.expire("*")
    assert expired.status_code == 200
    assert expired.json()["total"]["entries"] == 0
    for name in ("by key", "by address", "by model", "by version"):
        assert cache.present("team-a", key(name)), name
    listed = cache.request("GET", "/v1/admin/namespaces/team-a/pins").json()["pins"]
    assert sorted((p["kind"], p["value"]) for p in listed) == sorted(pins)
    assert {p["reason"] for p in listed} == {"release 7"}
    assert {p["actor"] for p in listed} == {cache.admin.label}
    unpinned = cache.request(
        "DELETE", "/v1/admin/namespaces/team-a/pins", params={"kind": "key", "value": key("by key")}
    )
    assert unpinned.status_code == 204
    assert removed(cache.run_pass()) == {("team-a", key("by key"))}
    assert cache.present("team-a", key("by address"))


@pytest.mark.parametrize(
    ("kind", "value"),
    [("colour", "red"), ("key", "abc"), ("address", "not/an/address"), ("model", "")],
)
def test_malformed_pins_are_400(cache: Cache, kind: str, value: str) -> None:
    assert cache.pin("team-a", kind, value).status_code == 400
    assert cache.request("GET", "/v1/admin/namespaces/team-a/pins").json()["pins"] == []


def test_removing_an_absent_pin_is_404(cache: Cache) -> None:
    gone = cache.request(
        "DELETE", "/v1/admin/namespaces/team-a/pins", params={"kind": "model", "value": "x"}
    )
    assert gone.status_code == 404


def test_a_dry_run_lists_bytes_and_compile_hours_and_changes_nothing(cache: Cache) -> None:
    cache.create("team-a", ttl_seconds=60)
    cache.published("team-a", key(1), {"m.neff": neff("a", 1000)}, compile_seconds=5400)
    two = {"m.neff": neff("b", 2000), "n.neff": neff("c", 1000)}
    cache.published("team-a", key(2), two, compile_seconds=1800)
    cache.published("team-a", key(3), {"m.neff": neff("d", 500)})
    cache.clock.offset = 100
    expected = {("team-a", key(i)) for i in (1, 2, 3)}
    for body in ({}, {"dry_run": True}, {"dry_run": True, "namespaces": ["team-a"]}):
        answer = cache.request("POST", "/v1/admin/evict", body)
        assert answer.status_code == 200
        view = answer.json()
        assert view["dry_run"] is True
        assert keys_of(view) == expected
        assert view["total"] == {
            "entries": 3,
            "bytes": 4500,
            "compile_hours": 2.0,
            "unknown_compile_time": 1,
        }
        by_key = {e["key"]: e for e in view["entries"]}
        assert by_key[key(2)]["bytes"] == 3000
        assert by_key[key(2)]["compile_seconds"] == 1800
        assert by_key[key(3)]["compile_seconds"] is None
        assert {e["reason"] for e in view["entries"]} == {"expired"}
    for i in (1, 2, 3):
        assert cache.present("team-a", key(i))
    for data in (neff("a", 1000), neff("b", 2000), neff("d", 500)):
        assert cache.has_blob(data)
    assert not [r for r in cache.audit() if r["action"] == "evict"]
    assert removed(cache.run_pass()) == expected


def test_a_dry_run_agrees_with_the_pass_after_a_hit(cache: Cache) -> None:
    """A hit served just before a dry run keeps the entry in the pass that follows; the
    dry run should not list it as going."""
    cache.create("team-a", ttl_seconds=60)
    cache.published("team-a", key(1), {"m.neff": neff("a")})
    cache.clock.offset = 50
    assert cache.entry("team-a", key(1)).status_code == 200
    cache.clock.offset = 100
    listed = keys_of(cache.dry_run())
    done = removed(cache.run_pass())
    assert done == set()
    assert listed == done


def test_a_blob_stays_while_any_entry_references_it(cache: Cache) -> None:
    cache.create("x", ttl_seconds=60)
    common, own = neff("common", 3000), neff("own", 2000)
    cache.published("x", key(1), {"a.neff": common, "b.neff": own})
    cache.published("y", key(2), {"a.neff": common}, version="2.20.1")
    cache.clock.offset = 100
    done = cache.run_pass()
    assert removed(done) == {("x", key(1))}
    assert done["blobs_collected"] == 1
    assert done["blob_bytes_collected"] == 2000
    assert cache.has_blob(common)
    assert not cache.has_blob(own)
    got = cache.request("GET", f"/v1/blobs/{digest(common)}")
    assert got.content == common
    assert cache.expire("2.20.1").json()["total"]["entries"] == 1
    assert cache.run_pass()["blobs_collected"] == 1
    assert not cache.has_blob(common)


def test_unreferenced_blobs_wait_out_their_grace(make_cache: MakeCache) -> None:
    cache = make_cache(blob_grace_seconds=1.0)
    referenced, orphan = neff("referenced", 3000), neff("upload not yet published", 2000)
    cache.published("team-a", key(1), {"a.neff": referenced}, version="2.20.1")
    cache.put_blob(orphan)
    assert cache.expire("2.20.1").json()["total"]["entries"] == 1
    first = cache.run_pass()
    assert first["blobs_collected"] == 0
    assert first["blobs_in_grace"] == 2
    assert cache.has_blob(referenced)
    assert cache.has_blob(orphan)
    time.sleep(1.2)
    second = cache.run_pass()
    assert second["blobs_collected"] == 2
    assert second["blob_bytes_collected"] == 5000
    assert not cache.has_blob(referenced)
    assert not cache.has_blob(orphan)


def test_asking_about_an_unpublished_upload_does_not_keep_it(make_cache: MakeCache) -> None:
    """Staged bytes no entry references escape every quota: asking whether the server
    has them must not renew their grace, or a write token could keep them forever."""
    cache = make_cache(blob_grace_seconds=1.0)
    staged = neff("uploaded, never published", 2000)
    cache.put_blob(staged)
    assert cache.run_pass()["blobs_in_grace"] == 1
    time.sleep(1.2)
    asked = cache.request("POST", "/v1/blobs/missing", {"digests": [digest(staged)]})
    assert asked.json() == {"missing": []}
    assert cache.run_pass()["blobs_collected"] == 1
    assert not cache.has_blob(staged)


def test_reading_an_unreferenced_blob_keeps_it_only_while_it_is_read(
    make_cache: MakeCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evictor_module, "IN_USE_S", 0.3)
    cache = make_cache(blob_grace_seconds=1.0)
    staged = neff("uploaded, never published, read by digest", 2000)
    cache.put_blob(staged)
    assert cache.run_pass()["blobs_in_grace"] == 1
    time.sleep(1.2)
    assert cache.request("GET", f"/v1/blobs/{digest(staged)}").content == staged
    assert cache.run_pass()["blobs_in_grace"] == 1  # just read: a download may be under way
    time.sleep(0.4)
    assert cache.run_pass()["blobs_collected"] == 1


def test_asking_for_absent_blobs_remembers_nothing(cache: Cache) -> None:
    absent = [hashlib.sha256(str(n).encode()).hexdigest() for n in range(50)]
    for name in absent:
        assert cache.request("GET", f"/v1/blobs/{name}").status_code == 404
    assert not any(cache.backends.blob_use.used_within(name, 3600) for name in absent)


class HookedBlobStore(MemoryBlobStore):
    """Runs ``before_delete`` (once) just before a blob is deleted."""

    before_delete: Callable[[str], None] | None = None

    def delete(self, digest: str) -> bool:
        hook, self.before_delete = self.before_delete, None
        if hook is not None:
            hook(digest)
        return super().delete(digest)


def test_a_blob_referenced_again_during_a_collection_is_kept(clock: Clock, tmp_path: Path) -> None:
    """An evicted entry's blob waits out its grace; a deterministic compile then
    publishes the same bytes again, through another replica (the client finds the blob
    present and does not upload it), while the evictor's collection is under way. The
    new entry must keep its blob."""
    blobs, index = HookedBlobStore(), MemoryIndex()
    try:
        republish_during_collection(blobs, index, clock, tmp_path)
    finally:
        blobs.close()


def republish_during_collection(
    blobs: HookedBlobStore, index: Index, clock: Clock, tmp_path: Path
) -> None:
    settings = ServerSettings(
        data_dir=tmp_path, eviction_interval_seconds=0, blob_grace_seconds=1.0
    )
    apps = [create_app(settings, blob_store=blobs, index=index) for _ in range(2)]
    data = neff("deterministic compile", 3000)
    with TestClient(apps[0]) as client_a, TestClient(apps[1]) as client_b:
        a = Cache(client_a, apps[0].state.backends, clock)
        b = Cache(client_b, apps[1].state.backends, clock, admin=a.admin)
        a.published("team-a", key(1), {"model.neff": data}, version="2.20.1")
        assert a.expire("2.20.1").json()["total"]["entries"] == 1
        assert a.run_pass()["blobs_in_grace"] == 1
        time.sleep(1.2)
        republished: list[int] = []

        def publish(digest_: str) -> None:
            # What a client does: ask which blobs are missing, upload none, publish.
            asked = b.request("POST", "/v1/blobs/missing", {"digests": [digest_]})
            assert asked.json()["missing"] == []
            body = manifest(key(2), {"model.neff": data}, version="2.21.0")
            republished.append(
                b.request("PUT", f"/v1/ns/team-b/entries/{key(2)}", body).status_code
            )

        publisher: list[threading.Thread] = []

        def publish_again(digest_: str) -> None:
            # Through the other replica, while this one is about to remove the blob:
            # the publish lands and waits for the collection to decide.
            publisher.append(threading.Thread(target=publish, args=(digest_,)))
            publisher[0].start()
            time.sleep(0.5)

        blobs.before_delete = publish_again
        a.run_pass()
        publisher[0].join(timeout=30)
        # The blob was condemned when the publish landed: it waited, found the blob
        # removed, took its entry back and asked for the blob.
        assert republished == [400]
        assert not a.present("team-b", key(2))
        # What the client does next: upload the blob, publish again.
        blobs.before_delete = None
        done = b.publish("team-b", key(2), {"model.neff": data}, version="2.21.0")
        assert done.status_code == 201, done.text
        a.run_pass()
        fetched = b.request("GET", f"/v1/blobs/{digest(data)}")
        assert fetched.status_code == 200, "a live entry names a blob that was deleted"
        assert fetched.content == data


# --- expire -----------------------------------------------------------------------------


def test_expire_retires_a_compiler_generation_where_the_caller_is_admin(cache: Cache) -> None:
    files = {"m.neff": neff("e")}
    cache.published("team-a", key("a1"), files, version="2.20.1", compile_seconds=3600)
    cache.published("team-a", key("a2"), files, version="2.20.9961.0+0acef03a")
    cache.published("team-a", key("a3"), files, version="2.21.0")
    cache.published("team-a", key("a4"), files)
    cache.published("team-b", key("b1"), files, version="2.20.1")
    cache.published("team-b", key("b2"), files, version="2.20.5")
    cache.published("team-c", key("c1"), files, version="2.20.1")
    assert cache.pin("team-b", "key", key("b1")).status_code == 201
    ops = cache.token("admin", ["team-a", "team-b"], "compiler rollout")
    going = {("team-a", key("a1")), ("team-a", key("a2")), ("team-b", key("b2"))}
    dry = cache.expire("2.20.*", ops, dry_run=True)
    assert dry.status_code == 200
    assert dry.json()["dry_run"] is True
    assert keys_of(dry.json()) == going
    assert dry.json()["total"]["bytes"] == 3000
    assert dry.json()["total"]["compile_hours"] == 1.0
    assert all(cache.present(ns, k) for ns, k in going)
    done = cache.expire("2.20.*", ops)
    assert done.status_code == 200
    assert keys_of(done.json()) == going
    assert {e["reason"] for e in done.json()["entries"]} == {"admin-expire"}
    assert not any(cache.present(ns, k) for ns, k in going)
    for ns, name in (("team-a", "a3"), ("team-a", "a4"), ("team-b", "b1"), ("team-c", "c1")):
        assert cache.present(ns, key(name)), name
    # Asking for a namespace it does not administer is refused outright.
    refused = cache.expire("2.20.*", ops, namespaces=["team-c"])
    assert refused.status_code == 403
    assert cache.present("team-c", key("c1"))
    assert cache.expire("", ops).status_code == 400


def test_a_pass_needs_an_admin_token_for_every_namespace(cache: Cache) -> None:
    cache.create("team-a", ttl_seconds=60)
    cache.create("team-b", ttl_seconds=60)
    cache.published("team-a", key(1), {"m.neff": neff("a")})
    cache.published("team-b", key(2), {"m.neff": neff("b")})
    cache.clock.offset = 100
    team_a = cache.token("admin", ["team-a"], "team-a admins")
    refused = cache.request("POST", "/v1/admin/evict", {"dry_run": False}, team_a)
    assert refused.status_code == 403
    own = cache.request("POST", "/v1/admin/evict", {"dry_run": True}, team_a)
    assert keys_of(own.json()) == {("team-a", key(1))}
    other = cache.request(
        "POST", "/v1/admin/evict", {"dry_run": True, "namespaces": ["team-b"]}, team_a
    )
    assert other.status_code == 403
    scoped = cache.request("POST", "/v1/admin/evict", {"dry_run": False, "namespaces": ["team-a"]})
    assert scoped.status_code == 400
    assert cache.present("team-a", key(1))
    assert cache.present("team-b", key(2))


# --- audit ------------------------------------------------------------------------------


def test_the_audit_log_says_who_did_what_when_and_why(cache: Cache) -> None:
    start = _REAL_TIME()
    ci = cache.token("write", ["main"], "ci", trusted=True)
    revoked = cache.request("DELETE", f"/v1/admin/tokens/{ci.token_id}")
    assert revoked.status_code == 204
    team_a = cache.token("admin", ["team-a"], "team-a admins")
    cache.create("team-a", ttl_seconds=60, by=team_a)
    changed = cache.request("PATCH", "/v1/admin/namespaces/team-a", {"quota_bytes": 10**6}, team_a)
    assert changed.status_code == 200
    cache.create("team-b")
    cache.published("team-a", key("pinned"), {"m.neff": neff("p")}, version="2.19.0")
    cache.published("team-a", key("old"), {"m.neff": neff("o")}, compile_seconds=120)
    cache.published("team-a", key("retired"), {"m.neff": neff("r")}, version="2.20.1")
    cache.published("team-b", key("b"), {"m.neff": neff("b")}, version="2.20.1")
    pinned = cache.request(
        "PUT",
        "/v1/admin/namespaces/team-a/pins",
        {"kind": "key", "value": key("pinned"), "reason": "golden model"},
        team_a,
    )
    assert pinned.status_code == 201
    time.sleep(0.01)
    middle = _REAL_TIME()
    time.sleep(0.01)
    assert cache.expire("2.20.1").status_code == 200
    unpinned = cache.request(
        "DELETE",
        "/v1/admin/namespaces/team-a/pins",
        params={"kind": "key", "value": key("pinned"), "reason": "superseded"},
    )
    assert unpinned.status_code == 204
    cache.clock.offset = 100
    assert cache.run_pass()["removed"]["total"]["entries"] == 2

    records = cache.audit()
    assert all(r["at"] >= start for r in records if r["target"] != cache.admin.token_id)
    assert [r["at"] for r in records] == sorted((r["at"] for r in records), reverse=True)

    def one(action: str, target: str | None = None, namespace: str | None = None) -> dict[str, Any]:
        found = [
            r
            for r in records
            if r["action"] == action
            and (target is None or r["target"] == target)
            and (namespace is None or r["namespace"] == namespace)
        ]
        assert len(found) == 1, (action, target, found)
        return found[0]

    made = one("token.create", ci.token_id)
    assert made["actor"] == cache.admin.label
    assert made["namespace"] == ""
    assert made["detail"]["trusted"] is True
    assert made["detail"]["namespaces"] == ["main"]
    assert one("token.revoke", ci.token_id)["actor"] == cache.admin.label
    created = one("namespace.create", namespace="team-a")
    assert created["actor"] == team_a.label
    assert created["detail"]["set"] == {"ttl_seconds": 60}
    changed_record = one("namespace.set", namespace="team-a")
    assert changed_record["actor"] == team_a.label
    assert changed_record["detail"]["old"] == {"quota_bytes": None}
    assert changed_record["detail"]["new"] == {"quota_bytes": 10**6}
    pin = one("pin", "key:" + key("pinned"))
    assert (pin["actor"], pin["namespace"], pin["detail"]["reason"]) == (
        team_a.label,
        "team-a",
        "golden model",
    )
    unpin = one("unpin", "key:" + key("pinned"))
    assert (unpin["actor"], unpin["detail"]["reason"]) == (cache.admin.label, "superseded")
    for namespace, name in (("team-a", "retired"), ("team-b", "b")):
        expiry = one("expire", key(name))
        assert expiry["namespace"] == namespace
        assert expiry["actor"] == cache.admin.label
        assert expiry["detail"]["reason"] == "admin-expire"
        assert "2.20.1" in expiry["detail"]["why"]
        assert expiry["detail"]["bytes"] == 1000
    eviction = one("evict", key("old"))
    assert eviction["namespace"] == "team-a"
    assert eviction["detail"]["reason"] == "expired"
    assert eviction["detail"]["compile_seconds"] == 120
    assert eviction["detail"]["bytes"] == 1000
    assert one("evict", key("pinned"))["detail"]["why"]

    # Filters: since, namespace, limit.
    later = cache.audit(since=middle)
    assert {r["action"] for r in later} == {"expire", "unpin", "evict"}
    assert all(r["at"] >= middle for r in later)
    only_b = cache.audit(namespace="team-b")
    assert [(r["action"], r["target"]) for r in only_b] == [
        ("expire", key("b")),
        ("namespace.create", ""),
    ]
    assert cache.audit(limit=2) == records[:2]
    # A namespace admin sees its namespaces' records and nothing server-wide.
    seen = cache.audit(by=team_a)
    assert seen == [r for r in records if r["namespace"] == "team-a"]
    refused = cache.request("GET", "/v1/admin/audit", None, team_a, params={"namespace": "team-b"})
    assert refused.status_code == 403
