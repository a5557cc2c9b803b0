"""A training image installs neffcache without the ``server`` extra: each command that
needs it says so in one line (exit 2), and the admin commands that ask a server need
nothing beyond the base install: not httpx, FastAPI, uvicorn or pydantic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bridge.layout import StockCache
from support.cli_server import Run

from neffcache.client.cli import _common, main

NEEDS = "needs the server extra: pip install 'neffcache[server]'"

# Run in a child whose imports of the server stack fail as where it is not installed
# (it is here, and in this process already imported): a meta path finder that refuses
# them, then the CLI's main() for each command. The child prints each exit code and
# stderr as JSON lines.
CHILD = """
import contextlib, io, json, sys

class Missing:
    BLOCKED = {"fastapi", "uvicorn", "pydantic", "pydantic_settings", "starlette"}

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from neffcache.client.cli import main

for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    print(json.dumps([code, err.getvalue()]))
"""


@pytest.mark.e2e
def test_without_the_server_stack_each_command_needs_only_what_it_uses(
    tmp_path: Path, unused_port: int, clean_env: Path
) -> None:
    down = f"http://127.0.0.1:{unused_port}"
    cache = StockCache(tmp_path / "stock")
    cache.add("block_a")
    data = str(tmp_path / "data")
    commands = {
        # One request, through the client's own HTTP (admin and the bridge alike): these
        # work, and find the server down.
        ("admin", "token", "list", "--server", down): (1, f"neffcache admin: cannot reach {down}"),
        ("admin", "audit", "--server", down): (1, f"neffcache admin: cannot reach {down}"),
        ("import", str(cache.root), "--server", down, "--namespace", "a"): (
            1,
            f"neffcache import: cannot reach {down}",
        ),
        ("export", str(tmp_path / "out"), "--server", down, "--namespace", "a"): (
            1,
            f"neffcache export: cannot reach {down}",
        ),
        # The server's own stores and app: the whole extra.
        ("admin", "fsck", "--data-dir", data): (2, f"neffcache admin: {NEEDS}\n"),
        ("admin", "reindex", "--data-dir", data): (2, f"neffcache admin: {NEEDS}\n"),
        (
            "admin",
            "token",
            "create",
            "--local",
            "--data-dir",
            data,
            "--scope",
            "read",
            "--namespace",
            "a",
        ): (2, f"neffcache admin: {NEEDS}\n"),
        ("serve", "--port", str(unused_port), "--data-dir", data): (
            2,
            f"neffcache serve: {NEEDS}\n",
        ),
    }
    argvs = [list(argv) for argv in commands]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    for (argv, (code, err)), (got_code, got_err) in zip(commands.items(), results, strict=True):
        assert got_code == code, (argv, got_err)
        assert got_err.startswith(err), (argv, got_err)
        assert got_err.count("\n") == 1, (argv, got_err)
    assert not (tmp_path / "data").exists()  # nothing began before the line


def test_the_remote_admin_commands_need_no_httpx(
    monkeypatch: pytest.MonkeyPatch, neffcache: Run, unused_port: int
) -> None:
    # They ask through the client's own HTTP (api.Api): a base install manages a server.
    monkeypatch.setitem(sys.modules, "httpx", None)  # import httpx now fails
    down = f"http://127.0.0.1:{unused_port}"
    code, out, err = neffcache("admin", "namespace", "list", "--server", down)
    assert (code, out) == (1, "")
    assert err.startswith(f"neffcache admin: cannot reach {down}")
    assert err.count("\n") == 1


class Unloadable:
    """An entry point whose module cannot be imported."""

    def __init__(self, name: str) -> None:
        self.name = name

    def load(self) -> None:
        raise ImportError(f"cannot import {self.name}")


@pytest.mark.parametrize(
    "argv",
    [["admin", "token", "list"], ["admin", "--help"], ["serve", "--port", "9"]],
)
def test_a_plugin_that_cannot_load_leaves_its_commands_saying_which_extra(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.metadata

    def entry_points(group: str) -> list[Unloadable]:
        # An install from before the bridge moved into the client still lists it.
        return [Unloadable("server"), Unloadable("bridge")]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert main(argv) == 2
    assert capsys.readouterr() == ("", f"neffcache {argv[0]}: {NEEDS}\n")


def test_the_bridge_commands_are_the_clients_whatever_the_entry_points_say(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.metadata

    # An install made while the bridge was a plugin lists an entry point that no
    # longer loads: the client's own import and export stay.
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Unloadable("bridge")])
    with pytest.raises(SystemExit) as exited:
        main(["import", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: neffcache import")


def test_the_server_extras_modules_are_what_pyproject_installs() -> None:
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["server"]
    names = {
        requirement.split(";")[0].split(">")[0].split("[")[0].strip().replace("-", "_")
        for requirement in extra
    }
    names -= {"tomli"}  # a backport the settings read on 3.10, not a module of the stack
    assert names <= _common.SERVER_EXTRA_MODULES
