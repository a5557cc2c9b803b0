"""Every ``neffcache`` command the README and docs/ show parses with the real parser;
every option a synopsis or an inline mention names exists; every variable they name
is read by the code; the configuration examples load; shown output has the shape the
code prints."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
from docs.cli_tree import children, mentioned_options, options, parse, resolve
from docs.doctext import (
    ROOT,
    Command,
    block_commands,
    blocks,
    commands_in,
    pages,
    span_commands,
    transcripts,
    variables,
)

from neffcache.client.cli import build_parser, main
from neffcache.keying import ENV_ALLOWLIST

ROOT_PARSER = build_parser()
FENCED = [c for page in pages() for c in block_commands(page)]
EXAMPLES = [c for c in FENCED if not c.synopsis]
SYNOPSES = [c for c in FENCED if c.synopsis]
MENTIONS = [c for page in pages() for c in span_commands(page)]


def _id(command: Command) -> str:
    return f"{command.where} {command}"


def test_the_extraction_finds_the_documented_commands() -> None:
    assert len(EXAMPLES) >= 35
    assert len(SYNOPSES) >= 4
    assert len(MENTIONS) >= 40
    shown = {str(c) for c in EXAMPLES}
    # Continuations, `$ ` prompts and `&&` are undone as a shell would.
    assert "neffcache serve" in shown
    assert any(
        c.words[:3] == ("admin", "namespace", "create") and "--read-through" in c.words
        for c in EXAMPLES
    )
    assert any(
        c.words[:1] == ("key",) and c.words[-1] == "--model-type=transformer" for c in EXAMPLES
    )


@pytest.mark.parametrize("command", EXAMPLES, ids=_id)
def test_every_documented_command_parses(command: Command) -> None:
    parsed = parse(command.words, ROOT_PARSER)
    assert parsed.ok, f"{command.where}: `{command}` does not parse: {parsed.error}"
    assert callable(getattr(parsed.namespace, "run", None))


@pytest.mark.parametrize("command", SYNOPSES + MENTIONS, ids=_id)
def test_every_mentioned_command_and_option_exists(command: Command) -> None:
    resolved = resolve(command.words, ROOT_PARSER)
    following = resolved.rest[0] if resolved.rest else ""
    if "|" in following and not following.startswith(("[", "-")) and not following.isupper():
        # `neffcache admin namespace|pin|unpin`: each alternative is a command (while
        # `KEY|STOCK_ADDRESS` names alternative values of an argument).
        known = children(resolved.parser)
        alternatives = following.split("|")
        assert [a for a in alternatives if a not in known] == [], command.where
    elif re.fullmatch(r"[a-z][a-z-]+", following) and children(resolved.parser):
        pytest.fail(f"{command.where}: `{command}`: no command {following!r}")
    unknown = [o for o in mentioned_options(resolved.rest) if o not in options(resolved.parser)]
    assert unknown == [], f"{command.where}: `{command}` names unknown options"


def _string_constants(root: Path) -> set[str]:
    found: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def test_every_variable_the_docs_name_is_read_by_the_code() -> None:
    """tests/deploy/test_manifests.py checks deploy/'s variables; this, the docs'."""
    from neffcache.server.settings import ServerSettings

    named: dict[str, list[str]] = {}
    for page in pages():
        for name in variables(page.read_text()):
            named.setdefault(name, []).append(page.name)
    assert len(named) >= 40
    settings = {f"NEFFCACHE_{name.upper()}" for name in ServerSettings.model_fields}
    # A variable the code reads appears in it as a string literal of its own
    # (``env.get("NEFFCACHE_TOKEN")``, ENV_ALLOWLIST's entries), not in a comment.
    code = set().union(*(_string_constants(ROOT / part) for part in ("keying", "client", "server")))
    assert {"NEURON_CC_FLAGS", "NEFFCACHE_TOKEN"} <= code
    # Other Neuron stacks' own settings, which client.md explains and neffcache never
    # reads (their caches, "The stacks' own caches").
    other_stacks = {"NEURON_LIBTORCH_REMOTE_CACHE"}
    # Read by the test suite only, named where the docs describe the tests.
    tests_only = set(named) & _string_constants(ROOT / "tests") - code - settings - other_stacks
    assert tests_only <= {"NEFFCACHE_TEST_ARTIFACTS"}
    known = settings | code | tests_only | other_stacks
    unknown = {n: pages for n, pages in named.items() if n not in known}
    assert unknown == {}


def test_the_configuration_file_example_loads(tmp_path: Path) -> None:
    from neffcache.server.settings import load_settings

    (example,) = [b for b in blocks(ROOT / "docs" / "configuration.md") if b.lang == "toml"]
    config = tmp_path / "neffcache.toml"
    config.write_text(example.text)
    settings = load_settings(config_file=str(config), data_dir=tmp_path)
    import importlib

    tomllib = importlib.import_module("tomllib")  # the suite runs on 3.11+
    for name, value in tomllib.loads(example.text).items():
        assert getattr(settings, name) == value, name


def test_the_price_table_example_loads(tmp_path: Path) -> None:
    from neffcache.server.reports.prices import load_prices

    (example,) = [b for b in blocks(ROOT / "docs" / "reports.md") if b.lang == "toml"]
    prices = tmp_path / "prices.toml"
    prices.write_text(example.text)
    table = load_prices(prices)
    assert table.hourly("trn1.32xlarge") == 13.23
    assert table.hourly("trn2.48xlarge") == 30.0
    assert table.hourly("inf1.xlarge") is None


def test_the_run_manifest_example_has_the_fields_the_client_writes() -> None:
    from neffcache.client import runlog

    doc = (ROOT / "docs" / "client.md").read_text()
    (example,) = [b for b in blocks(ROOT / "docs" / "client.md") if b.lang == "json"]
    shown = json.loads(example.text)
    written = runlog._line(0.0, {})
    assert set(shown) <= set(written)
    assert [field for field in written if field not in shown and f"`{field}`" not in doc] == []


def _like(shown: Any, real: Any, at: str = "") -> list[str]:
    """Where ``real`` differs from the documented ``shown``: the same keys at every
    level, and equal values except where the docs elide one (``…``)."""
    if isinstance(shown, dict) and isinstance(real, dict):
        if set(shown) != set(real):
            return [f"{at}: keys {sorted(shown)} shown, {sorted(real)} printed"]
        return [p for k in shown for p in _like(shown[k], real[k], f"{at}.{k}")]
    if isinstance(shown, str) and "…" in shown:
        return []
    return [] if shown == real else [f"{at}: {shown!r} shown, {real!r} printed"]


def _shown(path: Path, prefix: str) -> tuple[Command, str]:
    """The command a `$ ` block runs and the output it shows."""
    for command_line, output in transcripts(path):
        if command_line.startswith(prefix):
            (command,) = commands_in(command_line, path.name)
            return command, output
    raise AssertionError(f"{path.name} shows no `{prefix}` run")


def test_the_key_example_prints_what_keying_md_shows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ENV_ALLOWLIST:
        monkeypatch.delenv(name, raising=False)
    command, output = _shown(ROOT / "docs" / "keying.md", "neffcache key")
    module = ROOT / "tests" / "fixtures" / "hlo" / "block_a.pb"
    words = [str(module) if w == "model.hlo_module.pb" else w for w in command.words]
    assert words != list(command.words)
    assert main(words) == 0
    real = json.loads(capsys.readouterr().out)
    assert _like(json.loads(output), real) == []
