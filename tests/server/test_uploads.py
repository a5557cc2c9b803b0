"""services/uploads.py without HTTP: a blob's body from an async iterator, kept only
when its length and BLAKE3 are the ones announced, its staging file gone whatever
happens; and small bodies read whole, never past their cap."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import blake3
import pytest

from neffcache.server.auth import TokenPresence
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.errors import BadRequest, TooLarge
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.services import Services
from neffcache.server.services.uploads import read_capped, receive_blob
from neffcache.server.settings import ServerSettings

DATA = b"the bytes of a blob" * 1000
DIGEST = blake3.blake3(DATA).hexdigest()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    blobs, index = FsBlobStore(tmp_path / "blobs"), MemoryIndex()
    settings = ServerSettings(data_dir=tmp_path, max_blob_bytes=len(DATA) * 2)
    try:
        yield Services(settings, blobs, index, TokenPresence(index))
    finally:
        blobs.close()
        index.close()


async def chunks(data: bytes, size: int = 4096) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def receive(services: Services, digest: str, length: int | None, data: bytes) -> bool:
    return asyncio.run(receive_blob(services, digest, length, chunks(data)))


def staged(services: Services) -> list[Path]:
    return list(Path(services.blobs.staging_dir()).iterdir())


def test_a_blob_is_kept_once_and_its_staging_file_removed(services: Services) -> None:
    assert receive(services, DIGEST, len(DATA), DATA) is True
    assert receive(services, DIGEST, len(DATA), DATA) is False
    assert services.blobs.size(DIGEST) == len(DATA)
    assert staged(services) == []


@pytest.mark.parametrize(
    ("length", "data", "message"),
    [
        (None, DATA, "Content-Length is required"),
        (len(DATA) + 1, DATA, f"received {len(DATA)} bytes, Content-Length said"),
        (len(DATA) - 1, DATA, "the body is longer than Content-Length"),
        (len(DATA), DATA[:-1] + b"?", "the body hashes to"),
    ],
    ids=["no-length", "short", "long", "other-bytes"],
)
def test_a_body_not_the_one_announced_is_refused_and_nothing_kept(
    services: Services, length: int | None, data: bytes, message: str
) -> None:
    with pytest.raises(BadRequest, match=message):
        receive(services, DIGEST, length, data)
    assert services.blobs.size(DIGEST) is None
    assert staged(services) == []


def test_a_blob_over_the_limit_is_refused_before_a_byte_is_read(services: Services) -> None:
    read: list[bytes] = []

    async def watched() -> AsyncIterator[bytes]:
        async for chunk in chunks(DATA):
            read.append(chunk)
            yield chunk

    too_many = services.settings.max_blob_bytes + 1
    with pytest.raises(TooLarge, match="over max_blob_bytes"):
        asyncio.run(receive_blob(services, DIGEST, too_many, watched()))
    assert read == []
    assert staged(services) == []


def test_a_small_body_is_read_whole_within_its_cap() -> None:
    assert asyncio.run(read_capped(chunks(b"x" * 10, 3), "10", 10)) == b"x" * 10
    assert asyncio.run(read_capped(chunks(b"x" * 10, 3), None, 10)) == b"x" * 10


@pytest.mark.parametrize(
    ("declared", "error"),
    [("11", TooLarge), (None, TooLarge), ("ten", BadRequest), ("9" * 20, BadRequest)],
)
def test_a_small_body_past_its_cap_or_with_a_bad_length_is_refused(
    declared: str | None, error: type[Exception]
) -> None:
    with pytest.raises(error):
        asyncio.run(read_capped(chunks(b"x" * 11, 3), declared, 10))
