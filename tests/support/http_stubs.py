"""Small HTTP servers in a thread of the test process, answering as a test scripts
them: ``send_json`` writes one JSON answer from a handler, and ``ScriptedServer``
answers every request with what ``answer(method, path)`` returns (or
``route(method, path, body)``, when the answer depends on what was sent): a status and
a body, and headers to add if a third item is given; it records each request."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (status, body) or (status, body, headers)
Reply = tuple[int, bytes] | tuple[int, bytes, dict[str, str]]
Answer = Callable[[str, str], Reply]  # (method, path) -> reply
Route = Callable[[str, str, bytes], Reply]  # (method, path, request body) -> reply


def send_json(handler: BaseHTTPRequestHandler, status: int, body: object) -> None:
    """Answer the handler's request with ``body`` as JSON, its length declared."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class ScriptedServer:
    """Answers GET, PUT and POST with ``answer(method, path)`` (a request's body is read
    and dropped), or with ``route(method, path, body)`` if that is given instead;
    records ``(method, path)``, the Authorization header and all the headers of each.
    Paths are as sent (still percent-encoded)."""

    def __init__(self, answer: Answer | None = None, *, route: Route | None = None) -> None:
        respond = _either(answer, route)
        self.requests: list[tuple[str, str]] = []
        self.auth: list[str] = []
        self.headers: list[dict[str, str]] = []  # each request's, names lower-case
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                sent = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path))
                outer.auth.append(self.headers.get("Authorization", ""))
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                status, body, *more = respond(self.command, self.path, sent)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (more[0] if more else {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = _answer  # noqa: N815

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        serve = self.httpd.serve_forever
        thread = threading.Thread(target=serve, kwargs={"poll_interval": 0.01}, daemon=True)
        thread.start()

    @property
    def paths(self) -> list[str]:
        return [path for _, path in self.requests]

    @property
    def hits(self) -> int:
        return len(self.requests)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _either(answer: Answer | None, route: Route | None) -> Route:
    if answer is not None and route is None:
        return lambda method, path, _body: answer(method, path)
    if route is not None and answer is None:
        return route
    raise TypeError("a ScriptedServer answers by either answer or route")


@contextlib.contextmanager
def scripted(
    answer: Answer | None = None, *, route: Route | None = None
) -> Iterator[ScriptedServer]:
    server = ScriptedServer(answer, route=route)
    try:
        yield server
    finally:
        server.close()
