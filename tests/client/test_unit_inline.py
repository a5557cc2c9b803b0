"""The client's lookups ask for the NEFF inline (protocol/inline.py): bytes that came
with a lookup are what the next fetch of that blob writes, verified as a download is,
with no second request; an answer without them (a server that does not inline, or a
NEFF too large) is fetched as before; a malformed inline answer is trouble, never a
wrong NEFF (docs/protocol.md#a-file-inline)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support.client_units import delta, digest, no_server_down, open_remote
from support.http_stubs import Reply, scripted

from neffcache.client.local import LocalStore
from neffcache.client.remote import INLINE_MAX
from neffcache.client.stats import STATS
from neffcache.protocol import inline

KEY = "a" * 64
NEFF = os.urandom(5000)


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    no_server_down(monkeypatch)


def entry(data: bytes = NEFF, size: int | None = None) -> bytes:
    files = {"model.neff": {"digest": digest(data), "size": len(data) if size is None else size}}
    return json.dumps({"key": KEY, "files": files, "namespace": "team-a"}).encode()


def inlined(body: bytes, data: bytes, length: bytes | None = None) -> Reply:
    framed = (inline.prefix(body) if length is None else length) + body + data
    return 200, framed, {"Content-Type": inline.MEDIA_TYPE}


def server_of(lookup: Reply) -> Callable[[str, str], Reply]:
    """Answers the entry lookup with ``lookup`` and a blob GET with NEFF."""

    def answer(method: str, path: str) -> Reply:
        if path.startswith("/v1/ns/team-a/entries/"):
            return lookup
        if path == f"/v1/blobs/{digest(NEFF)}":
            return 200, NEFF
        return 404, b'{"detail": "no"}'

    return answer


def test_a_lookup_asks_for_the_neff_inline(tmp_path: Path) -> None:
    with scripted(server_of((200, entry()))) as server, open_remote(server.url, tmp_path) as r:
        assert r.entry(KEY) is not None
        assert r.alias("d" * 64) is None
    for sent in server.headers:
        assert inline.parse_asked(sent[inline.HEADER.lower()]) == ("model.neff", INLINE_MAX)


def test_an_inline_neff_is_fetched_without_a_second_request(tmp_path: Path) -> None:
    dest = tmp_path / "out" / "model.neff"
    with (
        scripted(server_of(inlined(entry(), NEFF))) as server,
        open_remote(server.url, tmp_path) as remote,
    ):
        found = remote.entry(KEY)
        assert found is not None
        assert found["files"]["model.neff"]["digest"] == digest(NEFF)
        assert remote.fetch(digest(NEFF), len(NEFF), dest)
        assert dest.read_bytes() == NEFF
        assert server.paths == [f"/v1/ns/team-a/entries/{KEY}"]
        # Taken once: the next fetch of it downloads.
        assert remote.fetch(digest(NEFF), len(NEFF), tmp_path / "again")
        assert server.paths[-1] == f"/v1/blobs/{digest(NEFF)}"


def test_an_inline_neff_fills_l1_as_a_download_would(tmp_path: Path) -> None:
    local = LocalStore(tmp_path / "l1")
    with (
        scripted(server_of(inlined(entry(), NEFF))) as server,
        open_remote(server.url, tmp_path) as remote,
    ):
        assert remote.entry(KEY) is not None
        assert remote.fetch_into(local, digest(NEFF), len(NEFF)) == "server"
    assert local.has_blob(digest(NEFF), len(NEFF))
    assert server.hits == 1


def test_inline_bytes_that_do_not_hash_to_the_digest_are_a_miss_and_reported(
    tmp_path: Path,
) -> None:
    wrong = bytes(len(NEFF))  # the manifest's size, other bytes
    dest = tmp_path / "out" / "model.neff"
    before = STATS.snapshot()
    with (
        scripted(server_of(inlined(entry(), wrong))) as server,
        open_remote(server.url, tmp_path) as remote,
    ):
        assert remote.entry(KEY) is not None
        assert not remote.fetch(digest(NEFF), len(NEFF), dest)
        assert server.paths[-1] == f"/v1/blobs/{digest(NEFF)}/mismatch"
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # no temporary file left behind
    assert delta(before, "bad_downloads") == 1


@pytest.mark.parametrize(
    "reply",
    [
        inlined(entry(), NEFF[:-1]),  # shorter than the manifest says
        inlined(entry(NEFF, size=len(NEFF) + 1), NEFF),  # the manifest says otherwise
        (200, entry()),  # a server that does not inline
    ],
    ids=["short", "other-size", "plain"],
)
def test_without_usable_inline_bytes_the_neff_is_downloaded(tmp_path: Path, reply: Reply) -> None:
    dest = tmp_path / "out" / "model.neff"
    with scripted(server_of(reply)) as server, open_remote(server.url, tmp_path) as remote:
        found = remote.entry(KEY)
        assert found is not None
        size = found["files"]["model.neff"]["size"]
        fetched = remote.fetch(digest(NEFF), size, dest)
        assert server.paths[-1] == f"/v1/blobs/{digest(NEFF)}"
    assert fetched == (size == len(NEFF))


@pytest.mark.parametrize("length", [b"1000000000\n", b"-1\n", b""])
def test_an_inline_length_that_does_not_fit_is_trouble(tmp_path: Path, length: bytes) -> None:
    before = STATS.snapshot()
    with (
        scripted(server_of(inlined(entry(), NEFF, length))) as server,
        open_remote(server.url, tmp_path) as remote,
    ):
        assert remote.entry(KEY) is None
        assert not remote.available()  # marked down: the graph compiles locally
    assert delta(before, "server_errors") == 1


def test_bytes_of_another_lookup_are_not_used(tmp_path: Path) -> None:
    other = os.urandom(300)
    with (
        scripted(server_of(inlined(entry(other), other))) as server,
        open_remote(server.url, tmp_path) as remote,
    ):
        assert remote.entry(KEY) is not None
        assert remote.fetch(digest(NEFF), len(NEFF), tmp_path / "neff")
        assert server.paths[-1] == f"/v1/blobs/{digest(NEFF)}"
    assert (tmp_path / "neff").read_bytes() == NEFF


def test_a_fetch_of_another_file_leaves_the_inline_neff_for_its_own(tmp_path: Path) -> None:
    hlo = os.urandom(700)

    def answer(method: str, path: str) -> Reply:
        if path == f"/v1/blobs/{digest(hlo)}":
            return 200, hlo
        return server_of(inlined(entry(), NEFF))(method, path)

    with scripted(answer) as server, open_remote(server.url, tmp_path) as remote:
        assert remote.entry(KEY) is not None
        # The stock layout's files in name order: the HLO before the NEFF.
        assert remote.fetch(digest(hlo), len(hlo), tmp_path / "model.hlo_module.pb")
        assert remote.fetch(digest(NEFF), len(NEFF), tmp_path / "model.neff")
        assert server.paths == [f"/v1/ns/team-a/entries/{KEY}", f"/v1/blobs/{digest(hlo)}"]
    assert (tmp_path / "model.neff").read_bytes() == NEFF
