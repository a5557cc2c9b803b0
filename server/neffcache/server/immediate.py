"""Lookups and blob reads answered by the HTTP protocol itself, on local stores.

Why: a lookup is what every rank of a starting fleet does first, and on SQLite and a
filesystem its own work (the token, one indexed read, the JSON already encoded) is a
small part of what uvicorn spends around it: a request cycle object and its event, an
ASGI task, the middleware and app calls, two messages through ``send``, each turn of
the loop. A profile of lookups on one core put the app's work at about a sixth of the
server's time. Here the protocol answers a lookup the moment its request has arrived,
with the very functions the routes and the fast path call (``FastPath.immediate``),
and writes the answer uvicorn would have written, byte for byte. So it answers a blob
read through nginx in front (the file's location, nginx sends it), and a plain blob
read of a verified file (``FileAnswer``): the head, then the file from the page cache
to the socket with ``sendfile`` rather than read into Python and written out, which
took most of a 1 MiB GET's time (pinned: 1.5 GB/s read and written, 2.8 GB/s with
``sendfile``). Its last 64 KiB are read and the file's stamp checked before they are
written, so a file changed while it is sent cuts the answer off (where the usual way,
which reads a blob up to 16 MiB whole before sending it, hashes it again; a file of at
most 64 KiB is read whole first here too, and handed back to the usual way if it
changed). Up to 16 MiB, if the socket fills, the rest is read and written at once, as
an inline NEFF is; a larger file goes on with ``sendfile`` each time the socket has
room (filestream.py). Over TLS the file goes through the transport.

The answer is written as one small write, which the connection holds until the loop's
next turn (connections.py): the answers to all the requests that arrived in one turn
then leave one after the other. Sent at once, each went to a client asleep waiting for
it, and the send that wakes a reader on another core cost the server 15 µs of CPU
(measured here: pinned lookups at 21k/s sent at once, 35k/s held).

Only a plain case is taken, and everything else goes the usual way, unchanged:

- a ``GET`` over HTTP/1.1 with no body, no ``Expect``, no upgrade, whose path has no
  percent-escape (uvicorn would unquote it), to a path ``FastPath.takes``;
- on a connection with nothing else in flight (no earlier request still answering,
  none queued behind one, writing not paused), so answers keep their order and
  uvicorn's flow control holds;
- with the access log off (uvicorn writes it from the request cycle) and no
  ``root_path``.

The answer is made in a fresh ``contextvars.Context``, as a task would have one. A
``ServerError`` is its answer (the fast path's); any other exception is answered 500
and logged, as uvicorn answers an app that raises: not run again the usual way, since
what it did is done (a hit counted, an entry's use recorded).
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterable
from typing import ClassVar, Protocol, cast

import httptools
from starlette.responses import PlainTextResponse, Response
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from neffcache.server.api.blobs import FileAnswer
from neffcache.server.api.entries import InlineBody
from neffcache.server.filestream import LAST as _LAST
from neffcache.server.filestream import FileStream, raw_socket, send_file

# The largest file whose rest is read and written at once when the socket fills, as the
# server holds an inline NEFF (protocol/inline.py); a larger one waits for room.
_WHOLE_MAX = 16 * 2**20
# A request with a body is never a lookup; these say it has one.
_BODY_HEADERS = (b"content-length", b"transfer-encoding")


class Answers(Protocol):
    """What the protocol asks (``fastpath.FastPath`` is one)."""

    def takes(self, path: str) -> bool: ...

    def immediate(self, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Response | None: ...


class ImmediateAnswers(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering what ``answers`` takes itself (the
    server sets ``answers``; None answers nothing here)."""

    answers: ClassVar[Answers | None] = None
    _deferred: str | None = None  # the path of the request to answer at its end
    _stream: FileStream | None = None  # a large file being sent

    def on_headers_complete(self) -> None:
        path = self._immediate_path()
        if path is None:
            super().on_headers_complete()
        else:
            self._deferred = path  # a request without a body: it ends next

    def on_message_complete(self) -> None:
        path, self._deferred = self._deferred, None
        if path is not None:
            if self._answered(path):
                return
            super().on_headers_complete()  # the usual way after all: a cycle and a task
        super().on_message_complete()

    def _immediate_path(self) -> str | None:
        """The request's path when this protocol answers it, else None."""
        answers = self.answers
        if answers is None or self.access_log or self.root_path or self.expect_100_continue:
            return None
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete):
            return None
        if self.flow.write_paused or self.limit_concurrency is not None:
            return None
        parser = self.parser
        if parser.get_method() != b"GET" or parser.get_http_version() != "1.1":
            return None
        if parser.should_upgrade():
            return None
        for name, _ in self.headers:
            if name in _BODY_HEADERS:
                return None
        try:
            raw = httptools.parse_url(self.url).path
            path = raw.decode("ascii")
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
            return None
        if "%" in path or not answers.takes(path):
            return None
        return path

    def _answered(self, path: str) -> bool:
        answers = self.answers
        assert answers is not None
        try:
            response = contextvars.Context().run(answers.immediate, path, self.headers)
        except Exception:
            # Not run again the usual way: what it did is done (a hit counted, an
            # entry's use recorded). Answered as uvicorn answers an app that raises.
            self.logger.error("Exception in ASGI application\n", exc_info=True)
            response, keep_alive = _FAILED, False
        else:
            if response is None:
                return False
            keep_alive = self.parser.should_keep_alive()
        if isinstance(response, FileAnswer):
            if response.opened.file.size > _WHOLE_MAX:
                self._start_stream(response, keep_alive)
                return True  # its request ends once the file is sent
            if not self._send_file(self._http(response, keep_alive)[0], response):
                return False  # its file changed before anything was sent: read it again
        elif not self.transport.is_closing():
            parts = self._http(response, keep_alive)
            if len(parts) == 1:
                # Held until the loop's next turn with the other connections' answers
                # (connections.py): sent together they wake the readers fewer times.
                self.transport.write(parts[0])
            else:
                self.transport.writelines(parts)
        if not keep_alive and not self.transport.is_closing():
            self.transport.close()  # what is written or held goes first
        self.on_response_complete()
        return True

    def _http(self, response: Response, keep_alive: bool) -> list[bytes]:
        """What uvicorn's request cycle writes for ``response``: its status line, the
        server's default headers, the response's, ``connection: close`` when the
        connection ends, then the body."""
        head = [STATUS_LINE[response.status_code]]
        for name, value in (*self.server_state.default_headers, *response.raw_headers):
            head += [name, b": ", value, b"\r\n"]
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", bytes(response.body)]
        if isinstance(response, InlineBody):
            return [b"".join(head), response.data]  # the file is not copied into the head
        return [b"".join(head)]

    def _start_stream(self, answer: FileAnswer, keep_alive: bool) -> None:
        """A large file sent as the socket takes it (filestream.py); meanwhile its
        stand-in is the request cycle, so uvicorn queues a request pipelined behind it."""
        answer.sent()
        stream = FileStream(
            self.transport, self.flow, answer.opened, keep_alive, self._stream_ended
        )
        self._stream = stream
        self.cycle = cast(RequestResponseCycle, stream.cycle)
        stream.start(self._http(answer, keep_alive)[0])

    def _stream_ended(self, stream: FileStream) -> None:
        self._stream = None
        if not stream.cycle.keep_alive and not self.transport.is_closing():
            self.transport.close()  # what is written goes first
        self.on_response_complete()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stream is not None:
            self._stream.pump()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stream is not None:
            self._stream.stop()
        super().connection_lost(exc)

    def _send_file(self, head: bytes, answer: FileAnswer) -> bool:
        """The head, then the file: from the page cache to the socket (``sendfile``)
        while the socket takes it, the rest read and written. Its last 64 KiB are read
        and its stamp checked before they are written: a file that changed cuts the
        answer off, where the usual way, reading a blob up to 16 MiB whole before it
        sends anything, hashes it again; so a file of at most 64 KiB, read whole here
        before its head, is handed back to the usual way instead (False)."""
        opened, transport = answer.opened, self.transport
        size, fd = opened.file.size, opened.file.fileno()
        try:
            if size <= _LAST:
                data = os.pread(fd, size, 0)
                if len(data) != size or not opened.unchanged():
                    opened.forget()
                    return False
                answer.sent()
                if not transport.is_closing():
                    transport.write(head + data)
                return True
            answer.sent()
            if transport.is_closing():
                return True
            transport.writelines([head])  # now: the file's bytes follow it on the socket
            sent = 0
            socket = raw_socket(transport)
            if socket is not None and transport.get_write_buffer_size() == 0:
                # The head is in the socket: the file's bytes may follow it there.
                sent = send_file(socket, fd, 0, size - _LAST)
            rest = os.pread(fd, size - sent, sent)
            if len(rest) != size - sent or not opened.unchanged():
                opened.changed()
                transport.abort()
                return True
            transport.write(rest)
        except OSError:  # the peer went away; or the file could not be read
            transport.abort()
        finally:
            opened.file.close()
        return True


# uvicorn's answer when an app raises before it answers.
_FAILED = PlainTextResponse("Internal Server Error", status_code=500)
