"""Unit tests for ``neffcache.client.publish``: the manifest of a compiled graph,
``publish`` against a real ``neffcache serve``, and the bounded background
``Publisher``."""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback import free_port
from support.client_units import Clock, delta, digest, no_server_down
from support.e2e import Server

from neffcache.client import publish as publish_module
from neffcache.client.config import ClientConfig
from neffcache.client.http import Response
from neffcache.client.keys import canonical_key, context, direct_key
from neffcache.client.publish import Publisher, make_manifest, publish
from neffcache.client.remote import Remote
from neffcache.client.stats import STATS
from neffcache.keying import CacheKey

REPO = Path(__file__).resolve().parents[2]
NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]
HLO_FIXTURE = REPO / "tests" / "fixtures" / "hlo" / "block_a.pb"
VERSION = "2.20.9961.0+0acef03a"
ADDRESS = f"neuronxcc-{VERSION}/MODULE_77+abcdef01"


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    no_server_down(monkeypatch)


@pytest.fixture
def server_url(server: Server) -> str:
    """The session's ``neffcache serve`` (tests/client/conftest.py)."""
    return server.url


@pytest.fixture
def remote(server_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Remote]:
    namespace = "ns-" + digest(request.node.nodeid.encode())[:12]
    config = ClientConfig.from_env(
        {
            "NEFFCACHE_URL": f"neffcache+{server_url}/{namespace}",
            "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
        }
    )
    assert config is not None
    client = Remote(config)
    yield client
    client.close()


@pytest.fixture(scope="module")
def keys() -> tuple[CacheKey, CacheKey]:
    module = HLO_FIXTURE.read_bytes()
    ctx = context(VERSION, "trn1", ["--model-type=transformer"], {})
    return canonical_key(module, ctx), direct_key(module, ctx)


def entry_files(tmp_path: Path, neff: bytes) -> dict[str, Path]:
    directory = tmp_path / "entry"
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "model.neff": neff,
        "model.hlo_module.pb": HLO_FIXTURE.read_bytes(),
        "compile_flags.json": b'["--target=trn1", "--model-type=transformer"]',
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return {name: directory / name for name in files}


# --- make_manifest --------------------------------------------------------------------


def test_make_manifest(keys: tuple[CacheKey, CacheKey], tmp_path: Path) -> None:
    canonical, direct = keys
    neff = os.urandom(10_000)
    files = entry_files(tmp_path, neff)
    manifest, paths = make_manifest(canonical, direct, ADDRESS, files, 12.34567)
    assert manifest["key"] == canonical.key
    assert manifest["direct_key"] == direct.key
    assert manifest["neuron_address"] == ADDRESS
    assert manifest["components"] == canonical.as_json()
    assert manifest["compile_seconds"] == 12.346
    assert manifest["host"] == socket.gethostname()
    assert manifest["files"]["model.neff"] == {"digest": digest(neff), "size": len(neff)}
    assert set(manifest["files"]) == set(files)
    for name, ref in manifest["files"].items():
        assert paths[ref["digest"]] == files[name]
        assert ref["size"] == files[name].stat().st_size


def test_make_manifest_without_optional_fields(
    keys: tuple[CacheKey, CacheKey], tmp_path: Path
) -> None:
    canonical, _ = keys
    files = {"model.neff": entry_files(tmp_path, b"neff")["model.neff"]}
    manifest, paths = make_manifest(canonical, None, None, files, None)
    assert not {"direct_key", "neuron_address", "compile_seconds"} & set(manifest)
    assert list(paths) == [digest(b"neff")]


# --- publish --------------------------------------------------------------------------


