"""A small HTTP/1.1 client for talking to one neffcache server, every call time-boxed.

Why not httpx (which the client may use): importing it costs more (about 70 ms) than a
whole cache hit through the compiler wrapper may spend, and the wrapper runs once per
graph in a fresh process. The protocol needs little: GET and PUT with a
``Content-Length`` body, keep-alive, a response body read whole or streamed to a file.
Every socket operation has the connect or per-request timeout, and the whole request
has a deadline, so a server that accepts and then says nothing cannot hang a job.
Redirects are not followed here: ``redirect_target`` checks a ``Location`` and the
caller decides (only blob downloads follow one, to a presigned URL: remote.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    import socket

_MAX_HEAD = 64 * 1024
_READ = 1 << 20
#: The most a body kept in memory may be, unless a request says otherwise: a manifest
#: (the server takes at most 1 MiB) or a lease answer (one plus a failure record of at
#: most 256 KiB). A server that sends more is broken or hostile, and would otherwise
#: grow the training process until the deadline.
BODY_LIMIT = 4 << 20
#: An error answer's body: a JSON reason.
ERROR_LIMIT = 64 << 10
#: Statuses whose ``Location`` a GET may follow.
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class HttpError(Exception):
    """The request did not complete: connection, timeout, or a malformed response."""


class ConnectFailed(HttpError):
    """No connection could be opened: nothing was sent (the bridge stops its run on
    this, and only skips the entry at hand on any other HttpError)."""


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes  # empty when streamed elsewhere


class Connection:
    """One keep-alive connection to ``base`` (``http://host:port`` or ``https://...``),
    reopened when the server closed it. Not thread-safe: one per thread."""

    def __init__(self, base: str, connect_timeout: float, timeout: float) -> None:
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"cannot talk to {base!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self._idle = timeout  # this request's longest silence (see ``wait``)
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buffer = b""

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        body_file: tuple[BinaryIO, int] | None = None,
        sink: Callable[[bytes], None] | None = None,
        timeout: float | None = None,
        wait: float = 0.0,
        limit: int = BODY_LIMIT,
    ) -> Response:
        """Send one request; the body goes to ``sink`` in chunks when given (then
        ``Response.body`` is empty), else it is returned whole, up to ``limit`` bytes
        (``ERROR_LIMIT`` for an error's): a longer one is an HttpError. A reused connection
        that turns out closed is retried once on a fresh one, before any byte of the
        response was read. ``wait``: seconds the server may hold its answer on purpose
        (a long-poll), allowed on top of the idle timeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout) + wait
        self._idle = self.timeout + wait
        for attempt in (0, 1):
            reused = self._sock is not None
            try:
                self._send(method, path, headers or {}, body, body_file, deadline)
                return self._receive(method, sink, deadline, limit)
            except _StaleConnection:
                self.close()
                if attempt or not reused:
                    raise HttpError("the server closed the connection") from None
                if body_file is not None:
                    body_file[0].seek(0)
            except SinkError:
                self.close()  # the response was cut off midway: the connection is spent
                raise
            except (OSError, HttpError) as exc:
                self.close()
                if isinstance(exc, HttpError):
                    raise
                # Never the query: a presigned URL's signature, a lease id.
                raise HttpError(f"{method} {path.partition('?')[0]}: {exc}") from exc
        raise AssertionError("unreachable")

    def _socket(self, deadline: float) -> socket.socket:
        if self._sock is None:
            try:
                self._sock = self._open(deadline)
            except OSError as exc:
                raise ConnectFailed(f"cannot connect to {self.host_header}: {exc}") from exc
        return self._sock

    def _open(self, deadline: float) -> socket.socket:
        timeout = max(0.001, min(self.connect_timeout, deadline - time.monotonic()))
        if not self.tls:
            return _connect(self.host, self.port, timeout)
        import socket
        import ssl  # only for https: their imports are not free

        plain = socket.create_connection((self.host, self.port), timeout=timeout)
        context = ssl.create_default_context()
        return context.wrap_socket(plain, server_hostname=self.host)

    def _send(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        body_file: tuple[BinaryIO, int] | None,
        deadline: float,
    ) -> None:
        sock = self._socket(deadline)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        elif body_file is not None:
            lines.append(f"Content-Length: {body_file[1]}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        _set_timeout(sock, deadline, self._idle)
        try:
            sock.sendall(head + body if body is not None and len(body) < _READ else head)
            if body is not None and len(body) >= _READ:
                sock.sendall(body)
            if body_file is not None:
                file, size = body_file
                sent = 0
                while sent < size:
                    chunk = file.read(min(_READ, size - sent))
                    if not chunk:
                        raise HttpError(f"the file to upload ended after {sent} of {size} bytes")
                    _set_timeout(sock, deadline, self._idle)
                    sock.sendall(chunk)
                    sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            raise _StaleConnection() from None

    def _receive(
        self, method: str, sink: Callable[[bytes], None] | None, deadline: float, limit: int
    ) -> Response:
        head = self._read_head(deadline)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP response: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        chunks: list[bytes] = []
        # Only a success's body is the payload; an error's (a JSON reason) is kept.
        success = 200 <= status < 300
        write = _bounded(chunks, limit if success else min(limit, ERROR_LIMIT))
        if sink is not None and success:
            write = _guarded(sink)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            pass
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            for chunk in self._chunked(deadline):
                write(chunk)
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise HttpError(f"bad Content-Length {headers['content-length'][:40]!r}") from None
            if length < 0:
                raise HttpError(f"bad Content-Length {length}")
            for chunk in self._exactly(length, deadline):
                write(chunk)
        else:  # delimited by close
            for chunk in self._until_close(deadline):
                write(chunk)
            self.close()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Response(status, headers, b"".join(chunks))

    def _recv(self, deadline: float) -> bytes:
        if self._buffer:
            data, self._buffer = self._buffer, b""
            return data
        assert self._sock is not None
        _set_timeout(self._sock, deadline, self._idle)
        return self._sock.recv(_READ)

    def _read_head(self, deadline: float) -> bytes:
        data = b""
        first = True
        while True:
            end = data.find(b"\r\n\r\n")
            if end >= 0:
                self._buffer = data[end + 4 :] + self._buffer
                return data[:end]
            if len(data) > _MAX_HEAD:
                raise HttpError("the response head is too large")
            chunk = self._recv(deadline)
            if not chunk:
                if first:
                    raise _StaleConnection()
                raise HttpError("the connection closed inside the response head")
            first = False
            data += chunk

    def _exactly(self, length: int, deadline: float) -> Iterator[bytes]:
        remaining = length
        while remaining > 0:
            chunk = self._recv(deadline)
            if not chunk:
                raise HttpError(f"the connection closed {remaining} bytes before the end")
            if len(chunk) > remaining:
                self._buffer = chunk[remaining:]
                chunk = chunk[:remaining]
            remaining -= len(chunk)
            yield chunk

    def _line(self, deadline: float) -> bytes:
        data = b""
        while b"\r\n" not in data:
            # Checked before reading more, not after: one read may bring a short
            # header and a megabyte of the chunk behind it.
            if len(data) > _MAX_HEAD:
                raise HttpError("a chunk header is too large")
            chunk = self._recv(deadline)
            if not chunk:
                raise HttpError("the connection closed inside a chunk header")
            data += chunk
        line, _, rest = data.partition(b"\r\n")
        self._buffer = rest + self._buffer
        return line

    def _chunked(self, deadline: float) -> Iterator[bytes]:
        while True:
            size_text = self._line(deadline).split(b";")[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                while self._line(deadline):  # trailers, then the empty line
                    pass
                return
            yield from self._exactly(size, deadline)
            if self._line(deadline):
                raise HttpError("a chunk did not end with CRLF")

    def _until_close(self, deadline: float) -> Iterator[bytes]:
        while True:
            chunk = self._recv(deadline)
            if not chunk:
                return
            yield chunk


def redirect_target(url: str, location: str) -> tuple[str, str]:
    """Where a redirect from ``url`` points: the ``Location`` resolved against it, as
    (``scheme://host:port``, the path with its query), ready for ``Connection`` and
    ``request``. HttpError for anything but a plain http(s) URL (another scheme, user
    information, bytes that cannot go on a request line). Messages name the place,
    never the query (a presigned URL's is its credential)."""
    parts = urlsplit(urljoin(url, location.strip()))
    try:
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number
    except ValueError:
        raise HttpError("a redirect to a malformed port") from None
    if not location.strip() or parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"a redirect to something other than http(s) ({parts.scheme or 'none'})")
    if "@" in parts.netloc:
        raise HttpError("a redirect to a URL with user information")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not (target + parts.netloc).isascii() or any(
        c <= " " or c == "\x7f" for c in target + parts.netloc
    ):
        raise HttpError(f"a redirect to {parts.scheme}://{parts.netloc} with unsendable bytes")
    return f"{parts.scheme}://{parts.netloc}", target


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """``socket.create_connection`` on the C ``_socket`` module: the ``socket``
    module's import (with ``selectors``) costs about 2.5 ms, a tenth of a wrapper hit.
    Every address is tried in turn, within ``timeout`` each, as create_connection does."""
    import _socket

    error: OSError | None = None
    for family, kind, proto, _, address in _resolve(host, port, timeout):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            return sock  # type: ignore[return-value]  # same methods as socket.socket
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"cannot resolve {host}")


def _resolve(host: str, port: int, timeout: float) -> list[tuple[Any, ...]]:
    """``getaddrinfo``, bounded by ``timeout``: a name lookup has no timeout of its own
    and a dead resolver would hang the job. An address literal needs no lookup; a name
    is looked up on a daemon thread that is abandoned when time runs out."""
    import _socket

    # An ASCII host as bytes skips the IDNA codec's import.
    name: str | bytes = host.encode() if host.isascii() else host
    family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
    try:
        _socket.inet_pton(family, host)
    except OSError:
        pass
    else:
        return list(_socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM))
    import threading

    found: list[list[tuple[Any, ...]]] = []
    failed: list[OSError] = []

    def lookup() -> None:
        try:
            found.append(list(_socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM)))
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=lookup, name="neffcache-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    if found:
        return found[0]
    if failed:
        raise failed[0]
    raise TimeoutError(f"looking up {host} took over {timeout:.1f} s")


