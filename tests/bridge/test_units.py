"""The bridge's pieces on their own: entry states, the publish sequence against a
scripted server (httpx.MockTransport), blob verification, dates and server URLs."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
from bridge.layout import StockCache

from neffcache.server.bridge.cli import resolve_server
from neffcache.server.bridge.exporter import Filters, parse_since
from neffcache.server.bridge.importer import import_cache, publish
from neffcache.server.bridge.remote import Refused, Remote, Unusable
from neffcache.server.bridge.report import Progress
from neffcache.server.bridge.stock import DirectorySource, State, classify, is_artifact

Handler = Callable[[httpx.Request], httpx.Response]


def scripted(handler: Handler) -> Remote:
    return Remote("http://cache.test", "team-a", None, transport=httpx.MockTransport(handler))


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
    (tmp_path / "cache" / "0_REGISTRY").mkdir()  # optimum-neuron's registry
    (tmp_path / "cache" / "neuronxcc-2.21.1.0+abcdef12" / ".MODULE_1+00000000.ab.partial").mkdir()
    entries = DirectorySource(cache.root).entries()
    assert [e.address for e in entries] == sorted(p.address for p in cache.placed)
    assert entries[0].sizes["model.done"] == 0


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
    assert publish(scripted(handler), manifest, {digest: path}) == ("imported", None)
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


def test_a_server_without_listing_is_unusable_for_export() -> None:
    remote = scripted(lambda request: httpx.Response(405, json={"detail": "Method Not Allowed"}))
    with pytest.raises(Unusable, match="cannot list entries"):
        next(remote.pages())


def test_listing_follows_next_until_null() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url.params))
        after = request.url.params.get("after")
        if after is None:
            return httpx.Response(200, json={"entries": [{"key": "1"}], "next": "1"})
        return httpx.Response(200, json={"entries": [{"key": "2"}], "next": None})

    assert list(scripted(handler).pages(limit=1)) == [[{"key": "1"}], [{"key": "2"}]]
    assert asked == ["limit=1", "limit=1&after=1"]


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


@pytest.mark.parametrize(
    ("server", "namespace", "env", "expected"),
    [
        (None, "a", {}, ("http://127.0.0.1:8787", "a")),
        ("https://cache.internal/", "a", {}, ("https://cache.internal", "a")),
        (None, None, {"NEFFCACHE_URL": "neffcache+http://h:1/team-b"}, ("http://h:1", "team-b")),
        ("neffcache+https://h:1/team-b/", "c", {}, ("https://h:1", "c")),
        (None, "a", {"NEFFCACHE_URL": "http://h:2"}, ("http://h:2", "a")),
    ],
)
def test_server_and_namespace(
    server: str | None, namespace: str | None, env: dict[str, str], expected: tuple[str, str]
) -> None:
    assert resolve_server(server, namespace, env) == expected


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
    assert sorted(manifest) == ["components", "direct_key", "files", "key", "neuron_address"]
    assert manifest["neuron_address"] == placed.address
    assert sorted(manifest["files"]) == sorted(placed.artifacts)