@pytest.mark.e2e
def test_publish_uploads_what_is_missing_then_the_entry(
    remote: Remote, keys: tuple[CacheKey, CacheKey], tmp_path: Path
) -> None:
    canonical, direct = keys
    neff = os.urandom(20_000)
    manifest, paths = make_manifest(canonical, direct, ADDRESS, entry_files(tmp_path, neff), 1.0)
    assert digest(neff) in (remote.missing(sorted(paths)) or [])
    before = STATS.snapshot()
    assert publish(remote, manifest, paths)
    assert delta(before, "publishes") == 1
    assert remote.missing(sorted(paths)) == []
    for found in (remote.entry(canonical.key), remote.alias(direct.key), remote.alias(ADDRESS)):
        assert found is not None
        assert found["files"] == manifest["files"]
    dest = tmp_path / "fetched"
    assert remote.fetch(digest(neff), len(neff), dest)
    assert dest.read_bytes() == neff


@pytest.mark.e2e
def test_only_missing_blobs_are_uploaded(
    remote: Remote,
    keys: tuple[CacheKey, CacheKey],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    canonical, direct = keys
    manifest, paths = make_manifest(
        canonical, direct, None, entry_files(tmp_path, os.urandom(5000)), None
    )
    uploaded: list[str] = []
    real_put = Remote.put_blob

    def counting(self: Remote, blob: str, path: Path) -> bool:
        uploaded.append(blob)
        return real_put(self, blob, path)

    monkeypatch.setattr(Remote, "put_blob", counting)
    assert publish(remote, manifest, paths)
    # Blobs belong to no namespace: the HLO may be there already from another test.
    assert manifest["files"]["model.neff"]["digest"] in uploaded
    first = len(uploaded)
    assert publish(remote, manifest, paths)  # identical again: 200, nothing uploaded
    assert len(uploaded) == first


@pytest.mark.e2e
def test_a_different_manifest_for_a_published_key_is_a_counted_conflict(
    remote: Remote, keys: tuple[CacheKey, CacheKey], tmp_path: Path
) -> None:
    canonical, direct = keys
    first, first_paths = make_manifest(
        canonical, direct, ADDRESS, entry_files(tmp_path / "a", os.urandom(3000)), 1.0
    )
    second, second_paths = make_manifest(
        canonical, direct, ADDRESS, entry_files(tmp_path / "b", os.urandom(3000)), 2.0
    )
    assert publish(remote, first, first_paths)
    before = STATS.snapshot()
    assert publish(remote, second, second_paths)
    assert delta(before, "publish_conflicts") == 1
    assert delta(before, "publish_failures") == 0
    found = remote.entry(canonical.key)
    assert found is not None
    assert found["files"] == first["files"]  # entries are immutable: the first serves


def test_publish_with_the_server_down_is_false_and_quick(
    keys: tuple[CacheKey, CacheKey], tmp_path: Path
) -> None:
    canonical, direct = keys
    config = ClientConfig.from_env(
        {
            "NEFFCACHE_URL": f"neffcache+http://127.0.0.1:{free_port()}/team-a",
            "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
            # A minute each: waiting one out would take that long, a refusal a
            # millisecond (the bound below is only far from both).
            "NEFFCACHE_CONNECT_TIMEOUT": "60",
            "NEFFCACHE_TIMEOUT": "60",
        }
    )
    assert config is not None
    manifest, paths = make_manifest(canonical, direct, None, entry_files(tmp_path, b"neff"), None)
    client = Remote(config)
    start = time.monotonic()
    assert not publish(client, manifest, paths)
    assert time.monotonic() - start < 30
    client.close()


class StubRemote:
    """The three calls publish makes, scripted."""

    def __init__(self, entry_answers: list[Response | None]) -> None:
        self.entry_answers = entry_answers
        self.missing_calls = 0
        self.blobs: list[str] = []

    def missing(self, digests: list[str]) -> list[str] | None:
        self.missing_calls += 1
        return list(digests)

    def put_blob(self, blob: str, path: Path) -> bool:
        self.blobs.append(blob)
        return True

    def put_entry(self, key: str, manifest: dict[str, Any]) -> Response | None:
        return self.entry_answers.pop(0)


def _stub_manifest(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    path = tmp_path / "neff"
    path.write_bytes(b"neff")
    return {"key": "a" * 64}, {digest(b"neff"): path}


def test_a_blob_vanishing_before_the_manifest_is_retried_once(tmp_path: Path) -> None:
    manifest, paths = _stub_manifest(tmp_path)
    stub = StubRemote(
        [
            Response(400, {}, b'{"detail": "blobs missing", "missing": ["x"]}'),
            Response(201, {}, b""),
        ]
    )
    assert publish(stub, manifest, paths)  # type: ignore[arg-type]
    assert stub.missing_calls == 2
    assert len(stub.blobs) == 2


def test_a_blob_the_server_names_is_uploaded_though_a_probe_finds_it(tmp_path: Path) -> None:
    # A blob being collected still answers present to a probe; the publish's answer
    # names it (the server took the entry back), and the retry uploads it anyway.
    manifest, paths = _stub_manifest(tmp_path)
    (blob,) = paths

    class Collecting(StubRemote):
        def missing(self, digests: list[str]) -> list[str] | None:
            self.missing_calls += 1
            return []

    stub = Collecting(
        [
            Response(400, {}, json.dumps({"detail": "missing", "missing": [blob]}).encode()),
            Response(201, {}, b""),
        ]
    )
    assert publish(stub, manifest, paths)  # type: ignore[arg-type]
    assert stub.blobs == [blob]


def test_a_refused_manifest_is_a_counted_failure(tmp_path: Path) -> None:
    manifest, paths = _stub_manifest(tmp_path)
    for answers in (
        [Response(400, {}, b'{"detail": "bad key"}')],
        [Response(403, {}, b"{}")],
        [Response(400, {}, b"missing"), Response(400, {}, b"missing")],
        [None],
    ):
        before = STATS.snapshot()
        assert not publish(StubRemote(answers), manifest, paths)  # type: ignore[arg-type]
        assert delta(before, "publish_failures") == 1


# --- Publisher ------------------------------------------------------------------------


def test_flush_waits_for_jobs() -> None:
    publisher = Publisher(wait=5)
    done: list[int] = []

    def job(i: int) -> Callable[[], None]:
        def run() -> None:
            time.sleep(0.01)
            done.append(i)

        return run

    for i in range(5):
        publisher.submit(job(i))
    assert publisher.flush()
    assert done == [0, 1, 2, 3, 4]


def test_flush_is_bounded() -> None:
    publisher = Publisher(wait=0.3)
    release = threading.Event()

    def stuck() -> None:
        release.wait(60)

    publisher.submit(stuck)
    before = STATS.snapshot()
    with pytest.MonkeyPatch.context() as patch:
        clock = Clock().install(patch, publish_module)
        try:
            assert publisher.flush() is False  # the configured wait
            assert 0.3 <= clock.now < 0.3 + 0.1
            start = clock.now
            assert publisher.flush(timeout=0.1) is False
            assert 0.1 <= clock.now - start < 0.1 + 0.1
            assert delta(before, "publishes_unflushed") == 2
        finally:
            release.set()
    assert publisher.flush(timeout=5)


def test_a_failing_job_does_not_stop_the_publisher() -> None:
    publisher = Publisher(wait=5)
    done: list[str] = []
    before = STATS.snapshot()

    def boom() -> None:
        raise RuntimeError("a publish bug")

    publisher.submit(boom)
    publisher.submit(lambda: done.append("after"))
    assert publisher.flush()
    assert done == ["after"]
    assert delta(before, "publish_failures") == 1


def test_a_full_queue_drops_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish_module, "_QUEUE_SIZE", 2)
    publisher = Publisher(wait=5)
    started, release = threading.Event(), threading.Event()

    def blocker() -> None:
        started.set()
        release.wait(10)

    publisher.submit(blocker)
    assert started.wait(5)
    before = STATS.snapshot()
    ran: list[int] = []
    for i in range(4):
        publisher.submit(functools.partial(ran.append, i))
    release.set()
    assert publisher.flush()
    assert ran == [0, 1]
    assert delta(before, "publishes_dropped") == 2
