"""Modules name no file the compiler would read: the only paths in the fixtures made by
JAX and torch-xla are debug metadata and locations, which the canonical forms drop
(docs/keying.md, "Files the compiler reads that are not its input")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from neffcache.keying import canonical_hlo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# An absolute path under a directory a source tree or a work dir lives in.
PATH = re.compile(rb"/(?:home|tmp|work|usr|root|opt|var|private|Users)/[\x21-\x7e]+")


@pytest.mark.parametrize("fixture", sorted((FIXTURES / "hlo").glob("*.pb")), ids=lambda p: p.stem)
def test_an_hlo_module_names_paths_only_in_its_metadata(fixture: Path) -> None:
    assert PATH.findall(canonical_hlo(fixture.read_bytes())) == []


def test_some_hlo_fixtures_do_carry_paths_in_metadata() -> None:
    """Else the test above would prove nothing."""
    data = (FIXTURES / "hlo" / "torch_block_debug.pb").read_bytes()
    assert PATH.findall(data)


@pytest.mark.parametrize("stem", ["block_a", "dense_constant", "zoo"])
def test_stablehlo_names_paths_only_in_its_locations(stem: str) -> None:
    located = (FIXTURES / "mlir" / f"{stem}.mlirbc").read_bytes()
    stripped = (FIXTURES / "mlir" / f"{stem}_stripped.mlirbc").read_bytes()
    assert PATH.findall(located)  # the traced file's path, in locations
    assert PATH.findall(stripped) == []  # gone with the locations: nothing else named one
