"""A full disk under a real ``neffcache serve``. The test
mounts a small tmpfs (it runs as root, as CI does; it is skipped, saying why, where
``mount`` is not permitted) and fills it with a filler file, once under the blob store
(the SQLite index elsewhere) and once under the SQLite index (the blobs elsewhere).

Nothing lost, blob store full: an upload that does not fit is ``507`` (whether the
disk is full before it starts or fills up midway), leaves no upload file in staging
and no blob; a publish while it is full is ``201`` with a complete entry or ``507``
with none; entries stored before read back byte-identical; and once the filler is
deleted the same upload is ``201`` and its entry publishes and reads back.

Nothing lost, index full: a publish that SQLite cannot write answers promptly
(within the HTTP client's 30 s, never a hang) with ``507``, and leaves no entry;
entries stored before still read back byte-identical; and once space returns the same
publish is ``201`` and reads back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults.support import Server, answer_status, digest, running_server_with

pytestmark = pytest.mark.e2e

DISK = 8 * 2**20  # the tmpfs's size
VERSION = "2.20.9961.0+0acef03a"
NAMESPACE = "team-a"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 8 MiB tmpfs at ``tmp_path/disk``, unmounted afterwards."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small filesystem to fill")
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0755", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        unmounted = subprocess.run(["umount", str(mountpoint)], capture_output=True, check=False)
        if unmounted.returncode != 0:  # something still holds it: detach it anyway
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` with a filler file until writes fail, then give back ``leave``
    bytes (rounded to the filesystem's blocks)."""
    filler = disk / "filler"
    block = os.urandom(64 * 1024)
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                written = f.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
            if not written:
                break
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def free_bytes(disk: Path) -> int:
    st = os.statvfs(disk)
    return st.f_bavail * st.f_frsize


