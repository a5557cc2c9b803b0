"""Reads during writes and during eviction, against a real
``neffcache serve`` with no blob grace (``NEFFCACHE_BLOB_GRACE_SECONDS=0``: a blob no
entry references goes at the next pass) and passes run by the test through the admin
API (``POST /v1/admin/evict``, ``POST /v1/admin/expire``), over the filesystem store
and over moto's S3 server.

Nothing lost, for every read: the answer is a miss (``404``) or the complete blob,
every byte right: a ``200`` whose body has exactly ``Content-Length`` bytes, that many
being the blob's size, and hashes to the digest asked for; a ``206`` whose
``Content-Range`` is the range asked for and whose body is exactly those bytes of the
blob. Never a body cut off before its ``Content-Length`` (read to the end or over a raw
socket, so a short body is seen, not hidden by a client), never a wrong byte, and no
sound blob ever taken for a corrupt one (quarantined) because it changed under a read.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults.support import Server, digest, running_server_with

pytestmark = pytest.mark.e2e

VERSION = "2.20.9961.0+0acef03a"
NAMESPACE = "churn"
STREAMED = 18 * 2**20  # over the server's 16 MiB verify-first size: hashed as it streams
SETTINGS = {
    "blob_grace_seconds": "0",  # unreferenced blobs go at once
    "eviction_interval_seconds": "0",  # passes only when the test asks
}


@dataclass
class Tally:
    """What the readers saw; ``wrong`` lists every broken promise."""

    answers: dict[str, int] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self.lock:
            self.answers[what] = self.answers.get(what, 0) + 1

    def fail(self, what: str) -> None:
        with self.lock:
            self.wrong.append(what)


# --- readers: each returns nothing, and tells the tally what it saw


def streamed(
    response: httpx.Response, expected: int, what: str, tally: Tally
) -> tuple[int, bytearray] | None:
    """The announced length and the bytes of an answer read to its end; None (counted)
    for a 404, and for another status or a stream cut off (a failure)."""
    if response.status_code == 404:
        response.read()
        tally.count("404")
        return None
    if response.status_code != expected:
        tally.fail(f"{what}: {response.status_code}")
        return None
    announced = int(response.headers["content-length"])
    body = bytearray()
    try:
        for chunk in response.iter_raw():
            body += chunk
    except httpx.HTTPError as exc:
        tally.fail(f"{what} cut off at {len(body)} of {announced} bytes: {exc!r}")
        return None
    return announced, body


def read_whole(client: httpx.Client, blob: bytes, tally: Tally) -> None:
    name = digest(blob)
    with client.stream("GET", f"/v1/blobs/{name}") as response:
        received = streamed(response, 200, f"GET {name[:12]}", tally)
        if received is None:
            return
        announced, body = received
    if announced != len(blob) or len(body) != announced or digest(bytes(body)) != name:
        tally.fail(f"GET {name[:12]}: {len(body)} of {announced} bytes, wrong bytes")
        return
    tally.count("200")


def read_range(client: httpx.Client, blob: bytes, tally: Tally, rng: random.Random) -> None:
    name, size = digest(blob), len(blob)
    if rng.random() < 0.25:  # a suffix: the last n bytes
        n = rng.randrange(1, size + 1)
        asked, start, end = f"bytes=-{n}", size - n, size
    else:
        start = rng.randrange(size)
        end = rng.randrange(start + 1, size + 1)
        asked = f"bytes={start}-{end - 1}"
    with client.stream("GET", f"/v1/blobs/{name}", headers={"Range": asked}) as response:
        received = streamed(response, 206, f"GET {name[:12]} {asked}", tally)
        if received is None:
            return
        _, body = received
        content_range = response.headers.get("content-range")
    if content_range != f"bytes {start}-{end - 1}/{size}" or bytes(body) != blob[start:end]:
        tally.fail(f"GET {name[:12]} {asked}: {content_range}, {len(body)} bytes, not the range")
        return
    tally.count("206")


def read_slowly(port: int, blob: bytes, tally: Tally) -> None:
    """A whole GET read over a raw socket in small pieces with pauses: the server's
    stream stays open for a while, and a short body is seen as such."""
    name = digest(blob)
    request = f"GET /v1/blobs/{name} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(request.encode())
        status, announced, body = read_response(sock, pause=0.001)
    if status == 404:
        tally.count("404")
        return
    if status != 200 or announced is None:
        tally.fail(f"slow GET {name[:12]}: {status}")
        return
    if len(body) != announced:
        tally.fail(f"slow GET {name[:12]} cut off at {len(body)} of {announced} bytes")
    elif announced != len(blob) or digest(body) != name:
        tally.fail(f"slow GET {name[:12]}: wrong bytes")
    else:
        tally.count("200 slow")


def read_response(sock: socket.socket, pause: float = 0.0) -> tuple[int, int | None, bytes]:
    """Status, Content-Length and body of an answer on ``sock`` (``Connection: close``),
    read in 16 KiB pieces with ``pause`` seconds between them; the body is what came
    before the server closed, however short."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(16 * 1024)
        if not chunk:
            return 0, None, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    received = bytearray(body)
    try:
        while length is None or len(received) < length:
            chunk = sock.recv(16 * 1024)
            if not chunk:
                break
            received += chunk
            if pause:
                time.sleep(pause)
    except ConnectionResetError:
        pass
    return status, length, bytes(received)


