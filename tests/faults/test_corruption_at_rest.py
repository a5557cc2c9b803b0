"""Corruption at rest on the filesystem blob store of a
real ``neffcache serve``, seen by the real client (``neffcache.client.remote.Remote``).

Nothing lost, for a flipped byte, truncation, same-size garbage and a blob deleted
under its index row, each for a blob hashed before the answer (small) and one hashed as
it streams (over 16 MiB): the bad bytes are never served (the client's fetch is a miss
and leaves nothing in its L1; a direct GET afterwards is ``404``); the entry lookup
still answers, as protocol.md promises only verified blobs, not checked entries; the
blob is reported missing, so a publisher uploads it again; and that upload heals it:
the same manifest is accepted again and a fetch returns the right bytes, verified.
And found by fsck: `neffcache admin fsck --verify`, run beside the live server before
anything read the blob, names each damage, `--repair` takes the entry out of service,
and after the healing upload fsck finds the store clean.

Already proven elsewhere, not repeated: each change before and after the server
remembered a file as verified, through TestClient (tests/server/test_verified.py), a
first-read corruption on every backend (tests/server/test_api.py) and the client's own
digest check against a server that sends wrong bytes (tests/client/test_unit_remote.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults.support import NEFFCACHE, Server, digest, running_server
from support.client_units import open_remote

from neffcache.client import remote as remote_module

pytestmark = pytest.mark.e2e

SMALL = 64 * 1024
BIG = 17 * 2**20  # over the server's verify-first size: hashed as it streams


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("corruption") / "data") as running:
        yield running


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    # The back-off table is per process: each test starts with no server marked down.
    monkeypatch.setattr(remote_module, "_down_until", {})


def flip(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 1)


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


def delete(path: Path) -> None:
    path.unlink()


CHANGES: dict[str, Callable[[Path], None]] = {
    "flipped byte": flip,
    "truncated": truncate,
    "same-size garbage": garbage,
    "deleted under its entry": delete,
}


def publish_and_damage(
    server: Server, change: str, size: int, tmp_path: Path
) -> tuple[bytes, Path, str, dict[str, Any]]:
    """Publish an entry of one ``size``-byte blob through the real client, then apply
    ``change`` to the blob's file behind the server's back; the bytes, their source
    file, the key and the manifest."""
    data = os.urandom(size)
    blob = digest(data)
    source = tmp_path / "model.neff"
    source.write_bytes(data)
    key = os.urandom(32).hex()
    manifest: dict[str, Any] = {"key": key, "files": {"model.neff": {"digest": blob, "size": size}}}
    with open_remote(server.url, tmp_path / "writer") as writer:
        assert writer.put_blob(blob, source)
        published = writer.put_entry(key, manifest)
        assert published is not None
        assert published.status == 201
    path = server.blob_path(blob)
    os.chmod(path, 0o644)
    CHANGES[change](path)
    return data, source, key, manifest


@pytest.mark.parametrize("size", [SMALL, BIG], ids=["small", "streamed"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_blob_corrupted_at_rest_is_a_miss_and_heals(
    server: Server, change: str, size: int, tmp_path: Path
) -> None:
    """Nothing lost: the client's fetch is a miss with nothing left in its L1, a GET is
    ``404``, the entry still answers (the client verifies what it names), the blob is
    reported missing, and the next upload of the right bytes heals it: the same
    manifest is accepted and a fetch returns exactly the right bytes."""
    data, source, key, manifest = publish_and_damage(server, change, size, tmp_path)
    blob = digest(data)
    path = server.blob_path(blob)

    l1 = tmp_path / "reader" / "l1" / blob
    with open_remote(server.url, tmp_path / "reader") as reader:
        found = reader.entry(key)  # entries are not checked against their blobs
        assert found is not None
        assert found["files"] == manifest["files"]
        assert not reader.fetch(blob, size, l1)
        if size == SMALL:
            assert reader.available()  # a clean 404: a miss, not trouble
    assert not l1.parent.exists() or list(l1.parent.iterdir()) == []

    # Whatever the first read did (404, or a stream cut off), it is now out of service.
    assert server.http.get(f"/v1/blobs/{blob}").status_code == 404
    assert not path.exists()
    quarantined = list((server.data_dir / "quarantine").glob(f"{blob}.*"))
    assert len(quarantined) == (0 if change == "deleted under its entry" else 1)

    remote_module._down_until.clear()  # a cut-off stream is trouble, and marks it down
    with open_remote(server.url, tmp_path / "healer") as healer:
        assert healer.missing([blob]) == [blob]
        assert healer.put_blob(blob, source)
        again = healer.put_entry(key, manifest)
        assert again is not None
        assert again.status == 200  # the same manifest: immutable, unchanged
        assert healer.fetch(blob, size, tmp_path / "healer" / "l1" / blob)
    assert (tmp_path / "healer" / "l1" / blob).read_bytes() == data
    with server.http.stream("GET", f"/v1/blobs/{blob}") as response:
        assert response.status_code == 200
        assert digest(response.read()) == blob


def fsck(server: Server, *flags: str) -> tuple[int, dict[str, object]]:
    """``neffcache admin fsck --json`` on the server's data directory, as an operator
    runs it on the server's host while it serves."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
    done = subprocess.run(
        [*NEFFCACHE, "admin", "fsck", "--data-dir", str(server.data_dir), "--json", *flags],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 1, 4), done.stderr.decode()
    report: dict[str, object] = json.loads(done.stdout)
    return done.returncode, report


