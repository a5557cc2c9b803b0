"""Lookups and blob reads the HTTP protocol answers itself (server/immediate.py), against
uvicorn in a thread with the protocol ``neffcache serve`` runs, on a filesystem store:
every answer is, byte for byte but the date, the answer the app gives the same request;
those answers never reach the app while every other request does; what the protocol
leaves alone (HTTP/1.0, a body, a percent-escape, a range, a blob not verified since it
changed) is answered the usual way, in order; a verified blob's file sent as it is, up
to 16 MiB or larger (filestream.py), arrives whole to a slow reader, before the
requests pipelined behind it, and is cut off if it changes while it is sent; and a
kept-alive connection's head timer starts again after each answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from support.api import ADDRESS, KEY, digest
from support.immediate import (
    Served,
    blob,
    body,
    connect,
    get,
    read_answer,
    serving,
    status,
)

from neffcache.protocol import inline
from neffcache.server.blobs import fs
from neffcache.server.blobs.fs import FsBlobStore

HEAD_TIMEOUT = 30.0
ACCEL = "/_neffcache/blobs"
SMALL = b"a small blob " * 100
MIB = bytes(range(256)) * 4096
# Over 16 MiB: sent with sendfile each time the socket has room (filestream.py).
LARGE = bytes(range(251)) * (17 * 4096 * 4096 // 251 // 16)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data = tmp_path_factory.mktemp("immediate")
    with serving(data, [SMALL, MIB, LARGE], HEAD_TIMEOUT, accel=ACCEL) as served:
        yield served


def without_date(answer: bytes) -> bytes:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(
    served: Served, raw: bytes, answers: int = 1, window: int | None = None
) -> list[bytes]:
    with connect(served, window) as sock:
        sock.sendall(raw)
        pending = bytearray()
        return [without_date(read_answer(sock, pending)) for _ in range(answers)]


def both_ways(served: Served, raw: bytes, answers: int = 1) -> tuple[list[bytes], list[bytes]]:
    """The answers with the protocol's own answers on, then off."""
    on = exchange(served, raw, answers)
    with served.usual_way():
        off = exchange(served, raw, answers)
    return on, off


def test_every_lookup_answer_is_the_apps_byte_for_byte(served: Served) -> None:
    token = f"Authorization: Bearer {served.reader}"
    entry = f"/v1/ns/team-a/entries/{KEY}"
    cases = [
        (get(entry, token), 200),
        (get(f"/v1/ns/team-a/aliases/{ADDRESS}", token), 200),
        (get(f"/v1/ns/team-a/entries/{'b' * 64}", token), 404),
        (get(f"/v1/ns/team-a/aliases/{'c' * 64}", token), 404),
        (get("/v1/ns/team-a/aliases/not-an-alias", token), 400),
        (get(entry), 401),
        (get(entry, "Authorization: Bearer nfc_nonsense"), 401),
        (get(entry, f"Authorization: Bearer {served.other}"), 403),
        (get(entry, token, f"{inline.HEADER}: {inline.asked('model.neff', 1 << 20)}"), 200),
        (get(entry, token, f"{inline.HEADER}: nonsense"), 200),
        (get(entry, token, "Connection: close"), 200),
    ]
    for raw, expected in cases:
        before = len(served.app.paths)
        on, off = both_ways(served, raw)
        assert status(on[0]) == expected, on[0][:200]
        assert on == off, raw
        assert served.app.paths[before:] == [entry_path(raw)], "only the usual way reaches the app"


def entry_path(raw: bytes) -> str:
    return raw.split(b" ", 2)[1].decode()


def test_an_inline_answer_carries_the_file(served: Served) -> None:
    asked = f"{inline.HEADER}: {inline.asked('model.neff', 1 << 20)}"
    raw = get(f"/v1/ns/team-a/entries/{KEY}", f"Authorization: Bearer {served.reader}", asked)
    (answer,) = exchange(served, raw)
    assert inline.MEDIA_TYPE.encode() in answer.partition(b"\r\n\r\n")[0]
    assert answer.endswith(b"the neff of " + KEY.encode())


def test_what_the_protocol_leaves_alone_reaches_the_app_and_is_answered_alike(
    served: Served,
) -> None:
    token = f"Authorization: Bearer {served.reader}"
    entry = f"/v1/ns/team-a/entries/{KEY}"
    escaped = f"/v1/ns/team-a/entries/{KEY[:-1]}%{ord(KEY[-1]):02X}"
    cases = [
        get(entry, token, version="1.0"),
        get(entry, token, "Content-Length: 3") + b"abc",
        get(escaped, token),
    ]
    for raw in cases:
        before = len(served.app.paths)
        on, off = both_ways(served, raw)
        assert status(on[0]) == 200, on[0][:200]
        assert on == off
        assert len(served.app.paths) - before == 2, "both ways went through the app"


