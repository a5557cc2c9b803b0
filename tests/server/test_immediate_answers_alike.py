"""Where the answers the HTTP protocol gives itself (server/immediate.py) must do what
the usual way (an ASGI task and the app) does with the same request: a lookup that
fails is counted once, a small verified blob whose file's stamp moves while it is read
is hashed again and sent whole rather than cut off, and a blob read over TLS arrives
as TLS records. Each is checked with the protocol's own answers on and off,
against uvicorn in a thread with the protocol ``neffcache serve`` runs,
over raw sockets."""

from __future__ import annotations

import datetime
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.api import ADDRESS
from support.immediate import (
    WAIT,
    Served,
    blob,
    connect,
    get,
    read_answer,
    serving,
    status,
)

from neffcache.protocol import inline
from neffcache.server.api import entries
from neffcache.server.blobs import fs

# Longer than any wait here: no connection is closed by the head timer in a test.
HEAD_TIMEOUT = 60.0
SMALL = b"a small blob " * 100
# Larger than the 64 KiB the protocol reads itself (its first part goes with
# sendfile), at most 16 MiB: sent from its file by the protocol.
FILLS = bytes(range(199)) * (12 * 1024 * 1024 // 199)
# Over 16 MiB: sent as the socket takes it (filestream.py).
STREAMED = bytes(range(197)) * (17 * 1024 * 1024 // 197)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("immediate-alike"), [SMALL, FILLS], HEAD_TIMEOUT) as it:
        yield it


@pytest.fixture(params=["on", "off"])
def answers(request: pytest.FixtureRequest, served: Served) -> Iterator[str]:
    """Each test runs with the protocol's own answers on, then off (the usual way)."""
    if request.param == "on":
        yield request.param
        return
    with served.usual_way():
        yield request.param


def entry_hits(served: Served) -> float:
    """``neffcache_entry_requests_total`` for team-a's hits so far."""
    metrics = served.services.metrics
    value: float = metrics.entry_requests.labels(metrics.namespace("team-a"), "hit")._value.get()
    return value


def test_a_lookup_that_fails_is_counted_once(
    served: Served, answers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup whose answer fails after the entry was found (here: reading the file
    asked inline raises) is answered 500 by uvicorn either way; it is one request, one
    hit in the metrics and one use of the entry. The protocol's attempt counted it
    before it failed, then the usual way counted it again."""

    def fails(*_: object) -> bytes:
        raise RuntimeError("reading the inline file failed")

    monkeypatch.setattr(entries, "inlined_file", fails)
    asked = f"{inline.HEADER}: {inline.asked('model.neff', 1 << 20)}"
    raw = get(f"/v1/ns/team-a/aliases/{ADDRESS}", f"Authorization: Bearer {served.reader}", asked)
    before = entry_hits(served)
    with connect(served) as sock:
        sock.sendall(raw)
        assert status(read_answer(sock, bytearray())) == 500
    assert entry_hits(served) - before == 1


def test_a_small_blob_whose_stamp_moves_while_it_is_read_is_answered_whole(
    served: Served, answers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verified blob up to 16 MiB whose file's stamp moved while it was read (a
    chmod, a backup's hard link, a write) is hashed again before anything is sent, and
    sent whole when its bytes are still the blob's (services/blobs.py ``_trusted``).
    The protocol checks the stamp after writing the head, and cuts the answer off."""
    checks: list[bool] = []
    still = fs._still

    def moves_once_read(st: Any, stamp: Any) -> bool:
        checks.append(True)
        # The file as it was opened (open_verified's check) is unchanged; once read, not.
        return len(checks) == 1 and answers == "on" and still(st, stamp)

    monkeypatch.setattr(fs, "_still", moves_once_read)
    try:
        with connect(served) as sock:
            sock.sendall(get(blob(SMALL), f"Authorization: Bearer {served.reader}"))
            received = read_until_closed_or_answered(sock)
    finally:
        monkeypatch.setattr(fs, "_still", still)
        served.verified(SMALL)  # as the other tests find it
    assert status(received) == 200
    assert received.partition(b"\r\n\r\n")[2] == SMALL


def read_until_closed_or_answered(sock: socket.socket) -> bytes:
    """One answer, or what arrived of it before the server closed the connection."""
    pending = bytearray()
    try:
        return read_answer(sock, pending)
    except (AssertionError, ConnectionResetError):
        return bytes(pending)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files in ``folder``."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture
def over_tls(tmp_path: Path) -> Iterator[Served]:
    """The server behind TLS, as uvicorn serves it with a certificate."""
    cert, key = self_signed(tmp_path)
    tls = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    with serving(tmp_path / "data", [SMALL, FILLS, STREAMED], HEAD_TIMEOUT, **tls) as it:
        yield it


@pytest.mark.parametrize("data", [FILLS, STREAMED], ids=["12MiB", "17MiB"])
@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_a_blob_read_over_tls_arrives_whole(over_tls: Served, on: bool, data: bytes) -> None:
    """Over TLS the socket carries records, not the file's bytes: a file sent to it
    with ``sendfile`` breaks the connection (the protocol asks for the raw socket)."""
    if not on:
        over_tls.answers_off()
    before = len(over_tls.app.paths)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", over_tls.port), timeout=WAIT) as raw,
        context.wrap_socket(raw) as sock,
    ):
        sock.sendall(get(blob(data), f"Authorization: Bearer {over_tls.reader}"))
        try:
            received = read_answer(sock, bytearray())
        except (ssl.SSLError, ConnectionResetError) as exc:
            pytest.fail(f"the TLS connection broke: {exc!r}")
    assert status(received) == 200
    assert received.partition(b"\r\n\r\n")[2] == data
    assert len(over_tls.app.paths) - before == (0 if on else 1), "sent by the protocol when on"
