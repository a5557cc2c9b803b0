"""Every command that asks a server names it one way and fails the same way:
``--server http://HOST:PORT`` (with ``--namespace`` where the command needs one),
``--server neffcache+http://HOST:PORT/NAMESPACE``, or ``NEFFCACHE_URL``; ``--token``
or ``NEFFCACHE_TOKEN``; exit 1 with one line on stderr for a server that cannot
answer, exit 2 with one line for a bad server URL. Run in this process against one
real server that requires a token (conftest.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from bridge.layout import StockCache
from docs.cli_tree import options, resolve, walk
from support.cli_server import TOKEN, Request, Run, Server

from neffcache.client.cli import build_parser


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]  # placeholders in braces: see ``_fill``
    namespaced: bool  # takes its namespace from --namespace or the URL
    ok: int = 0  # the exit code when the server answers

    @property
    def id(self) -> str:
        return " ".join(resolve(self.words, build_parser()).path)


COMMANDS = [
    Command(("prewarm", "--manifest", "{manifest}", "--json"), namespaced=True),
    Command(("explain", "0" * 64, "--json"), namespaced=True),
    Command(("stats", "--json"), namespaced=True),
    Command(("doctor", "--only", "server", "--read-only", "--json"), namespaced=True),
    Command(("import", "{cache}", "--json"), namespaced=True),
    Command(("export", "{dest}", "--json"), namespaced=True),
    Command(("report", "--format", "json"), namespaced=False),
    Command(
        ("report", "upgrade", "--to-compiler", "2.22.0.0+abcdef12", "--format", "json"),
        namespaced=False,
    ),
    Command(("admin", "token", "create", "--scope", "read", "--namespace", "t", "--json"), False),
    Command(("admin", "token", "list", "--json"), namespaced=False),
    Command(("admin", "token", "revoke", "{token_id}", "--json"), namespaced=False),
    Command(("admin", "namespace", "create", "{fresh}", "--ttl", "30d", "--json"), False),
    Command(("admin", "namespace", "set", "{created}", "--ttl", "7d", "--json"), False),
    Command(("admin", "namespace", "show", "{created}", "--json"), namespaced=False),
    Command(("admin", "namespace", "list", "--json"), namespaced=False),
    Command(("admin", "pin", "{created}", "--model", "m", "--json"), namespaced=False),
    Command(("admin", "unpin", "{pinned}", "--model", "m", "--json"), namespaced=False),
    Command(("admin", "pins", "{created}", "--json"), namespaced=False),
    Command(("admin", "expire", "--compiler-version", "1.0.*", "--dry-run", "--json"), False),
    Command(("admin", "evict", "--dry-run", "--json"), namespaced=False),
    Command(("admin", "audit", "--json"), namespaced=False),
]
IDS = [command.id for command in COMMANDS]
# A server URL in neither form, one without its namespace, and not a URL.
BAD = ("neffcache://h:1/ns", "neffcache+http://h:1", "cache.internal:8787")


def test_the_table_covers_every_command_that_names_a_server() -> None:
    root = build_parser()
    named = {node.path for node in walk(root) if "--server" in options(node.parser)}
    assert {resolve(c.words, root).path for c in COMMANDS} == named


def _fill(command: Command, tmp_path: Path, server: Server) -> list[str]:
    """The command's words, each placeholder made real in ``tmp_path`` or on ``server``."""
    tmp_path.mkdir(exist_ok=True)
    values = {"{dest}": str(tmp_path / "exported"), "{created}": "cli-created"}
    if "{manifest}" in command.words:
        manifest = tmp_path / "run.jsonl"
        manifest.write_text(json.dumps({"key": "1" * 64}) + "\n")
        values["{manifest}"] = str(manifest)
    if "{cache}" in command.words:
        cache = StockCache(tmp_path / "stock")
        cache.add("block_a")
        values["{cache}"] = str(cache.root)
    if "{fresh}" in command.words:
        values["{fresh}"] = re.sub(r"[^a-z0-9]+", "-", tmp_path.name.lower()).strip("-")[:60]
    if "{token_id}" in command.words:
        values["{token_id}"] = _admin(server, "POST", "/v1/admin/tokens", _READER)["token_id"]
    if "{created}" in command.words or "{pinned}" in command.words:
        _admin(server, "POST", "/v1/admin/namespaces/cli-created", {}, ok=(201, 409))
    if "{pinned}" in command.words:
        pin = {"kind": "model", "value": "m", "reason": ""}
        _admin(server, "PUT", "/v1/admin/namespaces/cli-created/pins", pin, ok=(200, 201))
        values["{pinned}"] = "cli-created"
    return [values.get(word, word) for word in command.words]


_READER = {"scope": "read", "namespaces": ["t"], "name": "to revoke", "trusted": False}


def _admin(
    server: Server, method: str, path: str, body: object, ok: tuple[int, ...] = (201,)
) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answer = httpx.request(
        method,
        server.url + path,
        json=body,
        headers=headers,
        timeout=10,
        trust_env=False,
        verify=False,
    )
    assert answer.status_code in ok, answer.text
    made: dict[str, str] = answer.json()
    return made


