"""``neffcache admin`` as an admin reads it: each command run through the CLI's entry
point in this process, against a real app over in-memory stores (Starlette's
TestClient standing in for the network), and a closed pipe at the entry point."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
from fastapi.testclient import TestClient

from neffcache.client.api import Api
from neffcache.client.cli import main
from neffcache.client.http import Response
from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

SERVER = "http://testserver"


class Admin:
    """An app in-process, its admin token "ops", and the CLI pointed at it."""

    def __init__(self, client: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
        self.client = client
        self.capsys = capsys
        self.ops = ""  # protected mode: the first token needs none
        self.ops = self.token("admin", "*", "ops")

    def token(self, scope: str, namespace: str, name: str, trusted: bool = False) -> str:
        body = {"scope": scope, "namespaces": [namespace], "name": name, "trusted": trusted}
        made = self.client.post("/v1/admin/tokens", json=body, headers=self._auth(self.ops))
        assert made.status_code == 201, made.text
        secret: str = made.json()["token"]
        return secret

    def _auth(self, secret: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    def publish(self, by: str, key: str, data: bytes, **fields: Any) -> None:
        digest = blake3.blake3(data).hexdigest()
        stored = self.client.put(f"/v1/blobs/{digest}", content=data, headers=self._auth(by))
        assert stored.status_code in (200, 201), stored.text
        body = {"key": key, "files": {"model.neff": {"digest": digest, "size": len(data)}}}
        done = self.client.put(
            f"/v1/ns/team-a/entries/{key}", json={**body, **fields}, headers=self._auth(by)
        )
        assert done.status_code == 201, done.text

    def run(self, *words: str, code: int = 0) -> str:
        """``neffcache admin WORDS``; its stdout (stderr when it fails)."""
        self.capsys.readouterr()
        done = main(["admin", *words, "--server", SERVER, "--token", self.ops])
        captured = self.capsys.readouterr()
        assert done == code, captured.err
        return captured.out if code == 0 else captured.err


@pytest.fixture
def admin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Admin]:
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0)
    blobs, index = MemoryBlobStore(), MemoryIndex()
    app = create_app(settings, blob_store=blobs, index=index)
    with TestClient(app, base_url=SERVER) as client:
        # The admin commands' one HTTP call (the client's api.Api, through the CLI's
        # cli/_server.request), answered in-process.
        def opened(server: str, namespace: str, token: str | None, **_: float) -> InProcessApi:
            return InProcessApi(client, server, token)

        monkeypatch.setattr(Api, "open", opened)
        yield Admin(client, capsys)
    blobs.close()
    index.close()


class InProcessApi:
    """``api.Api``, answered by the app through Starlette's TestClient: the CLI's
    path, body and token go to the app as they would over the network."""

    def __init__(self, client: TestClient, server: str, token: str | None) -> None:
        assert server == SERVER
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def request(self, method: str, path: str, *, json_body: Any = None, **_: object) -> Response:
        answer = self.client.request(method, path, json=json_body, headers=self.headers)
        return Response(answer.status_code, dict(answer.headers), answer.content)

    def close(self) -> None:
        pass


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def test_pin_and_pins_say_what_each_pin_protects(admin: Admin) -> None:
    """A label is its writer's word: a model pin protects the entries of trusted
    tokens only, and says so, rather than "pinned" over entries an eviction removes."""
    team = admin.token("write", "team-a", "team-a-training")
    ci = admin.token("write", "team-a", "ci", trusted=True)
    for n, by in ((1, team), (2, team), (3, ci)):
        admin.publish(by, key(f"llama {n}"), b"neff %d" % n, model="llama-7b")
    pinned = admin.run("pin", "team-a", "--model", "llama-7b").splitlines()
    assert pinned[0] == "pinned model llama-7b in team-a: protects 1 entry now"
    assert pinned[1].startswith("2 entries it matches are not protected: written by tokens")
    ahead = admin.run("pin", "team-a", "--key", key("not yet published")).splitlines()
    assert ahead[0].endswith(": protects 0 entries now")
    assert ahead[1].startswith("no entry has this key in team-a now")
    listed = admin.run("pins", "team-a")
    assert listed.split()[:6] == ["KIND", "VALUE", "PROTECTS", "SINCE", "BY", "REASON"]
    ops_id = admin.ops.split("_")[1]
    assert re.search(rf"^model +llama-7b +1 of 3 +\S+ \S+ +ops \({ops_id}\)$", listed, re.M)
    assert f"\nkey {key('not yet published')}: no entry has this key" in listed
    assert "\nmodel llama-7b: 2 entries it matches are not protected" in listed
    (model_pin,) = [p for p in json.loads(admin.run("pins", "team-a", "--json"))["pins"]
                    if p["kind"] == "model"]  # fmt: skip
    assert (model_pin["protects"], model_pin["unprotected"]) == (1, 2)


def test_token_commands_print_tables_and_take_json(admin: Admin, tmp_path: Path) -> None:
    made = admin.run("token", "create", "--scope", "write", "--namespace", "team-a",
                     "--name", "alice")  # fmt: skip
    secret = re.search(r"^secret +(nfc_\S+)$", made, re.M)
    assert secret, made
    assert re.search(r"^scope +write on team-a$", made, re.M)
    as_json = json.loads(admin.run("token", "create", "--scope", "read", "--namespace", "*",
                                   "--json"))  # fmt: skip
    assert as_json["token"].startswith("nfc_")
    listed = admin.run("token", "list").splitlines()
    assert listed[0].split() == ["ID", "NAME", "SCOPE", "NAMESPACES", "TRUSTED", "CREATED", "STATE"]
    alice = secret[1].split("_")[1]
    assert re.match(rf"{alice} +alice +write +team-a +no ", listed[2]), listed
    tokens = json.loads(admin.run("token", "list", "--json"))["tokens"]
    assert len(tokens) == 3
    revoked = admin.run("token", "revoke", alice)
    assert revoked.startswith(f"revoked token {alice}:")
    assert json.loads(admin.run("token", "revoke", alice, "--json")) == {"revoked": alice}
    local = ["--local", "--data-dir", str(tmp_path / "local")]
    made_locally = json.loads(admin.run("token", "create", *local, "--scope", "admin",
                                        "--namespace", "*", "--json"))  # fmt: skip
    assert made_locally["scope"] == "admin"


def test_audit_and_eviction_reasons_read_as_the_admin_wrote(admin: Admin) -> None:
    admin.run("namespace", "create", "team-a", "--quota", "100K", "--ttl", "30d")
    admin.run("namespace", "set", "team-a", "--ranking", "lru")
    refused = admin.run("namespace", "create", "team-a", code=2)
    assert "PATCH" not in refused
    assert "neffcache admin namespace set" in refused
    for n in range(3):
        admin.publish(admin.ops, key(f"big {n}"), bytes([n]) * 60_000)
    assert "namespace over its quota of 100.0 KiB" in admin.run("evict", "--dry-run")
    rows = admin.run("audit", "--namespace", "team-a").splitlines()
    whys = [re.split(r" {2,}", row)[-1] for row in rows[1:]]
    assert whys == ["ranking value -> lru", "quota 100.0 KiB, ttl 30d"]
    assert all(row.split()[2] == "ops" for row in rows[1:]), rows


@pytest.mark.e2e
def test_a_reader_that_leaves_early_is_no_traceback(tmp_path: Path) -> None:
    """``neffcache ... --json | head``: the reader closes the pipe before the output
    is written; the command exits as a tool killed by SIGPIPE does, and says nothing."""
    argv = [sys.executable, "-m", "neffcache.client.cli", "shim-dir", "--dir", str(tmp_path)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None
        assert child.stderr is not None
        child.stdout.close()
        err = child.stderr.read()
        assert child.wait(timeout=60) == 141
    assert err == b""
