"""Concurrent publishes of one key against a real
``neffcache serve`` (filesystem blobs), once over its SQLite index and once over a real
``redis-server`` (``NEFFCACHE_INDEX_URL``), each writer and reader a thread with its own
HTTP connection, released together by a barrier.

Nothing lost: 100 identical publishes (the blobs, then the manifest) all succeed, one
``201`` for each blob and for the entry, ``200`` for every other, and leave exactly one
entry that reads back with its blobs byte-identical. Of concurrent publishes of
different manifests for one key exactly one is ``201`` and every other ``409``, and
every read (by key and by alias) made during and after the race sees either a miss
(only before its first hit) or the winner's manifest, never a loser's or a mix.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from faults.support import Server, digest, running_server, running_server_with
from support.backends import backends

pytestmark = pytest.mark.e2e

IDENTICAL = 100  # publishers of one manifest
DIFFERENT = 40  # publishers of one key, each with its own manifest
READERS = 8
VERSION = "2.20.9961.0+0acef03a"


@pytest.fixture(scope="module", params=backends("sqlite", "redis"))
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    data = tmp_path_factory.mktemp(f"publishes-{request.param}") / "data"
    if request.param == "sqlite":
        with running_server(data) as running:
            yield running
    else:
        url = request.getfixturevalue("redis_server")
        with running_server_with(data, index_url=url) as running:
            yield running


def fresh_namespace() -> str:
    # The Redis server is shared by the session: each test writes its own namespace.
    return f"race-{uuid.uuid4().hex[:12]}"


def manifest_for(key: str, files: dict[str, bytes], **extra: Any) -> dict[str, Any]:
    return {
        "key": key,
        "direct_key": digest(key.encode()),
        "components": {"compiler_version": VERSION, "target": "trn2", "flags": [], "env": {}},
        "files": {
            name: {"digest": digest(data), "size": len(data)} for name, data in files.items()
        },
        **extra,
    }


def in_threads(url: str, count: int, job: Callable[[httpx.Client, int], Any]) -> list[Any]:
    """``job(client, i)`` for i in range(count), each in its own thread with its own
    connection, all started together; their results in order (an exception fails)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int, url: str) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
                client.get("/healthz")  # connected before the race starts
                barrier.wait(timeout=60)
                results[i] = job(client, i)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i, url)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a publisher hung"
    if errors:
        raise errors[0]
    return results


def stamps_removed(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ("created_at", "namespace", "writer")}


def test_identical_concurrent_publishes_all_succeed(server: Server) -> None:
    """Nothing lost: 100 concurrent publishes of one manifest (its two blobs, then the
    entry) all succeed: per blob one ``201`` and 99 ``200``, for the entry one ``201``
    and 99 ``200``; one entry exists (by key, by alias and in the listing) whose
    blobs read back byte-identical."""
    namespace = fresh_namespace()
    files = {"model.neff": os.urandom(1 << 20), "model.hlo_module.pb": os.urandom(64 * 1024)}
    key = os.urandom(32).hex()
    manifest = manifest_for(key, files, compile_seconds=12.5)

    def publish(client: httpx.Client, _: int) -> tuple[list[int], int]:
        blob_answers = [
            client.put(f"/v1/blobs/{digest(data)}", content=data).status_code
            for data in files.values()
        ]
        entry = client.put(f"/v1/ns/{namespace}/entries/{key}", json=manifest)
        return blob_answers, entry.status_code

    answers = in_threads(server.url, IDENTICAL, publish)
    for position in range(len(files)):
        blob_answers = sorted(a[0][position] for a in answers)
        assert blob_answers == [200] * (IDENTICAL - 1) + [201]
    assert sorted(a[1] for a in answers) == [200] * (IDENTICAL - 1) + [201]

    http = server.http
    for path in (
        f"/v1/ns/{namespace}/entries/{key}",
        f"/v1/ns/{namespace}/aliases/{manifest['direct_key']}",
    ):
        got = http.get(path)
        assert got.status_code == 200
        assert stamps_removed(got.json()) == manifest
    listing = http.get(f"/v1/ns/{namespace}/entries", params={"limit": 10}).json()
    assert [e["key"] for e in listing["entries"]] == [key]
    for data in files.values():
        assert http.get(f"/v1/blobs/{digest(data)}").content == data


