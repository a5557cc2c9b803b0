"""The real client (``Remote.fetch_into``) against a real server (uvicorn in a thread)
whose S3 store (moto) answers big blob GETs with a redirect to a presigned URL
(``blob_redirect_seconds``).

The server's S3 endpoint is ``Front``, a loopback HTTP proxy before moto: it passes the
server's own S3 calls through and records every presigned GET (the client's redirected
download), which it answers as each test says: pass it on, send wrong bytes, stall,
redirect in a loop, redirect to a dead port, refuse. Every test's "nothing lost,
nothing wrong" criterion: a download ends (within the client's deadline) either with
exactly the blob's bytes in L1 or with nothing there at all, and the client's token
never reaches the presigned URL's host.
"""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from loopback import InThread, free_port
from support.client_units import delta, digest, no_server_down

from neffcache.client.config import ClientConfig
from neffcache.client.http import HttpError, redirect_target
from neffcache.client.local import LocalStore
from neffcache.client.remote import Remote
from neffcache.client.stats import STATS
from neffcache.server.app import create_app
from neffcache.server.blobs import BlobStore, open_blob_store
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

MIN = 1024  # the server's blob_redirect_min_bytes
BIG = 256 * 1024  # a blob the server redirects
JOIN = 60.0  # seconds a download may take before a test calls it hung (never reached)


# --- the S3 front: a recording, misbehaving proxy before moto ------------------------------


