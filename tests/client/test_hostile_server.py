"""A broken or hostile server must not reach outside the cache, hang a job, fill its
memory or print tracebacks: every answer it gives is a miss with one warning line, and
the graph compiles.

The server here is a few lines of ``http.server``: every entry or alias lookup gets the
manifest (or body) the test sets, every other request a 503. The wrapper runs as a real
process through ``neffcache wrap``, with the stand-in compiler.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.e2e import BLOCK_A, Sandbox, cache_url, reference_neff
from support.http_stubs import send_json

from neffcache.client.http import BODY_LIMIT, ERROR_LIMIT, Connection, HttpError
from neffcache.client.remote import INLINE_MAX

Answer = Callable[[BaseHTTPRequestHandler], None]


class HostileServer:
    """Answers entry and alias lookups with ``answer``; everything else with 503."""

    def __init__(self, answer: Answer) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.paths.append(self.path)
                if "/entries/" in self.path or "/aliases/" in self.path:
                    answer(self)
                else:
                    self._unavailable()

            def do_POST(self) -> None:
                self._unavailable()

            do_PUT = do_POST  # noqa: N815

            def _unavailable(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.paths: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def hostile(answer: Answer) -> Iterator[HostileServer]:
    server = HostileServer(answer)
    try:
        yield server
    finally:
        server.close()


def json_answer(manifest: object) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        send_json(handler, 200, manifest)

    return answer


def manifest_with(files: object) -> dict[str, Any]:
    return {"key": "a" * 64, "files": files}


def neff(digest: str, size: int = 4096) -> dict[str, Any]:
    return {"model.neff": {"digest": digest, "size": size}}


def run_wrapper(sandbox: Sandbox, server: HostileServer, *, timeout: float = 60) -> Any:
    l1 = sandbox.new_dir("l1")
    env = sandbox.env(l1=l1, url=cache_url(server.port, sandbox.namespace))
    out = sandbox.new_dir("out") / "model.neff"
    done = sandbox.wrap(env, BLOCK_A, out, timeout=timeout)
    return done, out, l1


def assert_compiled_cleanly(sandbox: Sandbox, done: Any, out: Path) -> None:
    """The job went on as if there were no cache: exit 0, one compile, the right NEFF,
    one line about the bad answer and no traceback."""
    assert done.returncode == 0, done.describe()
    assert sandbox.compiles() == 1, done.describe()
    assert out.read_bytes() == reference_neff(BLOCK_A)
    assert "Traceback" not in done.stderr, done.describe()


@pytest.mark.e2e
def test_an_absolute_digest_deletes_and_reads_nothing(sandbox: Sandbox, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"not the cache's")
    with hostile(json_answer(manifest_with(neff(str(victim), 15)))) as server:
        done, out, _ = run_wrapper(sandbox, server)
    assert_compiled_cleanly(sandbox, done, out)
    assert victim.read_bytes() == b"not the cache's"
    assert "malformed" in done.stderr
    assert not any(str(victim) in path for path in server.paths)  # never became a URL


@pytest.mark.e2e
def test_a_device_as_digest_cannot_hang_the_job(sandbox: Sandbox) -> None:
    # /dev/zero stats as 0 bytes and never ends: read as a blob, the hash would run
    # until the job was killed.
    with hostile(json_answer(manifest_with(neff("/dev/zero", 0)))) as server:
        done, out, _ = run_wrapper(sandbox, server, timeout=60)
    assert not done.timed_out, done.describe()
    assert_compiled_cleanly(sandbox, done, out)


@pytest.mark.e2e
def test_a_relative_digest_creates_nothing_outside_the_cache(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    before = set(tmp_path.rglob("*"))
    digest = "../../../escaped/" + "a" * 40
    with hostile(json_answer(manifest_with(neff(digest)))) as server:
        done, out, l1 = run_wrapper(sandbox, server)
    assert_compiled_cleanly(sandbox, done, out)
    created = {p for p in set(tmp_path.rglob("*")) - before if not p.is_relative_to(l1)}
    assert not [p for p in created if "escaped" in str(p)], sorted(created)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("files", "why"),
    [
        pytest.param({"../model.neff": neff("b" * 64)["model.neff"]}, "file name", id="up-name"),
        pytest.param({"/etc/passwd": neff("b" * 64)["model.neff"]}, "file name", id="abs-name"),
        pytest.param({".lock": neff("b" * 64)["model.neff"]}, "file name", id="hidden-name"),
        pytest.param(neff("b" * 64, -1), "size", id="negative-size"),
        pytest.param(neff("b" * 64, 1 << 50), "size", id="huge-size"),
        pytest.param({"model.neff": {"digest": "b" * 64, "size": "4096"}}, "size", id="text"),
        pytest.param({"model.neff": {"digest": "B" * 64, "size": 1}}, "digest", id="upper"),
        pytest.param(["model.neff"], "files", id="files-list"),
        pytest.param({"model.neff": "b" * 64}, "not an object", id="ref-string"),
        pytest.param({}, "files", id="no-files"),
    ],
)
def test_malformed_manifests_are_one_line_each(sandbox: Sandbox, files: object, why: str) -> None:
    with hostile(json_answer(manifest_with(files))) as server:
        done, out, _ = run_wrapper(sandbox, server)
    assert_compiled_cleanly(sandbox, done, out)
    lines = [line for line in done.stderr.splitlines() if "malformed" in line]
    assert lines, done.describe()
    assert all(why in line for line in lines), lines
    assert not any(path.startswith("/v1/blobs/") for path in server.paths)


@pytest.mark.e2e
@pytest.mark.parametrize("answer", ["[1, 2]", '"text"', "null", "{"], ids=str)
def test_answers_that_are_not_manifests(sandbox: Sandbox, answer: str) -> None:
    def send(handler: BaseHTTPRequestHandler) -> None:
        body = answer.encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    with hostile(send) as server:
        done, out, _ = run_wrapper(sandbox, server)
    assert_compiled_cleanly(sandbox, done, out)


def endless(handler: BaseHTTPRequestHandler) -> None:
    """200 with a body that never ends (chunked), until the client hangs up."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"[" * 65536
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    with contextlib.suppress(OSError):
        for _ in range(100_000):  # 6.5 GB at most: the test never waits for this
            handler.wfile.write(frame)


@pytest.mark.e2e
def test_an_endless_answer_is_cut_at_the_limit(sandbox: Sandbox) -> None:
    with hostile(endless) as server:
        done, out, _ = run_wrapper(sandbox, server)
    assert_compiled_cleanly(sandbox, done, out)
    # A lookup's answer may carry the NEFF inline: its bound is the two together.
    assert f"over {BODY_LIMIT + INLINE_MAX} bytes" in done.stderr, done.describe()


def serve_once(answer: bytes) -> tuple[int, threading.Thread, list[int]]:
    """A socket that answers one request with ``answer`` then streams 'x' until the
    client closes; the list gets the number of body bytes it managed to send."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sent: list[int] = []

    def run() -> None:
        conn, _ = listener.accept()
        total = 0
        with conn, listener:
            conn.recv(65536)
            conn.sendall(answer)
            with contextlib.suppress(OSError):
                while total < 1 << 31:
                    conn.sendall(b"x" * 65536)
                    total += 65536
        sent.append(total)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, sent


@pytest.mark.parametrize(
    ("head", "limit"),
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", BODY_LIMIT, id="ok"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", BODY_LIMIT, id="to-close"),
        pytest.param(b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n", ERROR_LIMIT, id="404"),
    ],
)
def test_the_client_stops_reading_at_the_limit(head: bytes, limit: int) -> None:
    port, thread, sent = serve_once(head)
    connection = Connection(f"http://127.0.0.1:{port}", 5.0, 30.0)
    with pytest.raises(HttpError, match=f"over {limit} bytes"):
        connection.request("GET", "/v1/ns/a/entries/x")
    connection.close()
    thread.join(timeout=30)
    # The server got to send what the socket buffers hold beyond the limit, no more:
    # nowhere near the gigabytes it wanted to.
    assert sent, "the server never finished"
    assert sent[0] < limit + (64 << 20), sent


def test_a_larger_limit_is_the_callers_choice() -> None:
    body = b"y" * (BODY_LIMIT + 10)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            conn.recv(65536)
            conn.sendall(head + body)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    connection = Connection(f"http://127.0.0.1:{port}", 5.0, 30.0)
    response = connection.request("GET", "/report", limit=2 * BODY_LIMIT)
    connection.close()
    thread.join(timeout=30)
    assert response.body == body


def test_the_l1_rejects_a_planted_manifest(sandbox: Sandbox, tmp_path: Path) -> None:
    """A manifest file in L1 is as untrusted as a server's answer."""
    from neffcache.client.local import LocalStore

    store = LocalStore(tmp_path / "l1")
    key = "c" * 64
    path = store.root / "keys" / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(manifest_with(neff("/dev/zero", 0))))
    assert store.manifest(key) is None
    assert store.has_blob("/dev/zero", 0) is False
    with pytest.raises(ValueError, match="not a blob digest"):
        store.blob_path("../" + "a" * 61)
    # A FIFO under a real digest's name: not a regular file, so never read.
    digest = "d" * 64
    fifo = store.blob_path(digest)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    assert store.has_blob(digest, 0) is False