def upload(port: int, data: bytes) -> int | None:
    """``PUT /v1/blobs/<digest>`` over a raw socket, the body sent by another thread, so
    that an answer sent before the body ends (507 midway) is read; its status, or None
    when the server closed without one."""
    head = (
        f"PUT /v1/blobs/{digest(data)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:

        def send() -> None:
            with contextlib.suppress(OSError):  # the server may stop reading after 507
                sock.sendall(head + data)

        sender = threading.Thread(target=send)
        sender.start()
        try:
            return answer_status(sock)
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the sender stops, if still sending
            sender.join(timeout=30)


def manifest_for(key: str, files: dict[str, bytes], **extra: Any) -> dict[str, Any]:
    return {
        "key": key,
        "components": {"compiler_version": VERSION, "target": "trn2", "flags": [], "env": {}},
        "files": {
            name: {"digest": digest(data), "size": len(data)} for name, data in files.items()
        },
        **extra,
    }


def publish(server: Server, files: dict[str, bytes], **extra: Any) -> tuple[str, int]:
    """Upload ``files`` (they must fit) and publish an entry of them: its key, status."""
    for data in files.values():
        assert server.http.put(f"/v1/blobs/{digest(data)}", content=data).status_code in (200, 201)
    key = os.urandom(32).hex()
    put = server.http.put(
        f"/v1/ns/{NAMESPACE}/entries/{key}", json=manifest_for(key, files, **extra)
    )
    return key, put.status_code


def assert_reads_back(server: Server, key: str, files: dict[str, bytes]) -> None:
    got = server.http.get(f"/v1/ns/{NAMESPACE}/entries/{key}")
    assert got.status_code == 200
    assert got.json()["files"] == manifest_for(key, files)["files"]
    for data in files.values():
        blob = server.http.get(f"/v1/blobs/{digest(data)}")
        assert blob.status_code == 200
        assert blob.content == data


def assert_nothing_kept(server: Server, data: bytes) -> None:
    assert server.wait_until_unstaged() == []
    assert server.http.head(f"/v1/blobs/{digest(data)}").status_code == 404
    assert not server.blob_path(digest(data)).exists()


def test_a_full_blob_store_is_507_keeps_nothing_and_recovers(
    small_disk: Path, tmp_path: Path
) -> None:
    """Nothing lost (module docstring, blob store full): 507 with nothing partial,
    whether the disk is full from the first byte or fills up midway; old entries
    intact; uploads and publishes work again once space is freed."""
    index = f"sqlite://{tmp_path / 'index.db'}"
    with running_server_with(small_disk, index_url=index) as server:
        before = {"model.neff": os.urandom(1 << 20), "model.hlo_module.pb": os.urandom(4096)}
        old_key, status = publish(server, before)
        assert status == 201

        # Full from the first byte: even a small blob does not fit.
        filler = fill(small_disk)
        small = os.urandom(64 * 1024)
        assert upload(server.port, small) == 507
        assert_nothing_kept(server, small)

        # Room for part of it: the upload fills the disk midway.
        filler.unlink()
        filler = fill(small_disk, leave=1 << 20)
        assert 0 < free_bytes(small_disk) < 2 << 20
        big = os.urandom(3 << 20)
        assert upload(server.port, big) == 507
        assert_nothing_kept(server, big)

        # A publish while full (its blobs are there): complete, or refused and absent.
        key = os.urandom(32).hex()
        put = server.http.put(f"/v1/ns/{NAMESPACE}/entries/{key}", json=manifest_for(key, before))
        assert put.status_code in (201, 507)
        if put.status_code == 507:
            assert server.http.get(f"/v1/ns/{NAMESPACE}/entries/{key}").status_code == 404
        else:
            assert_reads_back(server, key, before)

        assert_reads_back(server, old_key, before)

        filler.unlink()  # space returns
        assert upload(server.port, big) == 201
        assert upload(server.port, small) == 201
        new_key, status = publish(server, {"model.neff": big, "extra.bin": small})
        assert status == 201
        assert_reads_back(server, new_key, {"model.neff": big, "extra.bin": small})
        assert_reads_back(server, old_key, before)
        assert server.staged() == []


def test_a_full_index_disk_is_507_keeps_nothing_and_recovers(
    small_disk: Path, tmp_path: Path
) -> None:
    """Nothing lost (module docstring, index full): each publish SQLite cannot write is
    a prompt 507 and leaves no entry; the earlier entries read back; after space
    returns the refused publish succeeds."""
    blobs = (tmp_path / "blobs").as_uri()
    index = f"sqlite://{small_disk / 'index.db'}"
    with running_server_with(tmp_path / "data", blob_url=blobs, index_url=index) as server:
        server.http.timeout = httpx.Timeout(30)  # a hang fails the test, it does not wait
        files = {"model.neff": os.urandom(256 * 1024)}
        old_key, status = publish(server, files)
        assert status == 201
        filler = fill(small_disk)

        # Manifests padded to 256 KiB, so that every publish must grow the index
        # (SQLite's write-ahead log); the first ones may still fit in its free pages.
        refused: list[str] = []
        accepted: list[str] = []
        for _ in range(40):
            key, status = publish(server, files, notes="x" * (256 * 1024))
            assert status in (201, 507), f"a full index answered {status}"
            (accepted if status == 201 else refused).append(key)
            if len(refused) >= 3:
                break
        assert refused, "the index never ran out of space"
        for key in refused:
            assert server.http.get(f"/v1/ns/{NAMESPACE}/entries/{key}").status_code == 404
        for key in [old_key, *accepted]:
            assert_reads_back(server, key, files)

        filler.unlink()
        again = server.http.put(
            f"/v1/ns/{NAMESPACE}/entries/{refused[0]}",
            json=manifest_for(refused[0], files, notes="x" * (256 * 1024)),
        )
        assert again.status_code == 201
        assert_reads_back(server, refused[0], files)
        assert_reads_back(server, old_key, files)