class Front:
    """``http://127.0.0.1:<port>`` forwarding to moto, except presigned GETs (a query
    with a signature), which are recorded in ``presigned`` (their headers, lower-case)
    and answered as ``mode`` says."""

    def __init__(self, moto: str) -> None:
        self.moto = urlsplit(moto)
        self.mode = "pass"
        self.presigned: list[dict[str, str]] = []
        self.release = threading.Event()  # ends every stall
        self.dead_port = free_port()
        front = self

        class Handler(BaseHTTPRequestHandler):
            # 1.1, so that botocore's "Expect: 100-continue" is answered at once.
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                query = urlsplit(self.path).query
                if "Signature=" in query:  # SigV2 Signature, SigV4 X-Amz-Signature
                    front.presigned.append({k.lower(): v for k, v in self.headers.items()})
                    self.close_connection = True  # a misbehaving answer ends it
                    front.misbehave(self)
                else:
                    front.forward(self)

            # The server's own S3 calls (with its credentials), passed through.
            def do_HEAD(self) -> None:
                front.forward(self)

            def do_PUT(self) -> None:
                front.forward(self)

            def do_POST(self) -> None:
                front.forward(self)

            def do_DELETE(self) -> None:
                front.forward(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def fetch(self, handler: BaseHTTPRequestHandler) -> tuple[int, list[tuple[str, str]], bytes]:
        """Moto's answer to the request ``handler`` holds."""
        conn = http.client.HTTPConnection(self.moto.netloc, timeout=30)
        try:
            skip = ("host", "transfer-encoding", "content-length")
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in skip}
            body = request_body(handler)
            if body is not None:
                headers["Content-Length"] = str(len(body))
            conn.request(handler.command, handler.path, body=body, headers=headers)
            answer = conn.getresponse()
            body = answer.read()
            return answer.status, answer.getheaders(), body
        finally:
            conn.close()

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        status, headers, body = self.fetch(handler)
        handler.send_response(status)
        hop = ("connection", "transfer-encoding", "keep-alive", "date", "server")
        for name, value in headers:
            if name.lower() not in hop and (name.lower() != "content-length" or not body):
                handler.send_header(name, value)
        if body:
            handler.send_header("Content-Length", str(len(body)))
        elif not any(name.lower() == "content-length" for name, _ in headers):
            handler.send_header("Content-Length", "0")
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)

    def misbehave(self, handler: BaseHTTPRequestHandler) -> None:
        mode = self.mode
        if mode == "pass":
            return self.forward(handler)
        if mode in ("loop", "relative", "dead", "ftp"):
            location = {
                "loop": handler.path,  # the same URL again, for ever
                # One hop to the same object by a relative URL, then the object.
                "relative": f"{handler.path}&hop=1",
                "dead": f"http://127.0.0.1:{self.dead_port}/bucket/key",
                "ftp": f"ftp://127.0.0.1:{self.dead_port}/bucket/key",
            }[mode]
            if mode == "relative" and "hop=1" in handler.path:
                return self.forward(handler)
            handler.send_response(307)
            handler.send_header("Location", location)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return None
        if mode in ("denied", "gone"):
            handler.send_response(403 if mode == "denied" else 404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return None
        if mode == "stall":  # accepts, reads the request, says nothing
            self.release.wait(JOIN)
            return None
        status, _, real = self.fetch(handler)
        assert status == 200
        body = {
            "garbage": real[:-1] + bytes([real[-1] ^ 1]),  # same size, one bit off
            "longer": real + b"more",
            "truncated": real[: len(real) // 2],
            "stall_body": real[: len(real) // 2],
        }[mode]
        handler.send_response(200)
        length = len(real) if mode in ("truncated", "stall_body") else len(body)
        handler.send_header("Content-Length", str(length))
        handler.end_headers()
        handler.wfile.write(body)
        handler.wfile.flush()
        if mode == "stall_body":
            self.release.wait(JOIN)
        return None


def request_body(handler: BaseHTTPRequestHandler) -> bytes | None:
    """The request's body, by Content-Length or chunked; None when it has none."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return body
            body += handler.rfile.read(size)
            handler.rfile.readline()
    length = handler.headers.get("Content-Length")
    return handler.rfile.read(int(length)) if length else None


@pytest.fixture
def front(s3_endpoint: str) -> Iterator[Front]:
    running = Front(s3_endpoint)
    yield running
    running.close()


# --- the server ---------------------------------------------------------------------------


class Cache:
    """The server (tokens on), a store that reaches moto directly (to put blobs), and
    the read token a training job has."""

    def __init__(self, url: str, direct: BlobStore, token: str, tmp: Path) -> None:
        self.url = url
        self.direct = direct
        self.token = token
        self.tmp = tmp

    def put(self, data: bytes) -> str:
        staged = self.direct.staging_dir() / f"upload-{os.urandom(6).hex()}"
        staged.write_bytes(data)
        self.direct.commit(staged, digest(data))
        return digest(data)

    def remote(self, local_dir: Path, timeout: float = 10.0) -> Remote:
        config = ClientConfig.from_env(
            {
                "NEFFCACHE_URL": f"neffcache+{self.url}/team-a",
                "NEFFCACHE_LOCAL_DIR": str(local_dir),
                "NEFFCACHE_TOKEN": self.token,
                "NEFFCACHE_TIMEOUT": str(timeout),
                "NEFFCACHE_CONNECT_TIMEOUT": "1",
            }
        )
        assert config is not None
        return Remote(config)


@pytest.fixture
def cache(
    s3_bucket: str, front: Front, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cache]:
    no_server_down(monkeypatch)
    direct = open_blob_store(s3_bucket)  # AWS_ENDPOINT_URL_S3 is moto's here
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", front.url)
    fronted = open_blob_store(s3_bucket)  # signs URLs for the front's host
    settings = ServerSettings(
        data_dir=tmp_path / "server",
        eviction_interval_seconds=0,
        blob_redirect_seconds=60,
        blob_redirect_min_bytes=MIN,
    )
    app = create_app(settings, blob_store=fronted, index=MemoryIndex())
    try:
        with InThread(app) as url:
            admin = httpx.post(
                f"{url}/v1/admin/tokens",
                json={"scope": "admin", "namespaces": ["*"]},
                trust_env=False,
            ).json()["token"]
            reader = httpx.post(
                f"{url}/v1/admin/tokens",
                json={"scope": "read", "namespaces": ["team-a"]},
                headers={"Authorization": f"Bearer {admin}"},
                trust_env=False,
            ).json()["token"]
            yield Cache(url, direct, reader, tmp_path)
    finally:
        fronted.close()
        direct.close()


def download(cache: Cache, data_digest: str, size: int, timeout: float = 10.0) -> Outcome:
    """``fetch_into`` in a thread, joined for at most ``JOIN`` seconds."""
    local_dir = cache.tmp / "l1"
    remote = cache.remote(local_dir, timeout)
    local = LocalStore(local_dir)
    result: list[str | None] = []

    def run() -> None:
        try:
            result.append(remote.fetch_into(local, data_digest, size))
        finally:
            remote.close()  # this thread's connection

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(JOIN)
    assert not thread.is_alive(), "the download did not end within its bound"
    return Outcome(result[0], remote.available(), local, local.root / "blobs")


class Outcome:
    def __init__(self, source: str | None, up: bool, local: LocalStore, blobs: Path) -> None:
        self.source = source
        self.up = up  # the server not marked down after it
        self.local = local
        self.files = sorted(p.name for p in blobs.rglob("*") if p.is_file())


def no_token_sent(front: Front, cache: Cache) -> None:
    for headers in front.presigned:
        assert "authorization" not in headers
        assert cache.token not in repr(headers)


# --- tests -------------------------------------------------------------------------------


def test_a_hit_downloads_through_the_redirect_without_the_token(cache: Cache, front: Front) -> None:
    """Nothing lost: a big blob arrives whole and right in L1, fetched from the
    presigned URL (once), which got no Authorization header; a small one comes from
    the server itself."""
    data = os.urandom(BIG)
    found = download(cache, cache.put(data), len(data))
    assert found.source == "server"
    assert found.local.blob_path(digest(data)).read_bytes() == data
    assert found.files == [digest(data)]
    assert len(front.presigned) == 1
    assert front.presigned[0]["host"] == urlsplit(front.url).netloc
    no_token_sent(front, cache)
    small = os.urandom(MIN - 1)
    assert download(cache, cache.put(small), len(small)).source == "server"
    assert len(front.presigned) == 1


def test_a_relative_second_hop_is_followed(cache: Cache, front: Front) -> None:
    """Nothing lost: a redirect at the store to a relative URL is resolved against the
    presigned URL and followed, still without the token; the bytes are right."""
    front.mode = "relative"
    data = os.urandom(BIG)
    found = download(cache, cache.put(data), len(data))
    assert found.source == "server"
    assert found.local.blob_path(digest(data)).read_bytes() == data
    assert len(front.presigned) == 2
    no_token_sent(front, cache)


@pytest.mark.parametrize("mode", ["garbage", "longer", "truncated"])
def test_wrong_bytes_at_the_target_are_a_miss(cache: Cache, front: Front, mode: str) -> None:
    """Nothing wrong: bytes from the redirect target that are not the blob (one bit
    off, too many, too few) are a miss, and nothing is left in L1."""
    front.mode = mode
    data = os.urandom(BIG)
    before = STATS.snapshot()
    found = download(cache, cache.put(data), len(data))
    assert found.source is None
    assert not found.local.has_blob(digest(data), len(data))
    assert found.files == []
    if mode == "garbage":
        assert delta(before, "bad_downloads") == 1
    no_token_sent(front, cache)


@pytest.mark.parametrize("mode", ["stall", "stall_body"])
def test_a_stalled_target_is_bounded_by_the_deadline(cache: Cache, front: Front, mode: str) -> None:
    """Nothing hangs: a target that says nothing, or stops halfway, costs the download
    its timeout (1 s here; ``download`` fails the test past 60 s), then it is a miss,
    nothing is in L1, and the server is skipped for the back-off as after any trouble."""
    front.mode = mode
    data = os.urandom(BIG)
    found = download(cache, cache.put(data), len(data), timeout=1.0)
    assert found.source is None
    assert found.files == []
    assert not found.up


def test_a_redirect_loop_is_a_miss(cache: Cache, front: Front) -> None:
    """Nothing hangs: a target that redirects to itself is followed a few times, then
    the download is a miss with nothing in L1, and no hop carried the token."""
    front.mode = "loop"
    data = os.urandom(BIG)
    found = download(cache, cache.put(data), len(data))
    assert found.source is None
    assert found.files == []
    assert not found.up
    assert 2 <= len(front.presigned) <= 10
    no_token_sent(front, cache)


@pytest.mark.parametrize("mode", ["dead", "ftp", "denied"])
def test_an_unusable_target_is_a_miss_and_trouble(cache: Cache, front: Front, mode: str) -> None:
    """Nothing hangs or breaks: a redirect to a port nobody listens on, to a scheme
    other than http(s), or a refusal at the target, is a miss with nothing in L1 and
    marks the server down (the next graph does not pay the same again)."""
    front.mode = mode
    data = os.urandom(BIG)
    found = download(cache, cache.put(data), len(data))
    assert found.source is None
    assert found.files == []
    assert not found.up


def test_a_blob_gone_at_the_target_is_a_plain_miss(cache: Cache, front: Front) -> None:
    """Nothing lost: a 404 at the target (the blob went after the server answered) is a
    miss, nothing in L1, and the server stays in use."""
    front.mode = "gone"
    data = os.urandom(BIG)
    found = download(cache, cache.put(data), len(data))
    assert found.source is None
    assert found.files == []
    assert found.up


# --- redirect_target, alone ----------------------------------------------------------------


def test_redirect_target_resolves_and_keeps_the_query() -> None:
    """Nothing altered: a presigned query goes on the request line as it came."""
    base = "http://server:8787/v1/blobs/ab"
    assert redirect_target(base, "https://s3.example:9000/b/k?X-Amz-Signature=a%2Fb") == (
        "https://s3.example:9000",
        "/b/k?X-Amz-Signature=a%2Fb",
    )
    assert redirect_target(base, "/other?x=1") == ("http://server:8787", "/other?x=1")
    assert redirect_target("http://h/a/b", "c") == ("http://h", "/a/c")


@pytest.mark.parametrize(
    "location",
    [
        "",
        "ftp://h/x",
        "file:///etc/passwd",
        "http://user:secret@h/x",
        "http://h:port/x",
        "http://h/a b",
        "http://h/caf\u00e9",
    ],
)
def test_redirect_target_refuses_what_it_cannot_follow(location: str) -> None:
    """Nothing sent astray: an empty Location, another scheme, user information, a bad
    port or bytes that cannot go on a request line are errors (the caller's trouble
    path), and the message never quotes the URL's query or user information."""
    with pytest.raises(HttpError) as raised:
        redirect_target("http://server:8787/v1/blobs/ab", location)
    assert "secret" not in str(raised.value)
