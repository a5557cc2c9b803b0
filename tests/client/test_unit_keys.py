"""Unit tests for ``neffcache.client.keys``: the direct key follows the raw bytes, the
canonical key follows the program (committed fixtures of one program traced twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from neffcache.client.keys import canonical_key, context, direct_key
from neffcache.keying import ENV_ALLOWLIST

HLO = Path(__file__).resolve().parents[1] / "fixtures" / "hlo"
VERSION = "2.20.9961.0+0acef03a"
CTX = context(VERSION, "trn1", ["--model-type=transformer"], {})


def test_one_program_two_traces() -> None:
    a = (HLO / "block_a.pb").read_bytes()
    b = (HLO / "block_a_no_locations.pb").read_bytes()  # only the metadata differs
    assert a != b
    assert direct_key(a, CTX).key != direct_key(b, CTX).key
    assert canonical_key(a, CTX).key == canonical_key(b, CTX).key
    assert direct_key(a, CTX).key != canonical_key(a, CTX).key


def test_another_program_another_key() -> None:
    a = (HLO / "block_a.pb").read_bytes()
    b = (HLO / "variant_shape.pb").read_bytes()
    assert canonical_key(a, CTX).key != canonical_key(b, CTX).key


def test_every_context_part_is_keyed() -> None:
    module = (HLO / "block_a.pb").read_bytes()
    base = direct_key(module, CTX).key
    others = [
        context("2.21.0.0+0acef03a", "trn1", ["--model-type=transformer"], {}),
        context(VERSION, "trn2", ["--model-type=transformer"], {}),
        context(VERSION, "trn1", ["--model-type=transformer", "-O1"], {}),
    ]
    assert all(direct_key(module, ctx).key != base for ctx in others)


def test_only_allowlisted_environment_counts() -> None:
    module = (HLO / "block_a.pb").read_bytes()
    name = sorted(ENV_ALLOWLIST)[0]
    noise = context(VERSION, "trn1", ["--model-type=transformer"], {"HOME": "/elsewhere"})
    assert direct_key(module, noise).key == direct_key(module, CTX).key
    keyed = context(VERSION, "trn1", ["--model-type=transformer"], {name: "1"})
    assert direct_key(module, keyed).key != direct_key(module, CTX).key


def test_flag_spelling_does_not_matter() -> None:
    module = (HLO / "block_a.pb").read_bytes()
    spelled = context(VERSION, "trn1", ["--model-type", "transformer", "--verbose=35"], {})
    assert canonical_key(module, spelled).key == canonical_key(module, CTX).key


# --- framework versions (NKI lowers kernels at compile time) ---------------------------


def _site(tmp_path: Path, name: str, *, package: bool = True, dist: str | None = None) -> str:
    site = tmp_path / name
    site.mkdir()
    if package:
        (site / "nki").mkdir()
        (site / "nki" / "__init__.py").write_text("raise ImportError('never imported')\n")
    if dist is not None:
        (site / f"nki-{dist}.dist-info").mkdir()
    return str(site)


def test_the_nki_version_comes_from_the_first_path_entry_holding_the_package(
    tmp_path: Path,
) -> None:
    from neffcache.client.keys import installed_version

    empty = _site(tmp_path, "empty", package=False, dist="9.9.9")  # metadata, no package
    first = _site(tmp_path, "first", dist="0.3.0+abc")
    second = _site(tmp_path, "second", dist="0.2.0")
    assert installed_version("nki", [empty, first, second]) == "0.3.0+abc"
    assert installed_version("nki", [empty, second, first]) == "0.2.0"
    assert installed_version("nki", [empty]) is None
    bare = _site(tmp_path, "bare")  # importable, no metadata: unknown
    assert installed_version("nki", [bare, second]) is None


def test_both_interception_points_key_with_the_nki_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from neffcache.client import keys

    monkeypatch.setattr(keys, "_frameworks", None)
    monkeypatch.setattr(sys, "path", [_site(tmp_path, "a", dist="0.3.0"), *sys.path])
    with_nki = keys.context("2.20.9961.0+0acef03a", "trn2", [], {})
    assert dict(with_nki.frameworks) == {"nki": "0.3.0"}
    monkeypatch.setattr(keys, "_frameworks", None)
    monkeypatch.setattr(sys, "path", [_site(tmp_path, "b", dist="0.4.0"), *sys.path])
    upgraded = keys.context("2.20.9961.0+0acef03a", "trn2", [], {})
    assert keys.direct_key(b"module", upgraded) != keys.direct_key(b"module", with_nki)
