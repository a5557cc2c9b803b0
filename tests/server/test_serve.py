"""`neffcache serve` as a real process on embedded defaults, and the admin commands."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
from loopback import free_port
from support.served import Server

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]


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


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_protected_mode_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    # 192.0.2.1 is a documentation address: even a broken check could not listen there.
    done = run("serve", "--host", "192.0.2.1", "--port", "9", "--data-dir", str(tmp_path))
    assert done.returncode == 2
    assert "protected mode" in done.stderr
    assert "neffcache admin token create --local" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_admin_token_commands_local_and_remote(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    created = run(
        "admin", "token", "create", "--local", "--data-dir", str(data_dir),
        "--scope", "admin", "--namespace", "*", "--name", "first admin", "--json",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    admin: dict[str, Any] = json.loads(created.stdout)
    assert admin["token"].startswith("nfc_")
    server = Server(data_dir)
    server.start()
    try:
        env = {"NEFFCACHE_TOKEN": admin["token"]}
        remote = run(
            "admin", "token", "create", "--server", server.url,
            "--scope", "write", "--namespace", "team-a", "--json", env=env,
        )  # fmt: skip
        assert remote.returncode == 0, remote.stderr
        writer = json.loads(remote.stdout)
        publish(server.url, "team-a", "b" * 64, b"neff", Authorization=f"Bearer {writer['token']}")
        listed = run("admin", "token", "list", "--server", server.url, "--json", env=env)
        listing = json.loads(listed.stdout)
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


@pytest.mark.e2e
def test_unknown_store_scheme_is_one_line(tmp_path: Path) -> None:
    done = run(
        "serve", "--port", str(free_port()), "--data-dir", str(tmp_path),
        env={"NEFFCACHE_BLOB_URL": "ftp://example/x"},
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown blob store scheme 'ftp'" in done.stderr
    assert "Traceback" not in done.stderr


# --- what serve says: its version, its start-up banner, its log ----------------------

STARTED = "Application startup complete."


def banner_of(log: str) -> list[str]:
    """The banner's lines: from its first line up to uvicorn's first line."""
    lines = log.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("neffcache "))
    rest = lines[first + 1 :]
    end = next(i for i, line in enumerate(rest) if not line.startswith("  "))
    return lines[first : first + 1 + end]


@pytest.mark.e2e
def test_the_version_prints_with_and_without_the_server(tmp_path: Path) -> None:
    from importlib import metadata

    from neffcache.server import __version__

    assert __version__ == metadata.version("neffcache")
    for args in (["--version"], ["serve", "--version"]):
        done = run(*args)
        assert (done.returncode, done.stdout, done.stderr) == (0, f"neffcache {__version__}\n", "")
    # A training image has no server extra: the server's modules cannot be imported.
    without_server = (
        "import sys; sys.modules['neffcache.server'] = None; sys.modules['fastapi'] = None; "
        "from neffcache.client.cli import main; sys.exit(main(['--version']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", without_server], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, f"neffcache {__version__}\n"), done.stderr


@pytest.mark.e2e
def test_the_banner_of_a_server_without_tokens(server: Server) -> None:
    from neffcache.server import __version__

    log = server.log.read_text()
    assert log.count(f"neffcache {__version__} on ") == 1
    assert log.index(f"neffcache {__version__} on ") < log.index(STARTED)
    shown = banner_of(log)
    assert shown[0] == f"neffcache {__version__} on 127.0.0.1:{server.port}"
    fields = {line[2:13].strip(): line[13:] for line in shown[1:] if line[2:13].strip()}
    assert fields == {
        "data": str(server.data_dir),
        "clients": f"NEFFCACHE_URL=neffcache+http://127.0.0.1:{server.port}/<namespace>",
        "auth": "open: this server has no token, so anyone who can reach it on",
        "dashboard": f"http://127.0.0.1:{server.port}/",
    }
    said = " ".join(line.strip() for line in shown)
    assert "loopback only" in said
    command = f"neffcache admin token create --server {server.url} --scope admin --namespace '*'"
    assert command in said
    assert httpx.get(fields["dashboard"]).status_code == 200


@pytest.mark.e2e
def test_the_banner_with_tokens_and_store_urls_keeps_their_secrets(
    tmp_path: Path, redis_server: str
) -> None:
    import redis

    admin_secret = "nfc_bootstrap_0123456789-do-not-print"
    password = "index-password-do-not-print"
    index_url = redis_server.replace("redis://", f"redis://default:{password}@")
    env = {"NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN": admin_secret, "NEFFCACHE_INDEX_URL": index_url}
    running = Server(tmp_path / "data", env)
    running.start()
    try:
        assert httpx.get(f"{running.url}/v1/admin/tokens").status_code == 401
    finally:
        running.kill()
        redis.Redis.from_url(redis_server).flushdb()  # the session's Redis, shared
    log = running.log.read_text()
    assert admin_secret not in log
    assert password not in log
    shown = banner_of(log)
    fields = {line[2:13].strip(): line[13:] for line in shown[1:] if line[2:13].strip()}
    assert fields["blobs"] == (tmp_path / "data").as_uri()
    assert fields["index"] == redis_server.replace("redis://", "redis://default:***@")
    assert fields["auth"] == "tokens: every request needs one (clients: NEFFCACHE_TOKEN)"
    assert fields["clients"] == (
        f"NEFFCACHE_URL=neffcache+http://127.0.0.1:{running.port}/<namespace>"
    )
    assert "data" not in fields
    assert "anyone who can reach it" not in " ".join(shown)  # the open mode's words


@pytest.mark.e2e
def test_a_port_in_use_is_one_line_before_any_start_up(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("serve", "--port", str(port), "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("neffcache serve: error: ")
    assert f"port {port} on 127.0.0.1 is already in use" in line
    assert "--port" in line
    assert "startup" not in done.stderr.lower()
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_refusals_admin_changes_and_evictions_are_logged(tmp_path: Path) -> None:
    """At info level, one line each, with the access log off (the default)."""
    # No background passes: the one asked for below is the only eviction.
    server = Server(tmp_path / "data", {"NEFFCACHE_EVICTION_INTERVAL_SECONDS": "0"})
    server.start()
    try:
        _refuse_change_and_evict(server)
    finally:
        server.kill()


def _refuse_change_and_evict(server: Server) -> None:
    url = server.url
    made = httpx.post(f"{url}/v1/admin/namespaces/team-a", json={"quota_bytes": 3000})
    assert made.status_code == 201, made.text
    keys = ["c" * 64, "d" * 64]
    for key in keys:
        publish(url, "team-a", key, os.urandom(2000))
    swept = httpx.post(f"{url}/v1/admin/evict", json={"dry_run": False}, timeout=30)
    assert swept.status_code == 200, swept.text
    (evicted,) = [v["key"] for v in swept.json()["removed"]["entries"]]
    token = httpx.post(
        f"{url}/v1/admin/tokens", json={"scope": "read", "namespaces": ["team-a"], "name": "ci"}
    ).json()
    kept = next(k for k in keys if k != evicted)
    assert httpx.get(f"{url}/v1/ns/team-a/entries/{kept}").status_code == 401
    stranger = f"nfc_{'0' * 12}_not-a-real-secret"
    bearer = {"Authorization": f"Bearer {stranger}"}
    assert httpx.get(f"{url}/v1/admin/namespaces", headers=bearer).status_code == 401
    reader = {"Authorization": f"Bearer {token['token']}"}
    assert httpx.get(f"{url}/v1/admin/namespaces", headers=reader).status_code == 403

    lines = server.log.read_text().splitlines()
    info = [line.split(None, 1)[1] for line in lines if line.startswith("INFO:")]
    expected = [
        'audit: namespace.create team-a by anonymous {"set":{"quota_bytes":3000}}',
        f"audit: evict team-a/{evicted} by anonymous ",
        f"audit: token.create {token['token_id']} by anonymous ",
        f"refused GET /v1/ns/team-a/entries/{kept} (401, anonymous): this server needs a token",
        "refused GET /v1/admin/namespaces (401, token 000000000000): unknown or revoked token",
        f"refused GET /v1/admin/namespaces (403, token {token['token_id']}): ",
    ]
    for start in expected:
        assert [line for line in info if line.startswith(start)], (start, info)
    assert token["token"] not in "\n".join(lines)
    assert stranger not in "\n".join(lines)


def test_operations_md_shows_the_banner_serve_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    from docs.doctext import ROOT, transcripts

    from neffcache.server import __version__
    from neffcache.server.banner import banner
    from neffcache.server.settings import ServerSettings

    for name in [n for n in os.environ if n.startswith("NEFFCACHE_")]:
        monkeypatch.delenv(name)
    path = ROOT / "docs" / "operations.md"
    (output,) = [out for line, out in transcripts(path) if line.startswith("neffcache serve")]
    shown = banner_of(output)
    shown[0] = re.sub(r"^neffcache \S+ on", f"neffcache {__version__} on", shown[0])
    settings = ServerSettings(host="0.0.0.0", data_dir="/var/lib/neffcache")
    printed = banner(
        settings, port=8787, tokens=True, version=__version__, host_name="ip-10-0-0-5.ec2.internal"
    )
    assert shown == printed