@pytest.mark.parametrize("change", list(CHANGES))
def test_fsck_finds_corruption_at_rest_and_repair_then_upload_heals(
    server: Server, change: str, tmp_path: Path
) -> None:
    """Nothing lost: fsck names the damaged blob (corrupt, when its bytes are there)
    and the entry that names it (dangling, when the blob is gone or short), exit 4;
    ``--repair`` quarantines it and takes the entry out (exit 1), so the graph is a
    miss; one upload and publish later the entry serves the right bytes, and fsck
    says nothing about either."""
    data, source, key, manifest = publish_and_damage(server, change, SMALL, tmp_path)
    blob = digest(data)

    status, found = fsck(server, "--verify")
    assert status == 4
    # Every damage leaves the entry dangling: a blob gone or short is seen from the
    # listing, wrong bytes of the right size only by hashing them (--verify).
    assert [line for line in found["dangling"] if key in line] == [f"team-a/{key}: {blob}"]  # type: ignore[attr-defined]
    assert (blob in found["corrupt"]) is (change != "deleted under its entry")  # type: ignore[operator]

    status, repaired = fsck(server, "--verify", "--repair")
    assert status == 1
    assert repaired["repaired"]["removed"] >= 1  # type: ignore[index]
    assert server.http.get(f"/v1/ns/team-a/entries/{key}").status_code == 404
    assert server.http.get(f"/v1/blobs/{blob}").status_code == 404

    remote_module._down_until.clear()
    with open_remote(server.url, tmp_path / "healer") as healer:
        assert healer.put_blob(blob, source)
        again = healer.put_entry(key, manifest)
        assert again is not None
        assert again.status == 201  # a new entry: the damaged one was taken out
        assert healer.fetch(blob, SMALL, tmp_path / "healer" / "l1" / blob)
    assert (tmp_path / "healer" / "l1" / blob).read_bytes() == data
    _, after = fsck(server, "--verify")
    assert blob not in after["corrupt"]  # type: ignore[operator]
    assert not [line for line in after["dangling"] if key in line]  # type: ignore[attr-defined]
    assert not [line for line in after["undocumented"] if key in line]  # type: ignore[attr-defined]


def test_a_streamed_corrupt_blob_never_completes_over_the_wire(
    server: Server, tmp_path: Path
) -> None:
    """Nothing lost: over a real socket, a corrupt blob over 16 MiB is cut off before
    its last chunk (the HTTP client sees an incomplete body, never a complete response
    of bad bytes), and it is quarantined."""
    data = os.urandom(BIG)
    blob = digest(data)
    assert server.http.put(f"/v1/blobs/{blob}", content=data).status_code == 201
    path = server.blob_path(blob)
    os.chmod(path, 0o644)
    flip(path)
    with pytest.raises(httpx.RemoteProtocolError):
        server.http.get(f"/v1/blobs/{blob}")
    assert server.http.head(f"/v1/blobs/{blob}").status_code == 404