def test_pipelined_lookups_are_answered_in_order(served: Served) -> None:
    token = f"Authorization: Bearer {served.reader}"
    miss = get(f"/v1/ns/team-a/entries/{'b' * 64}", token)
    hit = get(f"/v1/ns/team-a/entries/{KEY}", token)
    health = get("/healthz")
    raw = miss + health + hit + hit + miss
    on, off = both_ways(served, raw, answers=5)
    assert [status(a) for a in on] == [404, 200, 200, 200, 404]
    assert on == off


def test_lookups_are_answered_without_the_app_and_the_rest_with_it(served: Served) -> None:
    token = f"Authorization: Bearer {served.reader}"
    before = len(served.app.paths)
    answers = exchange(
        served,
        get(f"/v1/ns/team-a/entries/{KEY}", token)
        + get(f"/v1/ns/team-a/aliases/{ADDRESS}", token)
        + get("/healthz"),
        answers=3,
    )
    assert [status(a) for a in answers] == [200, 200, 200]
    assert served.app.paths[before:] == ["/healthz"]


def test_a_kept_alive_connection_waits_a_whole_head_timeout_after_each_answer(
    served: Served,
) -> None:
    """The head timer stops when a head is complete and starts again when its answer
    is sent: a lookup answered at once must not leave the timer that ran before it."""
    token = f"Authorization: Bearer {served.reader}"
    with connect(served) as sock:
        pending = bytearray()
        sock.sendall(get("/healthz"))
        read_answer(sock, pending)
        time.sleep(0.5)  # at least: a timer left from before the lookup is that much older
        sent = time.monotonic()
        sock.sendall(get(f"/v1/ns/team-a/entries/{KEY}", token))
        assert status(read_answer(sock, pending)) == 200
        mine = [c for c in served.limits.waiting if c.client == sock.getsockname()]
        assert len(mine) == 1, "the connection waits for its next head"
        timer = mine[0]._head_timer
        assert timer is not None
        # The loop's clock is time.monotonic() (in milliseconds under uvloop).
        assert timer.when() >= sent + HEAD_TIMEOUT - 0.01


# --- blobs --------------------------------------------------------------------------


def stored(blobs: FsBlobStore, data: bytes) -> None:
    """``data`` in the store as an upload leaves it, but not through the server: so
    not verified by it."""
    staged = blobs.staging_dir() / f"test-{digest(data)}"
    staged.write_bytes(data)
    assert blobs.commit(staged, digest(data))


def test_a_verified_blobs_file_is_sent_as_the_app_sends_it(served: Served) -> None:
    token = f"Authorization: Bearer {served.reader}"
    for data in (SMALL, MIB, LARGE):
        before = len(served.app.paths)
        on, off = both_ways(served, get(blob(data), token))
        assert status(on[0]) == 200
        assert body(on[0]) == data
        assert on == off
        assert served.app.paths[before:] == [blob(data)], "only the usual way reaches the app"


def test_nginx_in_front_is_told_where_the_file_is_without_the_app(served: Served) -> None:
    token = f"Authorization: Bearer {served.reader}"
    before = len(served.app.paths)
    on, off = both_ways(served, get(blob(MIB), token, "X-Neffcache-Accel: on"))
    assert status(on[0]) == 200
    assert f"x-accel-redirect: {ACCEL}".encode() in on[0]
    assert on == off
    assert served.app.paths[before:] == [blob(MIB)]


def test_blob_reads_the_protocol_leaves_alone_are_answered_alike(served: Served) -> None:
    """A range, an unknown digest: each through the app both ways, with the same
    answer."""
    token = f"Authorization: Bearer {served.reader}"
    cases = [
        (get(blob(MIB), token, "Range: bytes=10-99"), 206),
        (get(blob(LARGE), token, "Range: bytes=17000000-"), 206),
        (get(blob(b"never stored"), token), 404),
    ]
    for raw, expected in cases:
        before = len(served.app.paths)
        on, off = both_ways(served, raw)
        assert status(on[0]) == expected
        assert on == off
        assert len(served.app.paths) - before == 2, "both ways went through the app"