class SinkError(Exception):
    """The caller's sink failed (a full disk): the caller's trouble, not the server's."""


def _bounded(chunks: list[bytes], limit: int) -> Callable[[bytes], None]:
    """Keep chunks in ``chunks`` until they add up to more than ``limit`` bytes, then
    fail the request: checked before the bytes are kept, so memory stays bounded
    whatever the server announces or sends."""
    kept = 0

    def write(chunk: bytes) -> None:
        nonlocal kept
        kept += len(chunk)
        if kept > limit:
            raise HttpError(f"the answer is over {limit} bytes")
        chunks.append(chunk)

    return write


def _guarded(sink: Callable[[bytes], None]) -> Callable[[bytes], None]:
    def write(chunk: bytes) -> None:
        try:
            sink(chunk)
        except Exception as exc:
            raise SinkError(str(exc)) from exc

    return write


class _StaleConnection(Exception):
    """A kept-alive connection the server had already closed."""


def _set_timeout(sock: socket.socket, deadline: float, idle: float) -> None:
    """Each socket operation waits at most ``idle`` (the per-request timeout) and never
    past the request's deadline: a long download may take long, a stalled one may not."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise HttpError("the request ran out of time")
    sock.settimeout(min(left, idle))


def error_detail(body: bytes) -> str:
    """The server's reason in an error answer's body (its ``detail``, else the body
    itself), on one line and at most 300 characters: for a message to a person."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = detail if isinstance(detail, str) else body.decode("utf-8", errors="replace")
    return " ".join(text.split())[:300] or "no reason given"
