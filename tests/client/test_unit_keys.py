"""Unit tests for ``neffcache.client.keys``: the direct key follows the raw bytes, the
canonical key follows the program (committed fixtures of one program traced twice)."""

from __future__ import annotations

from pathlib import Path

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