# --- the churn: writers, eviction and readers together


def manifest_for(key: str, files: dict[str, bytes]) -> dict[str, Any]:
    return {
        "key": key,
        "components": {"compiler_version": VERSION, "target": "trn2", "flags": [], "env": {}},
        "files": {
            name: {"digest": digest(data), "size": len(data)} for name, data in files.items()
        },
    }


def churn(server: Server, pool: list[bytes], seconds: float, readers: int) -> Tally:
    """Writers upload blobs of ``pool`` and publish entries of them, an evictor
    expires every entry and runs passes (collecting the blobs), and ``readers``
    threads read the pool's blobs whole, by ranges and slowly, for ``seconds``."""
    tally = Tally()
    stop = threading.Event()
    passes = {"collected": 0}
    errors: list[BaseException] = []

    def guarded(work: Any) -> Any:
        def run(*args: Any) -> None:
            try:
                with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
                    work(client, *args)
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        return run

    @guarded
    def write(client: httpx.Client, seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            files = {f"f{i}.bin": blob for i, blob in enumerate(rng.sample(pool, 2))}
            for data in files.values():
                put = client.put(f"/v1/blobs/{digest(data)}", content=data)
                assert put.status_code in (200, 201), put.text
            key = os.urandom(32).hex()
            entry = client.put(f"/v1/ns/{NAMESPACE}/entries/{key}", json=manifest_for(key, files))
            # 400 missing: a blob was collected between its upload and the publish.
            assert entry.status_code in (201, 400), entry.text
            stop.wait(0.05)

    @guarded
    def evict(client: httpx.Client) -> None:
        while not stop.is_set():
            expired = client.post("/v1/admin/expire", json={"compiler_version": VERSION})
            assert expired.status_code == 200, expired.text
            done = client.post("/v1/admin/evict", json={"dry_run": False})
            assert done.status_code == 200, done.text
            passes["collected"] += done.json()["blobs_collected"]
            stop.wait(0.1)

    @guarded
    def read(client: httpx.Client, seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            blob = rng.choice(pool)
            kind = rng.random()
            if kind < 0.4:
                read_whole(client, blob, tally)
            elif kind < 0.8:
                read_range(client, blob, tally, rng)
            else:
                read_slowly(server.port, blob, tally)

    threads = [threading.Thread(target=write, args=(seed,)) for seed in range(2)]
    threads.append(threading.Thread(target=evict))
    threads += [threading.Thread(target=read, args=(100 + seed,)) for seed in range(readers)]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a worker hung"
    if errors:
        raise errors[0]
    assert passes["collected"] > 0, "no blob was collected: the reads raced nothing"
    # No blob was ever corrupt: a read that found one so (a short or mixed read of a
    # blob collected under it) would have quarantined a sound blob.
    assert server.http.get("/healthz").status_code == 200  # the log is written by now
    assert "failed verification" not in server.log.read_text()
    return tally


def make_pool(streamed: bool) -> list[bytes]:
    sizes = [96 * 1024, 96 * 1024, 1 << 20, 3 << 20, 3 << 20]
    if streamed:
        sizes.append(STREAMED)
    return [os.urandom(size) for size in sizes]


def assert_all_reads_sound(tally: Tally) -> None:
    assert tally.wrong == [], f"{len(tally.wrong)} broken reads, first: {tally.wrong[:5]}"
    for kind in ("200", "206", "200 slow"):
        assert tally.answers.get(kind, 0) > 0, f"no complete {kind} read: {tally.answers}"


@pytest.fixture(scope="module")
def fs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("reads-fs") / "data"
    with running_server_with(data, **SETTINGS) as running:
        yield running


def test_reads_during_writes_and_eviction_on_the_filesystem_store(fs_server: Server) -> None:
    """Nothing lost (module docstring): for 12 s, 2 writers, an evictor (expire all,
    then a pass that collects every unreferenced blob) and 4 readers (whole, ranges,
    slow raw sockets) over blobs from 96 KiB to 18 MiB (hashed as it streams); blobs
    older than 2 s are also served unhashed (verified once, then trusted by their
    file's stamp): every read is a 404 or complete and right."""
    tally = churn(fs_server, make_pool(streamed=True), seconds=12, readers=4)
    assert_all_reads_sound(tally)
    assert fs_server.wait_until_unstaged() == []


def test_reads_during_writes_and_eviction_on_s3(tmp_path: Path, s3_bucket: str) -> None:
    """Nothing lost (module docstring), over moto's S3 (every read hashed): for 8 s, 2
    writers, the evictor and 3 readers; every read is a 404 or complete and right."""
    settings = {**SETTINGS, "blob_url": s3_bucket}
    with running_server_with(tmp_path / "data", **settings) as server:
        tally = churn(server, make_pool(streamed=False), seconds=8, readers=3)
    assert_all_reads_sound(tally)


def test_a_blob_collected_and_uploaded_again_during_a_trusted_read_is_not_cut_off(
    fs_server: Server,
) -> None:
    """Nothing lost: a download of a blob the server trusts (verified on an earlier
    read, its file unchanged since) completes with every byte right even when,
    while it streams, the blob is collected (no entry references it) and uploaded
    again, which makes a new file under its name. The bytes sent are the old file's,
    which was verified and never changed: there is nothing to cut off."""
    blob = os.urandom(STREAMED + (1 << 20))
    name = digest(blob)
    assert fs_server.http.put(f"/v1/blobs/{name}", content=blob).status_code == 201
    time.sleep(2.2)  # older than the memo's racy window: its verified read is remembered
    first = fs_server.http.get(f"/v1/blobs/{name}")
    assert first.status_code == 200
    assert first.content == blob

    request = f"GET /v1/blobs/{name} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", fs_server.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(request.encode())
        head = sock.recv(64 * 1024)  # the answer has begun; the rest waits in the server
        assert head.startswith(b"HTTP/1.1 200 "), head[:100]

        collected = fs_server.http.post("/v1/admin/evict", json={"dry_run": False})
        assert collected.status_code == 200
        assert fs_server.http.head(f"/v1/blobs/{name}").status_code == 404, "not collected"
        assert fs_server.http.put(f"/v1/blobs/{name}", content=blob).status_code == 201

        status, announced, body = read_response_after(sock, head)
    assert status == 200
    assert announced == len(blob)
    assert len(body) == announced, f"cut off at {len(body)} of {announced} bytes"
    assert body == blob


def read_response_after(sock: socket.socket, start: bytes) -> tuple[int, int | None, bytes]:
    """``read_response`` for an answer whose first bytes were already read."""
    rest = bytearray(start)
    try:
        while chunk := sock.recv(1 << 20):
            rest += chunk
    except ConnectionResetError:
        pass
    head, _, body = bytes(rest).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        (
            int(v)
            for n, _, v in (line.partition(":") for line in lines[1:])
            if n.lower() == "content-length"
        ),
        None,
    )
    return int(lines[0].split()[1]), length, body
