"""Every command's ``--help`` works: found by walking the real argparse tree (plugins
included), so a new command is covered without touching this file."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from docs.cli_tree import Node, resolve, walk
from docs.doctext import block_commands, pages, span_commands

from neffcache.client.cli import build_parser, main

NODES = list(walk())


def test_the_walk_finds_every_command_the_docs_name() -> None:
    paths = {node.path for node in NODES}
    documented = {
        resolve(command.words, build_parser()).path
        for page in pages()
        for command in [*block_commands(page), *span_commands(page)]
    }
    assert len(documented) >= 25
    assert documented <= paths
    # The server's commands come through the plugin entry point, the bridge's are the client's.
    assert {("serve",), ("import",), ("admin", "token", "create"), ("admin", "fsck")} <= paths


def _id(node: Node) -> str:
    return " ".join(node.path) or "neffcache"


@pytest.mark.parametrize("node", NODES, ids=_id)
def test_help_exits_0_with_usage_naming_the_command(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*node.path, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    usage = out.splitlines()[0]
    assert usage.startswith(" ".join(("usage: neffcache", *node.path)) + (" " if node.path else ""))
    # Errors name the command as the usage does.
    assert node.parser.prog == " ".join(("neffcache", *node.path))
    assert node.parser.description, f"{_id(node)}: no description in its --help"
    assert " ".join(node.parser.description.split()[:4]) in " ".join(out.split())


def test_help_is_plain_text() -> None:
    """``--help`` is read in a terminal, where reStructuredText's ````literal```` markup
    shows as is."""
    assert [_id(node) for node in NODES if "``" in node.parser.format_help()] == []


@pytest.mark.parametrize("node", NODES[1:], ids=_id)
def test_each_subcommand_is_listed_with_a_summary(node: Node) -> None:
    assert (node.help or "").strip(), f"{_id(node)}: no summary in its parent's list"


@pytest.mark.e2e
def test_the_installed_console_script_prints_help() -> None:
    script = shutil.which("neffcache")
    assert script, "the neffcache console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
    done = subprocess.run(
        [script, "--help"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: neffcache ")
    listed = {node.path[0] for node in NODES if len(node.path) == 1}
    assert [name for name in sorted(listed) if f"    {name}" not in done.stdout] == []
