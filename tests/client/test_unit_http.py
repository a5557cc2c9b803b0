"""Unit tests for ``neffcache.client.http.Connection`` against raw-socket servers on
127.0.0.1, each scripted per test: what is sent back, when, and when it closes."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from loopback import free_port

from neffcache.client.http import Connection, HttpError, SinkError

Handler = Callable[[socket.socket, "RawServer"], None]

# Seconds: when a held-back answer comes after all, a whole answer that only a client
# without a deadline would wait for. A deadline is shown by the request failing, not
# by timing it: a loaded machine may be slow, never early.
LATE = 30.0


class RawServer:
    """Accepts connections on a loopback port and runs ``handler`` on each in a thread.
    ``accepted`` counts connections; ``requests`` collects each request's head and body."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted = 0
        self.requests: list[tuple[str, bytes]] = []
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self.handler(conn, self)

    def read_request(self, conn: socket.socket) -> tuple[str, bytes] | None:
        """One request (head, body by Content-Length), or None when the peer closed."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        text = head.decode("latin-1")
        length = 0
        for line in text.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        self.requests.append((text, body))
        return text, body

    def hold(self, seconds: float) -> None:
        """Wait ``seconds``, or until the server closes (the test has ended)."""
        self._stop.wait(seconds)

    def close(self) -> None:
        self._stop.set()
        # shutdown wakes the blocked accept(); only after the accept thread has ended
        # is _conns final, so no connection accepted meanwhile escapes closing.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(timeout=5)
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()


@contextlib.contextmanager
def serving(handler: Handler) -> Iterator[RawServer]:
    server = RawServer(handler)
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def connection(
    url: str, connect_timeout: float = 1.0, timeout: float = 3.0
) -> Iterator[Connection]:
    conn = Connection(url, connect_timeout, timeout)
    try:
        yield conn
    finally:
        conn.close()


def respond(data: bytes) -> Handler:
    """Read requests on one connection and answer each with ``data``, keeping it open."""

    def handler(conn: socket.socket, server: RawServer) -> None:
        while server.read_request(conn) is not None:
            conn.sendall(data)

    return handler


# --- bodies ---------------------------------------------------------------------------


def test_get_with_content_length() -> None:
    body = os.urandom(3 * 2**20 + 7)  # several reads of the client's buffer
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Thing: A b\r\n\r\n" % len(body)
    with serving(respond(answer + body)) as server, connection(server.url) as conn:
        response = conn.request("GET", "/v1/x", headers={"Accept": "application/json"})
    assert response.status == 200
    assert response.body == body
    assert response.headers["x-thing"] == "A b"
    head = server.requests[0][0]
    assert head.startswith("GET /v1/x HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}" in head
    assert "Accept: application/json" in head


def test_get_streamed_to_a_sink() -> None:
    body = os.urandom(100_000)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    chunks: list[bytes] = []
    with serving(respond(answer + body)) as server, connection(server.url) as conn:
        response = conn.request("GET", "/b", sink=chunks.append)
    assert response.body == b""
    assert b"".join(chunks) == body


def test_chunked_body() -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\n"
    )
    with serving(respond(answer + answer)) as server, connection(server.url) as conn:
        first = conn.request("GET", "/a")
        second = conn.request("GET", "/a")  # the trailers were consumed, not left behind
    assert first.body == b"Wikipedia in\r\n\r\nchunks."
    assert second.body == first.body
    assert server.accepted == 1


def test_body_delimited_by_close() -> None:
    def handler(conn: socket.socket, server: RawServer) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nall of ")
        time.sleep(0.05)
        conn.sendall(b"it")
        conn.close()

    with serving(handler) as server, connection(server.url) as conn:
        response = conn.request("GET", "/")
        assert response.body == b"all of it"
        assert conn._sock is None  # not kept: the body ended with the connection
        again = conn.request("GET", "/")
    assert again.body == b"all of it"
    assert server.accepted == 2


def test_head_and_204_have_no_body() -> None:
    answers = iter(
        [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"HTTP/1.1 204 No Content\r\n\r\n"]
    )

    def handler(conn: socket.socket, server: RawServer) -> None:
        while server.read_request(conn) is not None:
            conn.sendall(next(answers))

    with serving(handler) as server, connection(server.url) as conn:
        assert conn.request("HEAD", "/blob").headers["content-length"] == "5"
        assert conn.request("DELETE", "/blob").status == 204
    assert server.accepted == 1


# --- keep-alive -----------------------------------------------------------------------


def test_keep_alive_reuses_one_connection() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    with serving(respond(answer)) as server, connection(server.url) as conn:
        assert conn.request("GET", "/1").body == b"ok"
        assert conn.request("GET", "/2").body == b"ok"
        assert conn.request("POST", "/3", body=b"{}").body == b"ok"
    assert server.accepted == 1
    assert [head.split()[1] for head, _ in server.requests] == ["/1", "/2", "/3"]
    assert server.requests[2][1] == b"{}"


def test_connection_close_header_closes() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    with serving(respond(answer)) as server, connection(server.url) as conn:
        conn.request("GET", "/1")
        assert conn._sock is None
        conn.request("GET", "/2")
    assert server.accepted == 2


def _answer_once_then_close(conn: socket.socket, server: RawServer) -> None:
    request = server.read_request(conn)
    if request is not None:
        conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
    conn.close()


def test_a_closed_kept_alive_connection_is_retried_once_on_a_fresh_one() -> None:
    with serving(_answer_once_then_close) as server, connection(server.url) as conn:
        assert conn.request("GET", "/1").body == b"ok"
        time.sleep(0.05)  # the server's FIN arrives
        assert conn.request("GET", "/2").body == b"ok"
    assert server.accepted == 2
    assert [head.split()[1] for head, _ in server.requests] == ["/1", "/2"]


def test_the_retry_resends_an_upload_from_its_start() -> None:
    data = os.urandom(300_000)
    with serving(_answer_once_then_close) as server, connection(server.url) as conn:
        conn.request("GET", "/1")
        time.sleep(0.05)
        upload = io.BytesIO(data)
        response = conn.request("PUT", "/blob", body_file=(upload, len(data)))
    assert response.status == 201
    assert server.requests[-1][1] == data


def test_a_fresh_connection_closed_without_an_answer_is_an_error() -> None:
    def handler(conn: socket.socket, server: RawServer) -> None:
        server.read_request(conn)
        conn.close()

    with (
        serving(handler) as server,
        connection(server.url) as conn,
        pytest.raises(HttpError),
    ):
        conn.request("GET", "/")
    assert server.accepted == 1  # no retry: the connection was new


# --- time-boxing ----------------------------------------------------------------------


def answer_late(conn: socket.socket, server: RawServer) -> None:
    server.read_request(conn)
    server.hold(LATE)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def test_a_server_that_never_answers_hits_the_deadline() -> None:
    timeout = 0.5
    with serving(answer_late) as server, connection(server.url, timeout=timeout) as conn:
        start = time.monotonic()
        with pytest.raises(HttpError):
            conn.request("GET", "/")
        elapsed = time.monotonic() - start
    assert elapsed >= timeout * 0.9


def test_a_trickling_server_still_hits_the_deadline() -> None:
    # Each byte resets a per-read timeout; only a whole-request deadline ends this.
    # A byte a tenth of a second: the whole body takes LATE seconds.
    length = int(LATE * 10)

    def handler(conn: socket.socket, server: RawServer) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length)
        for _ in range(length):
            conn.sendall(b"x")
            server.hold(0.1)

    with (
        serving(handler) as server,
        connection(server.url, timeout=0.6) as conn,
        pytest.raises(HttpError),
    ):
        conn.request("GET", "/")


def test_a_per_call_timeout_overrides_the_default() -> None:
    # The default outlasts the late answer: only the call's own timeout fails it.
    with (
        serving(answer_late) as server,
        connection(server.url, timeout=2 * LATE) as conn,
        pytest.raises(HttpError),
    ):
        conn.request("GET", "/", timeout=0.3)


def test_connection_refused_fails_fast() -> None:
    # Timeouts of 2 x LATE: a client that waited one out, or retried until it ended,
    # would take that long; a refusal is answered in a millisecond.
    url = f"http://127.0.0.1:{free_port()}"
    with connection(url, connect_timeout=2 * LATE, timeout=2 * LATE) as conn:
        start = time.monotonic()
        with pytest.raises(HttpError):
            conn.request("GET", "/")
    assert time.monotonic() - start < LATE


def test_a_bad_base_url_is_an_http_error() -> None:
    with pytest.raises(HttpError):
        Connection("ftp://host:1", 1, 1)


# --- malformed answers ----------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        b"FOO 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 OK\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # then the server closes
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",  # then closes
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Le",  # the head is cut
    ],
)
def test_malformed_or_truncated_answers_are_http_errors(answer: bytes) -> None:
    def handler(conn: socket.socket, server: RawServer) -> None:
        server.read_request(conn)
        conn.sendall(answer)
        conn.close()

    with serving(handler) as server, connection(server.url) as conn:
        with pytest.raises(HttpError):
            conn.request("GET", "/")
        assert conn._sock is None  # a broken connection is never reused


def test_an_error_inside_the_sink_is_the_sinks_and_drops_the_connection() -> None:
    # A full disk under the sink is the caller's trouble, not the server's: it must not
    # come out as an HttpError (which marks the server down).
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd"

    def sink(chunk: bytes) -> None:
        raise OSError(28, "No space left on device")

    with serving(respond(answer)) as server, connection(server.url) as conn:
        with pytest.raises(SinkError, match="No space left"):
            conn.request("GET", "/", sink=sink)
        assert conn._sock is None
        assert conn.request("GET", "/").body == b"abcd"
    assert server.accepted == 2


# --- uploads --------------------------------------------------------------------------


def test_put_streams_body_file() -> None:
    data = os.urandom(2 * 2**20 + 123)
    answer = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
    with serving(respond(answer)) as server, connection(server.url) as conn:
        response = conn.request("PUT", "/v1/blobs/x", body_file=(io.BytesIO(data), len(data)))
    assert response.status == 201
    head, body = server.requests[0]
    assert f"Content-Length: {len(data)}" in head
    assert body == data


def test_put_of_a_file_shorter_than_announced_is_an_http_error() -> None:
    answer = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
    with serving(respond(answer)) as server, connection(server.url) as conn:
        with pytest.raises(HttpError, match="ended after 3 of 10"):
            conn.request("PUT", "/x", body_file=(io.BytesIO(b"abc"), 10))
        assert conn._sock is None  # the server waits for 7 more bytes: never reuse it


def test_large_bytes_body() -> None:
    data = os.urandom(2**20 + 1)  # sent apart from the head
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    with serving(respond(answer)) as server, connection(server.url) as conn:
        conn.request("POST", "/x", body=data)
    assert server.requests[0][1] == data


@pytest.mark.parametrize("value", [b"abc", b"12, 12", b""])
def test_a_bad_content_length_is_an_http_error(value: bytes) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\nxyz"

    def handler(conn: socket.socket, server: RawServer) -> None:
        server.read_request(conn)
        conn.sendall(answer)
        conn.close()

    with (
        serving(handler) as server,
        connection(server.url) as conn,
        pytest.raises(HttpError),
    ):
        conn.request("GET", "/")


def test_a_name_lookup_that_hangs_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # getaddrinfo has no timeout of its own; a dead resolver must not hang the job.
    import _socket

    from neffcache.client import http as http_module

    real = _socket.getaddrinfo
    release = threading.Event()

    def stuck(host: object, *args: object) -> object:
        if host == b"stuck.example":
            # Answers after LATE seconds: only a lookup without the bound gets this.
            release.wait(LATE)
            return real("127.0.0.1", *args)  # type: ignore[arg-type]
        return real(host, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_socket, "getaddrinfo", stuck)
    with pytest.raises(TimeoutError, match=r"stuck\.example"):
        http_module._resolve("stuck.example", 80, 0.3)
    release.set()
    # An address literal is not looked up on a thread at all.
    assert http_module._resolve("127.0.0.1", 80, 0.3)[0][4] == ("127.0.0.1", 80)
