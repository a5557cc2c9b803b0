"""Request bodies read with a cap, after the caller is known.

FastAPI reads and parses a declared body before any dependency runs, so a large JSON
body would cost memory and CPU even without a token. Routes with small JSON bodies read
them here instead: never more than ``limit`` bytes, and only once authenticated.
"""

from __future__ import annotations

from fastapi import Request

from neffcache.server.errors import BadRequest, TooLarge


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit() or len(declared) > 19:
            raise BadRequest("Content-Length is not a number")
        if int(declared) > limit:
            raise TooLarge(f"this body may be at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"this body may be at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
