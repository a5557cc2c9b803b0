"""`neffcache serve` as a real process on embedded defaults, and the admin commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
from loopback import free_port, wait_healthy

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]


class Server:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        # A file, not a pipe: uvicorn logs every request, and an undrained pipe would
        # eventually block the server.
        self.log = data_dir.parent / f"server-{self.port}.log"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [*NEFFCACHE, "serve", "--port", str(self.port), "--data-dir", str(self.data_dir)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        if not wait_healthy(self.process, self.url):
            self.kill()
            raise AssertionError(f"the server did not start: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "data")
    running.start()
    yield running
    running.kill()


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def publish(url: str, namespace: str, key: str, neff: bytes, **headers: str) -> None:
    assert (
        httpx.put(f"{url}/v1/blobs/{digest(neff)}", content=neff, headers=headers).status_code
        == 201
    )
    body = {"key": key, "files": {"model.neff": {"digest": digest(neff), "size": len(neff)}}}
    response = httpx.put(f"{url}/v1/ns/{namespace}/entries/{key}", json=body, headers=headers)
    assert response.status_code == 201


def test_entries_survive_a_killed_server(server: Server) -> None:
    neff = os.urandom(3 * 2**20)
    publish(server.url, "team-a", "a" * 64, neff)
    assert httpx.get(f"{server.url}/readyz").json() == {"status": "ready"}
    server.kill()
    # What a killed upload leaves: a file in the dead process's staging area.
    staging = server.data_dir / "staging"
    dead_areas = [p for p in staging.iterdir() if p.is_dir()]
    assert dead_areas
    leftover = dead_areas[0] / "upload-killed-midway"
    leftover.write_bytes(b"partial")
    server.start()
    entry = httpx.get(f"{server.url}/v1/ns/team-a/entries/{'a' * 64}").json()
    blob = httpx.get(f"{server.url}/v1/blobs/{entry['files']['model.neff']['digest']}")
    assert blob.content == neff
    assert not leftover.exists()
    assert not any(area.exists() for area in dead_areas)
    assert (server.data_dir / "index.db").exists()
    assert (server.data_dir / "blobs").is_dir()


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NEFFCACHE, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def test_protected_mode_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    # 192.0.2.1 is a documentation address: even a broken check could not listen there.
    done = run("serve", "--host", "192.0.2.1", "--port", "9", "--data-dir", str(tmp_path))
    assert done.returncode == 2
    assert "protected mode" in done.stderr
    assert "neffcache admin token create --local" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_admin_token_commands_local_and_remote(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    created = run(
        "admin", "token", "create", "--local", "--data-dir", str(data_dir),
        "--scope", "admin", "--namespace", "*", "--name", "first admin",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    admin: dict[str, Any] = json.loads(created.stdout)
    assert admin["token"].startswith("nfc_")
    server = Server(data_dir)
    server.start()
    try:
        env = {"NEFFCACHE_ADMIN_TOKEN": admin["token"]}
        remote = run(
            "admin", "token", "create", "--server", server.url,
            "--scope", "write", "--namespace", "team-a", env=env,
        )  # fmt: skip
        assert remote.returncode == 0, remote.stderr
        writer = json.loads(remote.stdout)
        publish(server.url, "team-a", "b" * 64, b"neff", Authorization=f"Bearer {writer['token']}")
        listing = json.loads(run("admin", "token", "list", "--server", server.url, env=env).stdout)
        assert {t["token_id"] for t in listing["tokens"]} == {admin["token_id"], writer["token_id"]}
        revoked = run(
            "admin", "token", "revoke", writer["token_id"], "--server", server.url, env=env
        )
        assert revoked.returncode == 0, revoked.stderr
        blocked = httpx.get(
            f"{server.url}/v1/ns/team-a/entries/{'b' * 64}",
            headers={"Authorization": f"Bearer {writer['token']}"},
        )
        assert blocked.status_code == 401
        denied = run("admin", "token", "list", "--server", server.url)
        assert denied.returncode == 2
        assert "401" in denied.stderr
    finally:
        server.kill()


def test_unknown_store_scheme_is_one_line(tmp_path: Path) -> None:
    done = run(
        "serve", "--port", str(free_port()), "--data-dir", str(tmp_path),
        env={"NEFFCACHE_BLOB_URL": "ftp://example/x"},
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown blob store scheme 'ftp'" in done.stderr
    assert "Traceback" not in done.stderr
