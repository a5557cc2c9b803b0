"""A miss's explanation and the input it reads again: the graph's summary comes from an
HloModuleProto read again while the compiler runs, so only an input that holds one, of
bounded size, is read; any other input's explanation goes with the key's components
alone, and nothing is read beside the compiler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.client_units import closing_remotes

from neffcache.client import session as session_module
from neffcache.client.config import ClientConfig
from neffcache.client.reasons import Prepared
from neffcache.client.session import Session
from neffcache.client.wrapper import parse

TESTS = Path(__file__).resolve().parents[1]
GRAPH = TESTS / "fixtures" / "hlo" / "block_a.pb"
COMPILER = TESTS / "standins" / "neuronx-cc"
DOWN = "http://127.0.0.1:9"  # the discard port: nothing answers, the job compiles


@pytest.fixture(autouse=True)
def _close_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with closing_remotes(monkeypatch):
        yield


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The inputs the explanation read again."""
    seen: list[Path] = []
    original = session_module._module_of

    def recording(path: Path, ctx: object) -> bytes | None:
        seen.append(path)
        return original(path, ctx)  # type: ignore[arg-type]

    monkeypatch.setattr(session_module, "_module_of", recording)
    return seen


def prepared_after_a_miss(tmp_path: Path, graph: Path) -> Prepared | None:
    out = tmp_path / "out" / "graph.neff"
    out.parent.mkdir(parents=True)
    argv = ["compile", "--framework=XLA", "--target=trn1", str(graph), "--output", str(out)]
    call = parse(argv)
    assert call is not None
    env = {
        "NEFFCACHE_URL": f"neffcache+{DOWN}/unit-summary",
        "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
        "NEFFCACHE_TIMEOUT": "2",
    }
    config = ClientConfig.from_env(env)
    assert config is not None
    made = Session(config, str(COMPILER), call)
    assert made.run() == 0
    assert out.is_file(), "the compiler ran and wrote --output"
    explanation = made._explanation
    assert explanation is not None, "a miss asks why it missed"
    explanation.result(wait=30)
    return explanation.prepared


def test_an_hlo_miss_is_explained_with_its_graphs_summary(
    tmp_path: Path, reads: list[Path]
) -> None:
    prepared = prepared_after_a_miss(tmp_path, GRAPH)
    assert reads == [GRAPH]
    assert prepared is not None
    assert "graph" in prepared.components
    assert "structure" in prepared.components["graph"]


def test_an_hlo_larger_than_the_bound_is_not_read_beside_the_compiler(
    tmp_path: Path, reads: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "SUMMARY_MAX", GRAPH.stat().st_size - 1)
    prepared = prepared_after_a_miss(tmp_path, GRAPH)
    assert reads == []
    assert prepared is not None
    assert "graph" not in prepared.components
    assert prepared.components, "the key's components still go"


def test_an_mlir_text_input_is_not_read_again(tmp_path: Path, reads: list[Path]) -> None:
    graph = tmp_path / "module.mlir"
    graph.write_text("module @m {\n  func.func @main() {\n    return\n  }\n}\n")
    prepared = prepared_after_a_miss(tmp_path, graph)
    assert reads == []
    assert prepared is not None
    assert "graph" not in prepared.components
