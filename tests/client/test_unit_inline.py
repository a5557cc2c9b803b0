"""The client's lookups ask for the NEFF inline (protocol/inline.py): bytes that came
with a lookup are what the next fetch of that blob writes, verified as a download is,
with no second request; an answer without them (a server that does not inline, or a
NEFF too large) is fetched as before; a malformed inline answer is trouble, never a
wrong NEFF. And against what a server, a proxy or the host may do: an answer's media
type with parameters or rewritten on the way, a blob of the entry already in L1 before
the NEFF's turn, an answer nested past the parser's depth, a NEFF that takes the
download's own time to arrive, manifests with hostile fields, and another rank holding
the key's lookup lock: each is a hit or a miss, never an exception, a wrong NEFF or a
second download (docs/protocol.md#a-file-inline)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.client_units import Clock, closing_remotes, delta, digest, no_server_down, open_remote
from support.http_stubs import Reply, scripted

from neffcache.client import local as local_module
from neffcache.client.config import ClientConfig
from neffcache.client.http import Connection
from neffcache.client.local import LocalStore
from neffcache.client.prewarm import Graph, Prewarmer
from neffcache.client.remote import _MIN_RATE, INLINE_MAX, lookup_seconds
from neffcache.client.session import Session
from neffcache.client.stats import STATS
from neffcache.client.wrapper import parse
from neffcache.protocol import inline

KEY = "a" * 64
NEFF = os.urandom(5000)
ENTRY_PATH = f"/v1/ns/team-a/entries/{KEY}"
NEFF_PATH = f"/v1/blobs/{digest(NEFF)}"


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    no_server_down(monkeypatch)
    with closing_remotes(monkeypatch):
        yield


def entry(
    data: bytes = NEFF, size: int | None = None, *, files: dict[str, Any] | None = None
) -> bytes:
    """A lookup's JSON naming ``data`` as its NEFF (of ``size``, if another), or ``files``."""
    named = files or {
        "model.neff": {"digest": digest(data), "size": len(data) if size is None else size}
    }
    return json.dumps({"key": KEY, "files": named, "namespace": "team-a"}).encode()


def inlined(
    body: bytes,
    data: bytes = NEFF,
    length: bytes | None = None,
    media_type: str | None = inline.MEDIA_TYPE,
) -> Reply:
    """An inline answer: ``body`` framed (or after ``length``), then ``data``."""
    framed = (inline.prefix(body) if length is None else length) + body + data
    return 200, framed, {} if media_type is None else {"Content-Type": media_type}


def server_of(lookup: Reply, blobs: dict[str, bytes] | None = None) -> Callable[[str, str], Reply]:
    """Answers entry lookups with ``lookup``, ``/readyz``, and blob GETs from ``blobs``
    (the NEFF by default)."""
    held = {digest(NEFF): NEFF} if blobs is None else blobs

    def answer(method: str, path: str) -> Reply:
        if path.startswith("/v1/ns/team-a/entries/"):
            return lookup
        if path == "/readyz":
            return 200, b"{}"
        if path.startswith("/v1/blobs/") and path[len("/v1/blobs/") :] in held:
            return 200, held[path[len("/v1/blobs/") :]]
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


def config_for(url: str, tmp_path: Path) -> ClientConfig:
    made = ClientConfig.from_env(
        {
            "NEFFCACHE_URL": f"neffcache+{url}/team-a",
            "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
            "NEFFCACHE_TIMEOUT": "5",
            "NEFFCACHE_CONNECT_TIMEOUT": "1",
            "NEFFCACHE_TELEMETRY": "0",  # no events sent after the stand-in server stopped
        }
    )
    assert made is not None
    return made


def sorted_before(data: bytes) -> bytes:
    """Bytes whose digest sorts before ``data``'s: fetched first by prewarm, which
    fetches an entry's blobs in digest order."""
    n = 0
    while digest(b"compile flags %d" % n) >= digest(data):
        n += 1
    return b"compile flags %d" % n


# --- the answer's media type --------------------------------------------------------


