"""The README, the docs site and its lists cannot drift from the code: the set-up
commands and the command CI runs, every flag, setting, variable and module the docs
list, and every page in the site's navigation."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from neffcache.keying import (
    ENV_ALLOWLIST,
    FRAMEWORK_ALLOWLIST,
    OUTPUT_NEUTRAL_FLAGS,
    TARGETS,
    WRAPPER_ONLY_FLAGS,
)

ROOT = Path(__file__).resolve().parents[2]


def _sh_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def test_readme_has_exactly_two_setup_commands() -> None:
    blocks = _sh_blocks((ROOT / "README.md").read_text())
    assert len(blocks) == 2
    assert all("\n" not in block for block in blocks)
    assert "neffcache serve" in blocks[0]
    assert "pytest" in blocks[1]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    test_command = _sh_blocks((ROOT / "README.md").read_text())[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci
    assert ci[0].startswith("#!")
    assert "set -euo pipefail" in ci


def test_keying_doc_names_every_flag_variable_framework_and_target() -> None:
    doc = (ROOT / "docs" / "keying.md").read_text()
    names = [*WRAPPER_ONLY_FLAGS, *OUTPUT_NEUTRAL_FLAGS, *ENV_ALLOWLIST, *FRAMEWORK_ALLOWLIST]
    missing = [name for name in [*names, *TARGETS] if f"`{name}`" not in doc]
    assert not missing


def test_architecture_doc_lists_every_keying_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted(p.name for p in (ROOT / "keying/neffcache/keying").glob("_*.py"))
    modules.remove("__init__.py")
    assert modules
    assert [m for m in modules if f"`{m}`" not in doc] == []


def test_configuration_doc_names_every_server_setting() -> None:
    from neffcache.server.settings import ServerSettings

    doc = (ROOT / "docs" / "configuration.md").read_text()
    for name in ServerSettings.model_fields:
        assert f"`{name}`" in doc, name
        assert f"`NEFFCACHE_{name.upper()}`" in doc, name


# Set by the wrapper for the compiler it runs (loop guard), never by a user.
_INTERNAL_CLIENT_VARIABLES = {"NEFFCACHE_IN_WRAPPER"}


def test_client_doc_names_every_variable_the_client_reads() -> None:
    doc = (ROOT / "docs" / "client.md").read_text()
    sources = "".join(p.read_text() for p in (ROOT / "client").rglob("*.py"))
    names = set(re.findall(r"NEFFCACHE_[A-Z_]+", sources)) - _INTERNAL_CLIENT_VARIABLES
    assert len(names) >= 10  # the scan sees the client's variables
    assert sorted(n for n in names if f"`{n}`" not in doc) == []


def test_architecture_doc_lists_every_client_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted(
        p.name
        for p in (ROOT / "client/neffcache/client").glob("*.py")
        if p.name != "__init__.py" and not p.name.startswith("_")
    )
    assert "wrapper.py" in modules
    assert [m for m in modules if f"`{m}`" not in doc] == []


def test_bridge_doc_explains_every_outcome_of_import_and_export() -> None:
    from neffcache.client.bridge import exporter, importer

    doc = (ROOT / "docs" / "bridge.md").read_text()
    outcomes = [*importer.DONE_OUTCOMES, *importer.SKIPPED, *exporter.DONE_OUTCOMES]
    outcomes += [*exporter.SKIPPED, "error"]
    assert len(outcomes) == 15
    assert [o for o in outcomes if f"| `{o}` |" not in doc] == []


def test_the_site_home_page_gives_the_readme_commands() -> None:
    readme = _sh_blocks((ROOT / "README.md").read_text())
    home = _sh_blocks((ROOT / "docs" / "index.md").read_text())
    assert readme[0] in home
    assert readme[1] in home


def test_every_doc_page_is_in_the_site_navigation() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "docs" / "mkdocs.yml").read_text())
    listed = {page for item in config["nav"] for page in item.values()}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - listed == set()
    assert listed - pages == set()


def _registered_marks() -> set[str]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lines = config["tool"]["pytest"]["ini_options"]["markers"]
    return {re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in lines}


def test_the_development_page_runs_the_suite_with_its_own_marks_and_backends() -> None:
    import shlex

    from support.backends import BACKENDS

    commands = [shlex.split(b) for b in _sh_blocks((ROOT / "docs" / "development.md").read_text())]
    pytest_commands = [words for words in commands if words[:1] == ["pytest"]]
    assert len(pytest_commands) >= 3
    marks = _registered_marks()
    for words in pytest_commands:
        for flag, value in itertools.pairwise(words):
            if flag == "-m":
                named = set(re.findall(r"\w+", value)) - {"not", "and", "or"}
                assert named <= marks, value
            if flag == "--backend":
                assert set(value.split(",")) <= set(BACKENDS), value
        paths = [w for w in words[1:] if w.startswith("tests/")]
        assert all((ROOT / p).exists() for p in paths), paths
    assert ["pytest", "-m", "not e2e", "-n", "2"] in pytest_commands
