"""The bridge's pieces on their own: entry states, the publish sequence against a
scripted server (``bridge.scripted``: httpx handlers), blob verification, dates and server URLs."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO

import blake3
import httpx
import pytest
from bridge.layout import StockCache, standard_cache
from bridge.scripted import scripted
from support import http_stubs

from neffcache.client.bridge.exporter import Filters, parse_since
from neffcache.client.bridge.importer import Outcome, import_cache, key_entry, publish
from neffcache.client.bridge.remote import Refused, Unusable
from neffcache.client.bridge.report import Progress
from neffcache.client.bridge.stock import (
    DirectorySource,
    ReadError,
    State,
    classify,
)
from neffcache.keying import is_stock_artifact as is_artifact


@pytest.mark.parametrize(
    ("names", "state"),
    [
        ({"model.neff", "model.done", "model.hlo_module.pb"}, State.SUCCESS),
        ({"model.neff", "model.done", "model.hlo_module.pb.lock"}, State.SUCCESS),
        ({"model.hlo_module.pb", "model.hlo_module.pb.lock"}, State.LOCKED),
        ({"model.hlo_module.pb", "model.log", "model.hlo_module.pb.lock"}, State.LOCKED),
        ({"model.hlo.pb", "model.log"}, State.FAILED),
        ({"model.hlo_module.pb", "model.neff"}, State.INCOMPLETE),
        ({"model.hlo_module.pb", "model.done"}, State.INCOMPLETE),
        ({"model.hlo_module.pb", "compile_flags.json"}, State.EMPTY),
        (set(), State.EMPTY),
    ],
)
def test_entry_states(names: set[str], state: State) -> None:
    assert classify(names) is state


def test_markers_locks_and_hidden_files_are_not_artifacts() -> None:
    names = ["model.neff", "wrapped_neff.hlo", "model.done", "model.log", "x.lock", ".tmp1"]
    assert [n for n in names if is_artifact(n)] == ["model.neff", "wrapped_neff.hlo"]


def test_directory_listing_finds_entries_of_every_version_and_skips_hidden_folders(
    tmp_path: Path,
) -> None:
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")
    cache.add("block_a", version="2.21.1.0+abcdef12")
    (tmp_path / "cache" / "lock").write_text("")  # the cache-wide lock file
    # optimum-neuron's registry, beside the entries of a version
    # (docs/neuron-sdk.md#optimum-neurons-registry).
    registry = tmp_path / "cache" / "neuronxcc-2.21.1.0+abcdef12" / "0_REGISTRY"
    (registry / "0.0.28" / "ab12").mkdir(parents=True)
    (registry / "0.0.28" / "ab12" / "cd34.json").write_text("{}")
    (tmp_path / "cache" / "neuronxcc-2.21.1.0+abcdef12" / ".MODULE_1+00000000.ab.partial").mkdir()
    entries = DirectorySource(cache.root).entries()
    assert [e.address for e in entries] == sorted(p.address for p in cache.placed)
    assert entries[0].sizes["model.done"] == 0
    assert [e.problem for e in entries] == [None, None]


def file_with(tmp_path: Path, data: bytes) -> tuple[str, Path]:
    path = tmp_path / blake3.blake3(data).hexdigest()[:8]
    path.write_bytes(data)
    return blake3.blake3(data).hexdigest(), path


def test_publish_retries_once_when_the_server_lost_a_blob(tmp_path: Path) -> None:
    digest, path = file_with(tmp_path, b"neff")
    calls: list[str] = []
    answers = iter([httpx.Response(400, json={"detail": "x", "missing": [digest]})])

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        if request.url.path == "/v1/blobs/missing":
            return httpx.Response(200, json={"missing": [digest]})
        if request.method == "PUT" and "/entries/" in request.url.path:
            return next(answers, httpx.Response(201))
        return httpx.Response(201)

    manifest = {"key": "a" * 64, "files": {"model.neff": {"digest": digest, "size": 4}}}
    opened: list[str] = []

    def open_file(name: str) -> BinaryIO:
        opened.append(name)
        return path.open("rb")

    assert publish(scripted(handler), manifest, open_file) == Outcome("imported")
    assert opened == ["model.neff", "model.neff"]
    entry = f"PUT /v1/ns/team-a/entries/{'a' * 64}"
    blob = f"PUT /v1/blobs/{digest}"
    assert calls == ["POST /v1/blobs/missing", blob, entry] * 2


@pytest.mark.parametrize(
    ("status", "outcome"), [(201, "imported"), (200, "present"), (409, "conflict")]
)
def test_the_manifest_answer_decides_the_outcome(tmp_path: Path, status: int, outcome: str) -> None:
    # The entry is absent when checked, then another importer wins the race.
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(404, json={"detail": "absent", "reason": "absent"})
        if request.url.path == "/v1/blobs/missing":
            return httpx.Response(200, json={"missing": []})
        return httpx.Response(status)

    progress = Progress("import", io.StringIO())
    report = import_cache(
        DirectorySource(cache.root), scripted(handler), target=None, progress=progress
    )
    assert {k: n for k, n in report.counts.items() if n} == {outcome: 1}
    assert [d["outcome"] for d in report.details] == (["conflict"] if status == 409 else [])


def test_a_server_error_is_that_entry_s_error_and_the_run_goes_on(tmp_path: Path) -> None:
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")
    cache.add("variant_shape")
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            seen.append(request.url.path)
            if len(seen) == 1:
                return httpx.Response(503, json={"detail": "index down"})
            return httpx.Response(200, json={"key": "k"})
        if request.method == "PUT" and "/aliases/" in request.url.path:
            return httpx.Response(200)  # the present entry's aliases were there
        raise AssertionError(request)

    report = import_cache(
        DirectorySource(cache.root),
        scripted(handler),
        target=None,
        progress=Progress("", io.StringIO()),
    )
    assert report.counts["error"] == 1
    assert report.counts["present"] == 1
    assert "answered 503: index down" in report.details[0]["reason"]


def test_a_forbidden_token_stops_the_run() -> None:
    remote = scripted(lambda request: httpx.Response(403, json={"detail": "not team-a"}))
    with pytest.raises(Unusable, match=r"refused the token \(HTTP 403\): not team-a"):
        remote.entry("a" * 64)


def test_a_downloaded_blob_is_verified(tmp_path: Path) -> None:
    good = b"the real NEFF"
    digest = blake3.blake3(good).hexdigest()
    body = {"bytes": good}
    remote = scripted(lambda request: httpx.Response(200, content=body["bytes"]))
    remote.fetch_blob(digest, len(good), tmp_path / "ok")
    assert (tmp_path / "ok").read_bytes() == good
    body["bytes"] = b"the real NEFG"  # same length, other bytes
    with pytest.raises(Refused, match="expected 13 bytes"):
        remote.fetch_blob(digest, len(good), tmp_path / "bad")
    body["bytes"] = good[:5]
    with pytest.raises(Refused, match="received 5 bytes"):
        remote.fetch_blob(digest, len(good), tmp_path / "short")


def test_a_blob_sent_from_a_presigned_url_is_followed_without_the_token(
    tmp_path: Path,
) -> None:
    # A server with blob_redirect_seconds answers a blob GET with a 307 to S3.
    good = b"the NEFF from S3"
    digest = blake3.blake3(good).hexdigest()
    with http_stubs.scripted(lambda method, path: (200, good)) as store:
        location = f"{store.url}/bucket/{digest}?X-Amz-Signature=secret"
        remote = scripted(lambda request: httpx.Response(307, headers={"Location": location}))
        remote.fetch_blob(digest, len(good), tmp_path / "ok")
        assert (tmp_path / "ok").read_bytes() == good
        assert store.paths == [f"/bucket/{digest}?X-Amz-Signature=secret"]
        assert store.auth == [""]  # the server's token stays with the server


def test_a_redirect_that_leads_nowhere_skips_the_entry(tmp_path: Path) -> None:
    digest = "b" * 64
    looping = scripted(lambda request: httpx.Response(307, headers={"Location": "/again"}))
    with pytest.raises(Refused, match="redirect"):
        looping.fetch_blob(digest, 10, tmp_path / "x")
    elsewhere = scripted(lambda request: httpx.Response(302, headers={"Location": "ftp://x/y"}))
    with pytest.raises(Refused, match="its redirect failed"):
        elsewhere.fetch_blob(digest, 10, tmp_path / "y")


def test_a_server_without_listing_is_unusable_for_export() -> None:
    remote = scripted(lambda request: httpx.Response(405, json={"detail": "Method Not Allowed"}))
    with pytest.raises(Unusable, match="cannot list entries"):
        next(remote.pages())


def test_listing_follows_next_until_null() -> None:
    asked: list[str] = []
    first, second = "1" * 64, "2" * 64

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url.params))
        after = request.url.params.get("after")
        if after is None:
            return httpx.Response(200, json={"entries": [{"key": first}], "next": first})
        return httpx.Response(200, json={"entries": [{"key": second}], "next": None})

    assert list(scripted(handler).pages(limit=1)) == [[{"key": first}], [{"key": second}]]
    assert asked == ["limit=1", f"limit=1&after={first}"]


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2024-05-01", datetime(2024, 5, 1, tzinfo=timezone.utc)),
        ("2024-05-01T12:30:00", datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc)),
        ("2024-05-01T12:30:00Z", datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc)),
        ("2024-05-01T14:30:00+02:00", datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc)),
    ],
)
def test_since_dates(text: str, moment: datetime) -> None:
    assert parse_since(text) == moment.timestamp()


def test_filters_compare_created_at_and_versions() -> None:
    entry = {"created_at": 100.0, "components": {"compiler_version": "2.20.1.0+aa"}}
    assert Filters(since=100.0).keep(entry)
    assert not Filters(since=100.5).keep(entry)
    assert Filters(compiler_version="2.20.1.0").keep(entry)
    assert not Filters(compiler_version="2.20.1").keep(entry)
    assert not Filters(compiler_version="2.20.1.0+bb").keep(entry)


def test_import_manifest_has_the_client_shape(tmp_path: Path) -> None:
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a", extra={"wrapped_neff.hlo": b"wrapped"})
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(404, json={"detail": "absent"})
        if request.url.path == "/v1/blobs/missing":
            return httpx.Response(200, json={"missing": []})
        sent.append(json.loads(request.content))
        return httpx.Response(201)

    import_cache(
        DirectorySource(cache.root),
        scripted(handler),
        target=None,
        progress=Progress("", io.StringIO()),
    )
    (manifest,) = sent
    # stock_era: the layout the entry came from, so an export writes it back alike.
    assert sorted(manifest) == [
        "components",
        "direct_key",
        "files",
        "key",
        "neuron_address",
        "stock_era",
    ]
    assert manifest["stock_era"] == "target"
    assert manifest["neuron_address"] == placed.address
    assert sorted(manifest["files"]) == sorted(placed.artifacts)


# --- listings of another shape ---------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"entries": []},
        [],
        {"entries": [1], "next": None},
        {"entries": {"a": 1}, "next": None},
        {"entries": [], "next": "not a key"},
    ],
)
def test_a_listing_of_another_shape_is_a_one_line_error(body: Any) -> None:
    remote = scripted(lambda request: httpx.Response(200, json=body))
    with pytest.raises(Unusable, match="answered the entry listing with") as raised:
        list(remote.pages())
    assert "\n" not in str(raised.value)


def test_a_listing_whose_next_does_not_move_on_ends() -> None:
    asked: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.params.get("after"))
        if len(asked) > 5:
            raise AssertionError("asked for the same page again and again")
        return httpx.Response(200, json={"entries": [], "next": "a" * 64})

    with pytest.raises(Unusable, match=f"next key '{'a' * 64}' that does not follow"):
        list(scripted(handler).pages())
    assert asked == [None, "a" * 64]


def test_a_blob_longer_than_its_size_is_cut_off_not_written(tmp_path: Path) -> None:
    sent = 0

    def endless() -> Any:
        nonlocal sent
        for _ in range(64):
            sent += 1 << 16
            yield b"x" * (1 << 16)

    remote = scripted(lambda request: httpx.Response(200, content=endless()))
    with pytest.raises(Refused, match="more than the 10 bytes expected"):
        remote.fetch_blob("a" * 64, 10, tmp_path / "blob")
    assert (tmp_path / "blob").stat().st_size <= 10
    assert sent < 64 << 16  # it stopped reading too


def test_a_symlink_planted_after_the_listing_is_not_read(tmp_path: Path) -> None:
    # The listing saw a regular file; a symlink swapped in before the import opens it
    # is refused on what was opened.
    secret = tmp_path / "secret"
    secret.write_bytes(b"private")
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a")
    source = DirectorySource(cache.root)
    (entry,) = source.entries()
    assert entry.problem is None
    neff = cache.root / placed.address / "model.neff"
    neff.unlink()
    neff.symlink_to(secret)
    with pytest.raises(ReadError, match="outside"):
        source.open_file(entry, "model.neff", tmp_path)
    followed = DirectorySource(cache.root, follow_symlinks=True)
    with followed.open_file(entry, "model.neff", tmp_path) as f:
        assert f.read() == b"private"


def test_symlinks_that_stay_in_the_source_are_read(tmp_path: Path) -> None:
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a")
    shared = cache.root / "shared.neff"  # a deduplicated blob kept in the cache
    neff = cache.root / placed.address / "model.neff"
    neff.rename(shared)
    neff.symlink_to(Path("..") / ".." / "shared.neff")
    source = DirectorySource(cache.root)
    (entry,) = source.entries()
    assert entry.problem is None
    assert entry.sizes["model.neff"] == len(placed.files["model.neff"])
    with source.open_file(entry, "model.neff", tmp_path) as f:
        assert f.read() == placed.files["model.neff"]


@pytest.mark.parametrize("index", range(4))
def test_the_importer_keys_an_entry_as_the_client_hook_does(tmp_path: Path, index: int) -> None:
    # The client's persistent-cache hook keys the same folder (proxy.Core._keys) when
    # the SDK asks for it: the import is found only if both agree.
    from neffcache.client.config import ClientConfig
    from neffcache.client.proxy import Core

    cache = standard_cache(tmp_path / "cache")
    placed = cache.successes()[index]
    source = DirectorySource(cache.root)
    entry = next(e for e in source.entries() if e.address == placed.address)
    keyed = key_entry(source, entry, None, tmp_path)
    env = {
        "NEFFCACHE_URL": "neffcache+http://127.0.0.1:9/team-a",
        "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
    }
    config = ClientConfig.from_env(env)
    assert config is not None
    core = Core(SimpleNamespace(cache_path=str(cache.root)), config)
    try:
        found = core._keys(cache.root / placed.address, placed.address, environ={})
    finally:
        core.remote.close()
    assert found is not None
    direct, canonical = found
    assert keyed.address == placed.address
    assert keyed.direct.key == direct.key
    assert keyed.canonical.key == canonical().key
    assert keyed.canonical.as_json() == canonical().as_json()