@pytest.mark.parametrize(
    "media_type",
    [
        f"{inline.MEDIA_TYPE}; charset=utf-8",  # a parameter, as a proxy may add
        inline.MEDIA_TYPE.upper(),  # media types are case-insensitive (RFC 9110 8.3.1)
        "application/octet-stream",  # rewritten by a proxy that does not know it
        None,  # dropped by a proxy
    ],
    ids=["parameter", "upper-case", "rewritten", "dropped"],
)
def test_a_framed_answer_is_read_whatever_its_content_type_became(
    tmp_path: Path, media_type: str | None
) -> None:
    # The body says it is framed (a JSON object never starts with a digit), as the
    # length in the body is meant to survive a proxy (protocol/inline.py).
    before = STATS.snapshot()
    with (
        scripted(server_of(inlined(entry(), media_type=media_type))) as server,
        open_remote(server.url, tmp_path) as remote,
    ):
        found = remote.entry(KEY)
        assert found is not None, "a hit read as a broken server"
        assert remote.available(), "the server is skipped for the back-off"
        assert remote.fetch(digest(NEFF), len(NEFF), tmp_path / "model.neff")
        assert server.paths == [ENTRY_PATH]
    assert (tmp_path / "model.neff").read_bytes() == NEFF
    assert delta(before, "server_errors") == 0


# --- one download per blob ----------------------------------------------------------


def test_a_blob_already_in_l1_leaves_the_inline_neff_for_its_own_fetch(tmp_path: Path) -> None:
    flags = sorted_before(NEFF)
    local = LocalStore(tmp_path / "l1")
    (tmp_path / "flags").write_bytes(flags)
    local.add_blob(tmp_path / "flags", digest(flags))
    files = {
        "compile_flags.json": {"digest": digest(flags), "size": len(flags)},
        "model.neff": {"digest": digest(NEFF), "size": len(NEFF)},
    }
    with (
        scripted(server_of(inlined(entry(files=files)))) as server,
        open_remote(server.url, tmp_path) as remote,
    ):
        assert remote.entry(KEY) is not None
        assert remote.fetch_into(local, digest(flags), len(flags)) == "l1"
        assert remote.fetch_into(local, digest(NEFF), len(NEFF)) == "server"
        assert NEFF_PATH not in server.paths, "the NEFF came inline, then again as a download"
    assert local.has_blob(digest(NEFF), len(NEFF))


def test_prewarm_downloads_an_inline_neff_once_when_l1_holds_its_flags(tmp_path: Path) -> None:
    # The flags file is the same for every graph compiled with the same flags: the
    # graphs prewarmed before this one left it in L1.
    flags = sorted_before(NEFF)
    files = {
        "compile_flags.json": {"digest": digest(flags), "size": len(flags)},
        "model.neff": {"digest": digest(NEFF), "size": len(NEFF)},
    }
    with scripted(server_of(inlined(entry(files=files)))) as server:
        prewarmer = Prewarmer(config_for(server.url, tmp_path))
        (tmp_path / "flags").write_bytes(flags)
        prewarmer.local.add_blob(tmp_path / "flags", digest(flags))
        try:
            assert prewarmer.graph(Graph(ids=(("key", KEY),))) == "fetched"
        finally:
            prewarmer.remote.close()
        assert NEFF_PATH not in server.paths, "the NEFF came inline, then again as a download"
    assert prewarmer.local.has_blob(digest(NEFF), len(NEFF))


# --- answers the client cannot parse ------------------------------------------------


@pytest.mark.parametrize("framing", ["plain", "framed"])
def test_an_answer_nested_past_the_parsers_depth_is_a_miss(tmp_path: Path, framing: str) -> None:
    nested = b"[" * 200_000
    reply: Reply = (200, nested) if framing == "plain" else inlined(nested)
    with scripted(server_of(reply)) as server, open_remote(server.url, tmp_path) as remote:
        assert remote.entry(KEY) is None  # not RecursionError: remote.py's contract


# --- time ---------------------------------------------------------------------------


