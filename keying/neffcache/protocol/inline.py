"""A lookup that carries one file of its entry: one answer where a hit took two.

A hit costs a client two requests, the lookup and then the blob it names, and the
second waits for the first. A client that asks (``HEADER``: the name of a file in the
manifest and the most bytes it takes inline) gets, when the entry names that file and
its blob is at most that long and at most ``MAX_BYTES``, one answer of ``MEDIA_TYPE``
(``framed``): the length of the lookup's JSON in decimal and a newline, that JSON, then
the blob's bytes. The length is in the body, not in a header, so that a proxy that
drops headers it does not know cannot separate the two. Anything else is the plain
JSON answer, and the client fetches the blob as before; a server that knows nothing of
this ignores the header. docs/protocol.md has the rules; the client verifies the bytes
against the manifest as it does a download.
"""

from __future__ import annotations

import re

from .patterns import FILE_NAME

HEADER = "X-Neffcache-Inline"
MEDIA_TYPE = "application/x-neffcache-entry-and-file"
# What a server inlines at most, whatever a client asks: a blob this size is one read
# and one write, already held whole in memory when the server verifies it.
MAX_BYTES = 16 * 2**20
# The JSON's length: a lookup's answer is far under a megabyte, so a few digits.
_DIGITS = 12

_ASKED = re.compile(f"({FILE_NAME})=([0-9]{{1,{_DIGITS}}})")


def asked(file: str, max_bytes: int) -> str:
    """The request header's value: inline ``file`` when its blob is at most ``max_bytes``."""
    return f"{file}={max_bytes}"


def parse_asked(value: str) -> tuple[str, int] | None:
    """The file and the most bytes a request asked for inline, within ``MAX_BYTES``;
    None for a value that is not one (the server then answers as if not asked)."""
    match = _ASKED.fullmatch(value.strip())
    if match is None:
        return None
    return match[1], min(int(match[2]), MAX_BYTES)


def prefix(json_body: bytes) -> bytes:
    """What goes before the JSON in an inline answer's body."""
    return b"%d\n" % len(json_body)


def split(body: bytes | bytearray) -> tuple[bytes, memoryview] | None:
    """An inline answer's JSON and a view of the file's bytes in ``body``; None when
    the body does not start with a length that fits it."""
    newline = body.find(b"\n", 0, _DIGITS + 1)
    if newline <= 0 or not body[:newline].isdigit():
        return None
    start = newline + 1
    end = start + int(body[:newline])
    if end > len(body):
        return None
    view = memoryview(body)
    return bytes(view[start:end]), view[end:]