def test_different_manifests_for_one_key_one_wins_and_readers_see_only_it(
    server: Server,
) -> None:
    """Nothing lost: of 40 concurrent publishes of different manifests (each its own
    blob and ``host``) for one key, exactly one is ``201`` and the rest ``409``; 8
    readers polling the key and its alias before, during and after the race see a
    miss (only before their first hit) or the winner's manifest, every time with the
    same ``created_at``; afterwards the namespace lists one entry, the winner's, and
    its blob reads back byte-identical."""
    namespace = fresh_namespace()
    key = os.urandom(32).hex()
    blobs = [os.urandom(32 * 1024) for _ in range(DIFFERENT)]
    manifests = [
        manifest_for(key, {"model.neff": blob}, host=f"writer-{i}", compile_seconds=float(i))
        for i, blob in enumerate(blobs)
    ]
    alias = manifests[0]["direct_key"]
    for blob in blobs:  # uploaded beforehand: the race is the entry's alone
        assert server.http.put(f"/v1/blobs/{digest(blob)}", content=blob).status_code == 201

    done = threading.Event()
    reads: list[list[tuple[int, str]]] = [[] for _ in range(READERS)]

    def read(client: httpx.Client, i: int) -> None:
        # Until the writers are done, then a few more rounds.
        paths = [f"/v1/ns/{namespace}/entries/{key}", f"/v1/ns/{namespace}/aliases/{alias}"]
        rounds_after = 20
        give_up = time.monotonic() + 60  # a bound, should the writers never end
        while rounds_after and time.monotonic() < give_up:
            if done.is_set():
                rounds_after -= 1
            got = client.get(paths[len(reads[i]) % 2])
            reads[i].append((got.status_code, got.text))

    writing = [DIFFERENT]
    lock = threading.Lock()

    def write(client: httpx.Client, i: int) -> int:
        try:
            return client.put(f"/v1/ns/{namespace}/entries/{key}", json=manifests[i]).status_code
        finally:
            with lock:
                writing[0] -= 1
                if not writing[0]:
                    done.set()

    def job(client: httpx.Client, i: int) -> int | None:
        if i < READERS:
            read(client, i)
            return None
        return write(client, i - READERS)

    results = in_threads(server.url, READERS + DIFFERENT, job)
    statuses = results[READERS:]
    assert sorted(statuses) == [201] + [409] * (DIFFERENT - 1)
    winner = manifests[statuses.index(201)]

    created: set[float] = set()
    for seen in reads:
        assert seen, "a reader read nothing"
        codes = [status for status, _ in seen]
        first_hit = codes.index(200) if 200 in codes else len(codes)
        assert set(codes[:first_hit]) <= {404}
        assert set(codes[first_hit:]) == {200}, "a reader saw the entry, then a miss"
        for _, body in seen[first_hit:]:
            entry = json.loads(body)
            assert stamps_removed(entry) == winner, "a reader saw another writer's manifest"
            created.add(entry["created_at"])
    assert len(created) == 1, "readers saw more than one stored entry"

    http = server.http
    assert stamps_removed(http.get(f"/v1/ns/{namespace}/entries/{key}").json()) == winner
    listing = http.get(f"/v1/ns/{namespace}/entries", params={"limit": 10}).json()
    assert [stamps_removed(e) for e in listing["entries"]] == [winner]
    won = blobs[manifests.index(winner)]
    assert http.get(f"/v1/blobs/{digest(won)}").content == won
