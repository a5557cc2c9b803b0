"""docs/admin.md's commands, run as written (in its order) against a real
``neffcache serve`` on 127.0.0.1, plus the runnable commands of the operations guide and
the README: each exits 0 and prints what the guides say it does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
from docs.doctext import ROOT, Command, block_commands, span_commands, transcripts
from loopback import free_port, terminate, wait_healthy

from neffcache.client.cli import main

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]
ADMIN = "nfc_docs_admin_guide_secret"
GUIDE = ROOT / "docs" / "admin.md"
OPERATIONS = ROOT / "docs" / "operations.md"


class Serve:
    """``neffcache serve`` on a free loopback port, with a bootstrap admin token."""

    def __init__(self, tmp: Path) -> None:
        self.data_dir = tmp / "data"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = tmp / "serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
        env["NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN"] = ADMIN
        argv = [*NEFFCACHE, "serve", "--port", self.url.rsplit(":", 1)[1]]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [*argv, "--data-dir", str(self.data_dir)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        if wait_healthy(self.process, self.url):
            return
        self.stop()
        raise AssertionError(f"the server did not start: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        terminate(self.process)

    def http(self, token: str = ADMIN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, trust_env=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    serve = Serve(tmp_path_factory.mktemp("serve"))
    try:
        yield serve
    finally:
        serve.stop()


@pytest.fixture
def cli_env(server: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment the guide assumes: its commands name no --server nor --token."""
    for name in [n for n in os.environ if n.startswith("NEFFCACHE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("NEFFCACHE_URL", server.url)
    monkeypatch.setenv("NEFFCACHE_TOKEN", ADMIN)
    monkeypatch.setenv("NEFFCACHE_DATA_DIR", str(server.data_dir))


def run(words: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """One command through the CLI's entry point, in this process."""
    capsys.readouterr()
    code = main(words)
    captured = capsys.readouterr()
    assert code == 0, f"`neffcache {' '.join(words)}` exited {code}: {captured.err}"
    return code, captured.out


def publish(server: Serve, label: str, compiler_version: str) -> str:
    """An entry in team-a, as a client publishes one; its key."""
    data = label.encode() * 100
    digest = blake3.blake3(data).hexdigest()
    key = blake3.blake3(label.encode()).hexdigest()
    manifest = {
        "key": key,
        "components": {"compiler_version": compiler_version, "target": "trn1"},
        "files": {"model.neff": {"digest": digest, "size": len(data)}},
        "compile_seconds": 600.0,
    }
    with server.http() as http:
        assert http.put(f"/v1/blobs/{digest}", content=data).status_code in (200, 201)
        assert http.put(f"/v1/ns/team-a/entries/{key}", json=manifest).status_code == 201
    return key


def _words(command: Command, placeholders: dict[str, str]) -> list[str]:
    return [placeholders.get(word, word) for word in command.words]


# What each documented command prints, by its command words: a check per shape.
def _expect(words: list[str], out: str, state: dict[str, Any]) -> None:
    head = tuple(w for w in words[:3] if not w.startswith("-"))
    if head == ("admin", "token", "create"):
        secret = re.search(r"^secret +(\S{20,})$", out, re.M)  # shown this once
        assert secret, out
        token_id = re.search(r"^token id +(\S+)$", out, re.M)
        assert token_id, out
        trusted = "yes" if "--trusted" in words else "no"
        assert re.search(rf"^trusted +{trusted}$", out, re.M), out
        state.setdefault("tokens", []).append({"token": secret[1], "token_id": token_id[1]})
    elif head == ("admin", "token", "list"):
        assert out.split()[:7] == [
            "ID",
            "NAME",
            "SCOPE",
            "NAMESPACES",
            "TRUSTED",
            "CREATED",
            "STATE",
        ]
        listed = {line.split()[0] for line in out.splitlines()[1:]}
        assert {t["token_id"] for t in state["tokens"]} <= listed
        assert not any(t["token"] in out for t in state["tokens"])  # never a secret
    elif head == ("admin", "token", "revoke"):
        assert out.startswith(f"revoked token {words[3]}:"), out
    elif head[:2] == ("admin", "namespace") and head[2] in ("create", "set", "show"):
        assert re.search(rf"^namespace +{words[3]}$", out, re.M), out
        if "--quota" in words:
            quota = words[words.index("--quota") + 1]
            assert re.search(rf"^quota +{'none' if quota == 'none' else '2.0 TiB'}$", out, re.M)
        if "--trusted-writers-only" in words:
            assert re.search(r"^writers +trusted tokens only$", out, re.M)
        if "--read-through" in words:
            source = words[words.index("--read-through") + 1]
            assert re.search(rf"^read through +{source}$", out, re.M)
    elif head == ("admin", "namespace", "list"):
        assert out.split()[:6] == ["NAMESPACE", "ENTRIES", "BYTES", "QUOTA", "TTL", "WRITERS"]
        assert re.search(r"^team-a +2 ", out, re.M), out
    elif head[:2] in (("admin", "pin"), ("admin", "unpin")):
        kind = next(w[2:] for w in words if w.startswith("--") and w != "--reason")
        value = words[words.index(f"--{kind}") + 1]
        if head[1] == "unpin":
            assert out.strip() == f"unpinned {kind} {value} in team-a"
        else:  # what it protects now: the entry pinned by key; none of the others
            protects = "1 entry" if kind == "key" else "0 entries"
            assert (
                out.splitlines()[0] == f"pinned {kind} {value} in team-a: protects {protects} now"
            )
    elif head[:2] == ("admin", "pins"):
        assert out.split()[:6] == ["KIND", "VALUE", "PROTECTS", "SINCE", "BY", "REASON"]
        table = out.split("\n\n")[0]
        assert len(table.strip().splitlines()) == 1 + 4  # the four pins above
    elif head[:2] in (("admin", "evict"), ("admin", "expire")):
        verb = "would remove" if "--dry-run" in words else "removed"
        expired = head[1] == "expire"
        # Of the two 2.20 entries, the one pinned by key stays.
        assert f"{verb} {1 if expired else 0} entries" in out, out
        if expired:
            assert f"team-a     {state['unpinned'][:16]}" in out
        if head[1] == "evict" and "--dry-run" not in words:
            assert re.search(r"^blobs collected: \d+ ", out, re.M), out
    elif head[:2] == ("admin", "audit"):
        if "--json" in words:
            actions = {r["action"] for r in json.loads(out)["records"]}
            assert {"token.create", "token.revoke", "namespace.create", "pin", "expire"} <= actions
        else:
            assert out.split()[:6] == ["WHEN", "WHO", "ACTION", "NAMESPACE", "WHAT", "WHY"]
            for action in (" pin ", " unpin ", " namespace.create "):
                assert action in out, out
    else:
        raise AssertionError(f"admin.md shows `neffcache {' '.join(words)}`: add its check")


@pytest.mark.e2e
def test_the_admin_guide_runs_as_written(
    server: Serve, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = block_commands(GUIDE)
    assert len(commands) >= 20
    pinned = publish(server, "pinned entry", "2.20.9961.0+0acef03a")
    state: dict[str, Any] = {"unpinned": publish(server, "unpinned entry", "2.20.9961.0+0acef03a")}
    placeholders = {"5f1c...e0": pinned}
    for command in commands:
        if command.words[:3] == ("admin", "token", "revoke"):
            placeholders[command.words[3]] = state["tokens"][0]["token_id"]
        words = _words(command, placeholders)
        _, out = run(words, capsys)
        _expect(words, out, state)
    with server.http() as http:  # the revoked token is refused, the other one works
        assert http.get("/v1/admin/tokens").status_code == 200
        first, second = (t["token"] for t in state["tokens"][:2])
        refused = http.get(
            "/v1/ns/team-a/entries?limit=1", headers={"Authorization": f"Bearer {first}"}
        )
        assert refused.status_code == 401
        assert http.get(f"/v1/ns/team-a/entries/{pinned}").status_code == 200  # kept: pinned
        assert http.get(f"/v1/ns/team-a/entries/{state['unpinned']}").status_code == 404
        del second


def _operations_command(prefix: tuple[str, ...]) -> Command:
    found = [c for c in block_commands(OPERATIONS) if c.words[: len(prefix)] == prefix]
    found += [c for c in span_commands(OPERATIONS) if c.words[: len(prefix)] == prefix]
    assert found, f"operations.md shows no `neffcache {' '.join(prefix)}`"
    return found[0]


@pytest.mark.e2e
def test_a_local_admin_token_works_on_the_running_server(
    server: Serve, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    command = _operations_command(("admin", "token", "create", "--local"))
    words = _words(command, {"/var/lib/neffcache": str(server.data_dir)})
    assert str(server.data_dir) in words
    _, out = run(words, capsys)
    assert re.search(r"^scope +admin on \*$", out, re.M), out
    secret = re.search(r"^secret +(\S+)$", out, re.M)
    assert secret, out
    with server.http(secret[1]) as http:
        assert http.get("/v1/admin/namespaces").status_code == 200


@pytest.mark.e2e
def test_fsck_and_reindex_run_on_the_server_s_data_dir(
    server: Serve, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    shown_command, shown = next(t for t in transcripts(OPERATIONS) if "fsck" in t[0])
    _, out = run(shown_command.split()[1:], capsys)
    # The first line as the guide shows it, with this server's figures.
    # A number, escaped ("16\\.0"), whole: this server's may have no decimals ("0 B").
    shape = re.sub(r"\d+(?:\\\.\d+)?", r"\\d+(?:\\.\\d+)?", re.escape(shown.splitlines()[0]))
    shape = shape.replace(r"KiB", r"(?:B|KiB|MiB)")
    assert re.fullmatch(shape, out.splitlines()[0]), (shown.splitlines()[0], out)
    _, out = run(list(_operations_command(("admin", "reindex")).words), capsys)
    assert out.startswith("reindex: ")


def test_the_shim_dir_examples_make_a_compiler_shim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEFFCACHE_LOCAL_DIR", str(tmp_path / "l1"))
    shown = [c for c in block_commands(ROOT / "docs" / "client.md") if c.words[:1] == ("shim-dir",)]
    assert shown
    for command in [Command("README.md", ("shim-dir",)), *shown]:
        words = _words(command, {"/opt/neffcache/shim": str(tmp_path / "shim")})
        _, out = run(words, capsys)
        directory = Path(out.strip())
        assert os.access(directory / "neuronx-cc", os.X_OK)