def test_requests_pipelined_behind_a_large_file_are_answered_after_it(served: Served) -> None:
    token = f"Authorization: Bearer {served.reader}"
    lookup = get(f"/v1/ns/team-a/entries/{KEY}", token)
    raw = get(blob(LARGE), token) + lookup + get(blob(SMALL), token) + get(blob(LARGE), token)
    before = len(served.app.paths)
    # A small window: the file fills the socket, and is still being sent when the
    # requests behind it are read.
    on = exchange(served, raw, answers=4, window=4096)
    # Queued behind the file, the rest are answered the usual way, in order.
    assert served.app.paths[before:] == [entry_path(lookup), blob(SMALL), blob(LARGE)]
    with served.usual_way():
        off = exchange(served, raw, answers=4)
    assert [status(a) for a in on] == [200, 200, 200, 200]
    assert [body(a) for a in (on[0], on[2], on[3])] == [LARGE, SMALL, LARGE]
    assert on == off


def test_a_blob_not_verified_yet_is_read_the_usual_way(served: Served) -> None:
    data = b"a blob the server has not read yet"
    stored(served.blobs, data)
    token = f"Authorization: Bearer {served.reader}"
    before = len(served.app.paths)
    (answer,) = exchange(served, get(blob(data), token))
    assert body(answer) == data
    assert served.app.paths[before:] == [blob(data)], "not verified yet: hashed by the app"
    served.verified(data)
    (again,) = exchange(served, get(blob(data), token))
    assert again == answer
    assert served.app.paths[before + 1 :] == [], "verified: sent from its file"


@pytest.mark.parametrize("mib", [12, 20], ids=["written-whole", "streamed"])
def test_a_large_file_reaches_a_slow_reader_whole(served: Served, mib: int) -> None:
    """A reader whose window is small fills the socket: the rest of the file is written
    after the part the kernel took (up to 16 MiB), or sent as the socket takes it."""
    data = bytes(range(199)) * (mib * 1024 * 1024 // 199)
    stored(served.blobs, data)
    token = f"Authorization: Bearer {served.reader}"
    served.verified(data)
    before = len(served.app.paths)
    with connect(served, window=4096) as sock:
        sock.sendall(get(blob(data), token))
        time.sleep(0.2)  # the server writes what the socket takes, and holds the rest
        answer = read_answer(sock, bytearray())
    assert body(answer) == data
    assert served.app.paths[before:] == []


@pytest.mark.parametrize("data", [MIB, LARGE], ids=["1MiB", "over-16MiB"])
def test_a_file_that_changes_while_it_is_sent_is_cut_off_and_hashed_again(
    served: Served, monkeypatch: pytest.MonkeyPatch, data: bytes
) -> None:
    token = f"Authorization: Bearer {served.reader}"
    checks: list[bool] = []
    unchanged_since = fs.OpenBlob.unchanged_since

    def changes_while_sent(self: fs.OpenBlob, stamp: object) -> bool:
        checks.append(True)
        # Unchanged when opened; changed once its bytes were read for sending.
        return len(checks) == 1 and unchanged_since(self, stamp)  # type: ignore[arg-type]

    monkeypatch.setattr(fs.OpenBlob, "unchanged_since", changes_while_sent)
    before = len(served.app.paths)
    with connect(served) as sock:
        sock.sendall(get(blob(data), token))
        received = b""
        while chunk := sock.recv(1 << 20):
            received += chunk
    assert received.startswith(b"HTTP/1.1 200 OK")
    assert len(body(received)) < len(data), "cut off before its last bytes"
    assert served.app.paths[before:] == []
    monkeypatch.setattr(fs.OpenBlob, "unchanged_since", unchanged_since)
    (answer,) = exchange(served, get(blob(data), token))
    assert body(answer) == data
    assert served.app.paths[before:] == [blob(data)], "forgotten as verified: hashed again"
    served.verified(data)  # as the other tests found it


@pytest.mark.parametrize("data", [MIB, LARGE], ids=["1MiB", "over-16MiB"])
def test_a_file_sent_on_a_connection_asked_to_close_ends_it(served: Served, data: bytes) -> None:
    token = f"Authorization: Bearer {served.reader}"
    with connect(served) as sock:
        sock.sendall(get(blob(data), token, "Connection: close"))
        received = b""
        while chunk := sock.recv(1 << 20):  # fails by timeout if the server keeps it
            received += chunk
    assert b"connection: close" in received.partition(b"\r\n\r\n")[0]
    assert body(received) == data
