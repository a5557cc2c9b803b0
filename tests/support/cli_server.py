"""What the CLI tests (tests/cli) share: the token of their in-thread server, the
requests it recorded, and the CLI's outcome when run in this process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# The server's admin token for '*': with it in place, a request without a token is
# refused, so a command that succeeds has sent the token it was given.
TOKEN = "cli-tests-admin-secret-0123456789abcdef"


class Request(NamedTuple):
    method: str
    target: str  # path and query
    authorization: str | None


@dataclass
class Recorder:
    """An ASGI app that notes each HTTP request before ``app`` answers it."""

    app: Any
    seen: list[Request] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            query = scope["query_string"].decode()
            auth = headers.get(b"authorization")
            self.seen.append(
                Request(
                    scope["method"],
                    scope["path"] + (f"?{query}" if query else ""),
                    auth.decode() if auth else None,
                )
            )
        await self.app(scope, receive, send)


@dataclass
class Server:
    url: str
    recorder: Recorder

    def take(self) -> list[Request]:
        """The requests since the last call."""
        seen, self.recorder.seen = self.recorder.seen, []
        return seen


class Done(NamedTuple):
    code: int
    out: str
    err: str


Run = Callable[..., Done]
