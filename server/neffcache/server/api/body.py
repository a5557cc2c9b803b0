"""Request bodies as the services take them (services/uploads.py): an async iterator
of chunks that stops a stalled or vanished client.

FastAPI reads and parses a declared body before any dependency runs, so a large JSON
body would cost memory and CPU even without a token. Routes with small JSON bodies read
them here instead: never more than ``limit`` bytes, and only once authenticated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from starlette.requests import ClientDisconnect

from neffcache.server.errors import ClientGone, RequestTimeout
from neffcache.server.services import uploads

# How long a request body may go without sending a byte before the request is dropped
# (and its staging file removed): a stalled client must not hold them forever.
BODY_IDLE_SECONDS = 60.0


async def body_chunks(
    request: Request, idle_seconds: float = BODY_IDLE_SECONDS
) -> AsyncIterator[bytes]:
    """The request body's chunks; RequestTimeout if none comes for ``idle_seconds``,
    ClientGone if the client hangs up first."""
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), idle_seconds)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise RequestTimeout(f"the request body stalled for {idle_seconds:.0f} s") from None
        except ClientDisconnect:
            # An aborted upload, not a server fault: answered (to no one) as one.
            raise ClientGone("the client closed the connection before the body ended") from None
        yield chunk


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes (services/uploads.py ``read_capped``)."""
    content_length = request.headers.get("content-length")
    return await uploads.read_capped(body_chunks(request), content_length, limit)