def _check_asked(seen: list[Request], command: Command, namespace: str) -> None:
    assert seen, "the server was not asked"
    assert {r.authorization for r in seen} == {f"Bearer {TOKEN}"}
    if command.namespaced:
        assert any(f"/ns/{namespace}/" in r.target or f"={namespace}&" in r.target for r in seen)


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_server_option_in_either_form_with_the_token_option(
    command: Command, neffcache: Run, server: Server, tmp_path: Path
) -> None:
    words = _fill(command, tmp_path, server)
    server.take()
    plain = ["--server", server.url, "--token", TOKEN]
    if command.namespaced:
        plain += ["--namespace", "from-option"]
    done = neffcache(*words, *plain)
    assert done.code == command.ok, done.err
    _check_asked(server.take(), command, "from-option")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NEFFCACHE_TOKEN", TOKEN)
        words = _fill(command, tmp_path / "again", server)
        server.take()
        done = neffcache(*words, "--server", f"neffcache+{server.url}/from-url")
    assert done.code == command.ok, done.err
    _check_asked(server.take(), command, "from-url")


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_the_environment_names_the_server_and_token(
    command: Command,
    neffcache: Run,
    server: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    words = _fill(command, tmp_path, server)
    server.take()
    monkeypatch.setenv("NEFFCACHE_URL", f"neffcache+{server.url}/from-env")
    monkeypatch.setenv("NEFFCACHE_TOKEN", TOKEN)
    done = neffcache(*words)
    assert done.code == command.ok, done.err
    _check_asked(server.take(), command, "from-env")


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_server_down_is_exit_1_and_a_bad_url_exit_2(
    command: Command, neffcache: Run, server: Server, tmp_path: Path, unused_port: int
) -> None:
    words = _fill(command, tmp_path, server)
    down = f"neffcache+http://127.0.0.1:{unused_port}/down"
    done = neffcache(*words, "--server", down, "--token", TOKEN)
    assert done.code == 1, done.err
    if command.words[0] != "doctor":  # the doctor says so among its checks, on stdout
        assert done.err.startswith(f"neffcache {command.words[0]}: cannot reach "), done.err
        assert done.err.count("\n") == 1, done.err
    # Each command gets one of the bad forms (the resolver's own tests try them all).
    bad = BAD[COMMANDS.index(command) % len(BAD)]
    done = neffcache(*words, "--server", bad)
    assert (done.code, done.out) == (2, ""), done.err
    rule = "; a NAMESPACE is lowercase letters, digits, '.', '_', '-' (at most 63)"
    assert done.err == (
        f"neffcache {command.words[0]}: error: --server {bad!r}: use http://HOST:PORT or "
        "neffcache+http://HOST:PORT/NAMESPACE (https too)"
        f"{rule if bad.startswith('neffcache+') else ''}\n"
    )


def test_the_old_spellings_still_work_with_one_line_each(
    neffcache: Run, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEFFCACHE_SERVER", server.url)
    monkeypatch.setenv("NEFFCACHE_ADMIN_TOKEN", TOKEN)
    done = neffcache("admin", "token", "list", "--json")
    assert done.code == 0, done.err
    assert done.err.splitlines() == [
        "neffcache admin: warning: NEFFCACHE_SERVER is deprecated: use --server URL, or "
        "NEFFCACHE_URL=neffcache+http://HOST:PORT/NAMESPACE",
        "neffcache admin: warning: NEFFCACHE_ADMIN_TOKEN is deprecated: use NEFFCACHE_TOKEN",
    ]
    monkeypatch.delenv("NEFFCACHE_SERVER")
    done = neffcache("report", "--url", server.url, "--format", "json")
    assert done.code == 0, done.err
    assert done.err.splitlines() == [
        "neffcache report: warning: --url is deprecated: use --server",
        "neffcache report: warning: NEFFCACHE_ADMIN_TOKEN is deprecated: use NEFFCACHE_TOKEN",
    ]
    assert {r.authorization for r in server.take()} == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_path_prefix_is_refused_with_one_line_by_every_command(
    command: Command,
    neffcache: Run,
    server: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server behind a reverse proxy at http://host/neffcache: refused, as the runtime
    # refuses it (test_the_runtime_refuses_a_path_prefix_too), never asked elsewhere.
    words = _fill(command, tmp_path, server)
    server.take()
    for url in (f"{server.url}/neffcache", f"neffcache+{server.url}/neffcache/team-a"):
        done = neffcache(*words, "--server", url, "--token", TOKEN)
        assert (done.code, done.out) == (2, ""), done.err
        assert done.err == (
            f"neffcache {command.words[0]}: error: --server {url!r}: a path after HOST:PORT "
            "('/neffcache') is not supported: neffcache asks the server at the root of its "
            "host and port, as jobs do (no path prefix: behind a reverse proxy, give it a "
            "host or port of its own); use http://HOST:PORT or "
            "neffcache+http://HOST:PORT/NAMESPACE (https too)\n"
        )
    if command.words[0] != "doctor":  # the doctor checks NEFFCACHE_URL as a job's
        monkeypatch.setenv("NEFFCACHE_URL", f"neffcache+{server.url}/proxy/team-a")
        done = neffcache(*words, "--token", TOKEN)
        assert done.code == 2, done.err
        assert done.err.startswith(f"neffcache {command.words[0]}: error: NEFFCACHE_URL ")
        assert "a path after HOST:PORT ('/proxy') is not supported" in done.err
        assert done.err.count("\n") == 1, done.err
    assert server.take() == []


def test_the_runtime_refuses_a_path_prefix_too() -> None:
    from neffcache.client.config import ClientConfig, ConfigError

    with pytest.raises(ConfigError, match="must end with one namespace name"):
        ClientConfig.from_env({"NEFFCACHE_URL": "neffcache+http://cache.internal/neffcache/team-a"})