def test_a_lookup_asking_for_8_mib_inline_has_the_time_a_download_of_them_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download gets the timeout plus a second per 8 MiB (remote._MIN_RATE): a slow
    link is not a dead server. The lookup that now carries those bytes gets the bare
    timeout, so a link that delivered the NEFF before now marks the server down for
    every process of the host."""
    budgets: list[float | None] = []
    request = Connection.request

    def spy(self: Connection, method: str, path: str, **kwargs: Any) -> Any:
        budgets.append(kwargs.get("timeout"))
        return request(self, method, path, **kwargs)

    monkeypatch.setattr(Connection, "request", spy)
    with (
        scripted(server_of(inlined(entry()))) as server,
        open_remote(server.url, tmp_path, timeout=2.0) as remote,
    ):
        assert remote.entry(KEY) is not None
    budget = budgets[0] if budgets[0] is not None else remote.config.timeout
    assert budget >= remote.config.timeout + INLINE_MAX / _MIN_RATE


# --- hostile manifests in a framed answer: checked before the bytes are kept ---------


@pytest.mark.parametrize(
    "ref",
    [
        {"digest": "../../etc/passwd", "size": len(NEFF)},
        {"digest": digest(NEFF), "size": str(len(NEFF))},
        {"digest": digest(NEFF), "size": -1},
        {"digest": digest(NEFF), "size": 1 << 50},
        {"digest": digest(NEFF), "size": True},
        {"digest": digest(NEFF).upper(), "size": len(NEFF)},
        "model.neff",
        [digest(NEFF), len(NEFF)],
    ],
    ids=["path", "size-str", "negative", "huge", "bool", "upper-hex", "str", "list"],
)
def test_a_framed_answer_with_a_hostile_neff_reference_is_refused_whole(
    tmp_path: Path, ref: object
) -> None:
    before = STATS.snapshot()
    dest = tmp_path / "out" / "model.neff"
    with (
        scripted(server_of(inlined(entry(files={"model.neff": ref})))) as server,
        open_remote(server.url, tmp_path) as remote,
    ):
        assert remote.entry(KEY) is None
        # Nothing kept from a refused manifest: the NEFF's fetch downloads it.
        assert remote.fetch(digest(NEFF), len(NEFF), dest)
        assert server.paths == [ENTRY_PATH, NEFF_PATH]
    assert dest.read_bytes() == NEFF
    assert delta(before, "bad_manifests") == 1


@pytest.mark.parametrize("files", [[], "model.neff", {}, None])
def test_a_framed_answer_whose_files_are_not_a_mapping_is_a_miss(
    tmp_path: Path, files: object
) -> None:
    body = json.dumps({"key": KEY, "files": files}).encode()
    with scripted(server_of(inlined(body))) as server, open_remote(server.url, tmp_path) as remote:
        assert remote.entry(KEY) is None
        assert remote.available()  # a bad manifest, not a broken server


# --- the host's lookup lock: a bounded wait ------------------------------------------


def test_a_lookup_lock_held_elsewhere_is_waited_for_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another rank holding ``lookup-<key>`` (stuck, say, behind a slow server) delays
    this one by the timeout and a second at most; then it asks for itself."""
    clock = Clock().install(monkeypatch, local_module)
    out = tmp_path / "out" / "graph.neff"
    out.parent.mkdir(parents=True)
    graph = Path(__file__).resolve().parents[1] / "fixtures" / "hlo" / "block_a.pb"
    call = parse(["compile", "--framework=XLA", "--target=trn1", str(graph), "--output", str(out)])
    assert call is not None
    before = STATS.snapshot()
    with scripted(server_of(inlined(entry()))) as server:
        config = config_for(server.url, tmp_path)
        held = LocalStore(config.local_dir).acquire(f"lookup-{KEY}", "another rank")
        assert held is not None
        try:
            session = Session(config, "/bin/false", call)
            assert session._hit(KEY, alias=False)
        finally:
            os.close(held)
        assert server.paths == [ENTRY_PATH]
    assert out.read_bytes() == NEFF
    assert clock.now <= lookup_seconds(config) + 1.0 + 0.1
    assert delta(before, "lock_wait_timeouts") == 1
