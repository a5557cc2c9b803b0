"""Compile contexts, cache keys, direct keys and stock Neuron addresses.

The golden digests below pin the key derivation (STYLE.md rule 5): if one of them
changes, the same inputs now produce a different key, and KEY_VERSION must be bumped
in neffcache/keying/_version.py before the new digest is pasted here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import blake3
import pytest

from neffcache.keying import (
    KEY_VERSION,
    TARGETS,
    CacheKey,
    CompileContext,
    KeyingError,
    KeyInputs,
    NeuronAddress,
    compute_key,
    direct_key,
    neuron_address,
    parse_neuron_address,
)

VERSION = "2.20.9961.0+0acef03a"
FINGERPRINT = "0123456789abcdef" * 4
MODULE = b"\x0a\x01x"


def make_context(**overrides: Any) -> CompileContext:
    fields: dict[str, Any] = {
        "compiler_version": VERSION,
        "target": "trn1",
        "flags": "--model-type=transformer --auto-cast=none -O1",
        "env": {"NEURON_LOGICAL_NC_CONFIG": "2", "XLA_FLAGS": "--xla_cpu_fast_math"},
        "frameworks": {"nki": "0.1.0"},
    }
    fields.update(overrides)
    return CompileContext.create(**fields)


def key_of(fingerprint: str = FINGERPRINT, **overrides: Any) -> CacheKey:
    return compute_key(KeyInputs(fingerprint, make_context(**overrides)))


def differing_components(a: CacheKey, b: CacheKey) -> set[str]:
    ja, jb = a.as_json(), b.as_json()
    assert ja.keys() == jb.keys()
    return {label for label in ja if ja[label] != jb[label]}


# --- CompileContext -------------------------------------------------------------------


def test_flags_string_list_and_spelling_give_equal_contexts() -> None:
    as_string = make_context(flags="--model-type transformer -O1 --auto-cast=none")
    as_list = make_context(
        flags=["--model-type=transformer", "--optlevel=1", "--auto-cast", "none"]
    )
    respelled = make_context(
        flags="--cache_dir=/var/tmp/c --model-type=transformer --optlevel 1 "
        "--logfile=/w/log --auto-cast none"
    )
    assert as_string == as_list == respelled
    assert as_string.flags == ("--model-type=transformer", "--optlevel=1", "--auto-cast=none")


def test_direct_construction_normalizes_like_create() -> None:
    direct = CompileContext(
        compiler_version=VERSION,
        target="trn1",
        flags=("--model-type", "transformer", "-O1"),
        env=(("XLA_FLAGS", "--xla_cpu_fast_math"), ("NEURON_LOGICAL_NC_CONFIG", "2")),
    )
    created = CompileContext.create(
        compiler_version=VERSION,
        target="trn1",
        flags="--model-type=transformer --optlevel=1",
        env={"NEURON_LOGICAL_NC_CONFIG": "2", "XLA_FLAGS": "--xla_cpu_fast_math"},
    )
    assert direct == created


def test_agreeing_target_flag_is_removed() -> None:
    ctx = make_context(target="trn2", flags="--target=trn2 --model-type=transformer")
    assert ctx.target == "trn2"
    assert ctx.flags == ("--model-type=transformer",)
    assert ctx == make_context(target="trn2", flags="--model-type=transformer")
    assert make_context(target="trn2", flags=["--target", "trn2"]).flags == ()


def test_contradicting_target_flag_is_keying_error() -> None:
    with pytest.raises(KeyingError, match="contradicts"):
        make_context(target="trn1", flags="--target=trn2")


@pytest.mark.parametrize("target", ["inf1", "trn", "TRN1", "", "trn1 "])
def test_unknown_target_is_keying_error(target: str) -> None:
    with pytest.raises(KeyingError, match="target"):
        make_context(target=target)


@pytest.mark.parametrize("target", TARGETS)
def test_every_known_target_is_accepted(target: str) -> None:
    assert make_context(target=target).target == target


@pytest.mark.parametrize(
    "version",
    [
        "",
        "abc",
        "2",
        "v2.20.9961.0",
        "2.20.9961.0+",
        "2.20.9961.0+0ace-f03a",
        "2.20.9961.0+0acef03a extra",
        "../2.20.9961.0",
        "2.20.9961.0+0acef03a/..",
        None,
        2.2,
    ],
)
def test_bad_compiler_version_is_keying_error(version: Any) -> None:
    with pytest.raises(KeyingError, match="compiler version"):
        make_context(compiler_version=version)


@pytest.mark.parametrize("version", ["2.20.9961.0+0acef03a", "2.1.0.76+2909d26a2"])
def test_good_compiler_versions(version: str) -> None:
    assert make_context(compiler_version=version).compiler_version == version


def test_compiler_version_with_trailing_newline_is_keying_error() -> None:
    with pytest.raises(KeyingError):
        make_context(compiler_version=VERSION + "\n")


def test_env_and_frameworks_become_sorted_pairs() -> None:
    ctx = make_context(
        env={"XLA_FLAGS": "--xla_cpu_fast_math", "NEURON_LOGICAL_NC_CONFIG": "2"},
        frameworks={"nki": "0.1.0"},
    )
    assert ctx.env == (("NEURON_LOGICAL_NC_CONFIG", "2"), ("XLA_FLAGS", "--xla_cpu_fast_math"))
    assert ctx.frameworks == (("nki", "0.1.0"),)
    assert ctx == make_context(
        env={"NEURON_LOGICAL_NC_CONFIG": "2", "XLA_FLAGS": "--xla_cpu_fast_math"}
    )


def test_context_env_drops_empty_and_dump_only_values() -> None:
    ctx = make_context(env={"NEURON_LOGICAL_NC_CONFIG": "", "XLA_FLAGS": "--xla_dump_to=/d"})
    assert ctx.env == ()


def test_context_rejects_unknown_env_and_frameworks() -> None:
    with pytest.raises(KeyingError, match="ENV_ALLOWLIST"):
        make_context(env={"HOME": "/root"})
    with pytest.raises(KeyingError, match="FRAMEWORK_ALLOWLIST"):
        make_context(frameworks={"torch": "2.5.1"})


def test_context_rejects_malformed_pairs() -> None:
    with pytest.raises(KeyingError, match="pairs"):
        CompileContext(compiler_version=VERSION, target="trn1", env=("XLA_FLAGS",))  # type: ignore[arg-type]
    with pytest.raises(KeyingError, match="twice"):
        CompileContext(
            compiler_version=VERSION,
            target="trn1",
            env=(("XLA_FLAGS", "--a"), ("XLA_FLAGS", "--b")),
        )


def test_context_is_frozen() -> None:
    ctx = make_context()
    with pytest.raises(AttributeError):
        ctx.target = "trn2"  # type: ignore[misc]


# --- KeyInputs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fingerprint",
    [
        "",
        "0" * 63,
        "0" * 65,
        "A" * 64,
        "g" * 64,
        " " + "0" * 63,
        b"0" * 64,
        None,
    ],
)
def test_key_inputs_rejects_non_64_hex_fingerprint(fingerprint: Any) -> None:
    with pytest.raises(KeyingError, match="fingerprint"):
        KeyInputs(fingerprint, make_context())


def test_key_inputs_rejects_fingerprint_with_trailing_newline() -> None:
    with pytest.raises(KeyingError):
        KeyInputs(FINGERPRINT + "\n", make_context())


def test_key_inputs_rejects_non_context() -> None:
    with pytest.raises(KeyingError, match="CompileContext"):
        KeyInputs(FINGERPRINT, {"target": "trn1"})  # type: ignore[arg-type]


# --- compute_key ----------------------------------------------------------------------


def test_compute_key_golden() -> None:
    # Pinned: a change here means the key derivation changed; bump KEY_VERSION.
    key = key_of()
    assert key.key == "9c75b0114447c44e8897dffe910d3b4cf94c58c0282ccc4e1b026897232c34a3"
    assert key.as_json() == {
        "key_version": "1",
        "fingerprint": FINGERPRINT,
        "compiler_version": VERSION,
        "target": "trn1",
        "flags": ["--model-type=transformer", "--auto-cast=none", "--optlevel=1"],
        "env": {"NEURON_LOGICAL_NC_CONFIG": "2", "XLA_FLAGS": "--xla_cpu_fast_math"},
        "frameworks": {"nki": "0.1.0"},
    }


def _tagged(domain: str, fields: Mapping[str, bytes]) -> str:
    """The pre-image documented in neffcache.keying._hasher, rebuilt independently."""
    hasher = blake3.blake3(derive_key_context=domain)
    for label, data in fields.items():
        tag = label.encode()
        hasher.update(len(tag).to_bytes(8, "big") + tag + len(data).to_bytes(8, "big") + data)
    digest: str = hasher.hexdigest()
    return digest


def test_compute_key_matches_documented_preimage() -> None:
    fields = {
        "key_version": KEY_VERSION.encode(),
        "fingerprint": FINGERPRINT.encode(),
        "compiler_version": VERSION.encode(),
        "target": b"trn1",
        "flags": b'["--model-type=transformer","--auto-cast=none","--optlevel=1"]',
        "env": b'{"NEURON_LOGICAL_NC_CONFIG":"2","XLA_FLAGS":"--xla_cpu_fast_math"}',
        "frameworks": b'{"nki":"0.1.0"}',
    }
    assert key_of().key == _tagged(f"neffcache {KEY_VERSION} cache key", fields)


def test_compute_key_is_deterministic() -> None:
    assert key_of() == key_of()
    assert key_of().key == key_of().key


def test_key_changes_with_fingerprint() -> None:
    a, b = key_of(), key_of(fingerprint="f" * 64)
    assert a.key != b.key
    assert differing_components(a, b) == {"fingerprint"}


def test_key_changes_with_compiler_version() -> None:
    a, b = key_of(), key_of(compiler_version="2.20.9961.0+0acef03b")
    assert a.key != b.key
    assert differing_components(a, b) == {"compiler_version"}


def test_key_changes_with_target() -> None:
    a, b = key_of(), key_of(target="trn2")
    assert a.key != b.key
    assert differing_components(a, b) == {"target"}


def test_key_changes_with_flags() -> None:
    a, b = key_of(), key_of(flags="--model-type=transformer --auto-cast=none -O2")
    assert a.key != b.key
    assert differing_components(a, b) == {"flags"}


def test_key_changes_with_env() -> None:
    a = key_of()
    b = key_of(env={"NEURON_LOGICAL_NC_CONFIG": "1", "XLA_FLAGS": "--xla_cpu_fast_math"})
    assert a.key != b.key
    assert differing_components(a, b) == {"env"}


def test_key_changes_with_frameworks() -> None:
    a, b = key_of(), key_of(frameworks={"nki": "0.2.0"})
    assert a.key != b.key
    assert differing_components(a, b) == {"frameworks"}
    c = key_of(frameworks={})
    assert c.key not in (a.key, b.key)
    assert differing_components(a, c) == {"frameworks"}


def test_flag_spelling_does_not_change_key() -> None:
    respelled = key_of(
        flags=["--model-type", "transformer", "--no_cache", "--auto-cast", "none", "-O", "1"]
    )
    assert respelled == key_of()
    assert respelled.key == key_of().key


def test_compute_key_rejects_other_inputs() -> None:
    with pytest.raises(KeyingError):
        compute_key(FINGERPRINT)  # type: ignore[arg-type]


def test_cache_key_as_json_is_serializable_and_versioned() -> None:
    data = key_of().as_json()
    assert data["key_version"] == KEY_VERSION
    assert json.loads(json.dumps(data)) == data
    assert list(data) == [
        "key_version",
        "fingerprint",
        "compiler_version",
        "target",
        "flags",
        "env",
        "frameworks",
    ]


def test_cache_key_components_are_read_only() -> None:
    key = key_of()
    with pytest.raises(TypeError):
        key.components["target"] = "trn2"  # type: ignore[index]


# --- direct_key -----------------------------------------------------------------------


def test_direct_key_golden() -> None:
    # Pinned: a change here means the key derivation changed; bump KEY_VERSION.
    key = direct_key(MODULE, make_context())
    assert key.key == "d83ee8ea2f9700238ff843890726b762dd376d73cc0d70750029432d4b59dfdb"
    assert key.components["key_version"] == KEY_VERSION
    assert "module_digest" in key.components
    assert "fingerprint" not in key.components


def test_direct_key_differs_from_compute_key() -> None:
    ctx = make_context()
    canonical = compute_key(KeyInputs(FINGERPRINT, ctx))
    direct = direct_key(MODULE, ctx)
    assert direct.key != canonical.key
    # Even when the graph field carries the same hex, the domains keep them apart.
    digest = direct.components["module_digest"]
    assert isinstance(digest, str)
    assert compute_key(KeyInputs(digest, ctx)).key != direct.key


def test_direct_key_changes_with_one_byte_of_module() -> None:
    ctx = make_context()
    base = direct_key(MODULE, ctx)
    for changed in (b"\x0a\x01y", b"\x0a\x01x\x00", b"\x0a\x01", b"\x0b\x01x"):
        other = direct_key(changed, ctx)
        assert other.key != base.key
        assert differing_components(base, other) == {"module_digest"}


def test_direct_key_accepts_bytes_like() -> None:
    ctx = make_context()
    expected = direct_key(MODULE, ctx).key
    # Annotated as bytes; bytearray and memoryview are accepted at run time too.
    assert direct_key(bytearray(MODULE), ctx).key == expected  # type: ignore[arg-type]
    assert direct_key(memoryview(MODULE), ctx).key == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("label", "overrides"),
    [
        ("compiler_version", {"compiler_version": "2.21.0.0+0acef03a"}),
        ("target", {"target": "inf2"}),
        ("flags", {"flags": "--model-type=transformer"}),
        ("env", {"env": {}}),
        ("frameworks", {"frameworks": {"nki": "0.1.1"}}),
    ],
)
def test_direct_key_changes_with_each_context_field(label: str, overrides: dict[str, Any]) -> None:
    a = direct_key(MODULE, make_context())
    b = direct_key(MODULE, make_context(**overrides))
    assert a.key != b.key
    assert differing_components(a, b) == {label}


def test_direct_key_rejects_bad_arguments() -> None:
    with pytest.raises(KeyingError, match="bytes"):
        direct_key("not bytes", make_context())  # type: ignore[arg-type]
    with pytest.raises(KeyingError, match="CompileContext"):
        direct_key(MODULE, {"target": "trn1"})  # type: ignore[arg-type]


# --- stock Neuron addresses -----------------------------------------------------------

# Addresses seen in public logs (docs/neuron-sdk.md#where-the-cache-sits and #s3-backend):
# PJRT decimal keys and a 20-hex one.
ADDRESSES = [
    ("2.20.9961.0+0acef03a", "16518787498567201059", "3cc9a3cb"),
    ("2.13.72.0+78a426937", "fefbaedf6fbc82fc61a8", "ede6753c"),
    ("2.26.6360.0+6f180f47", "18108742649528384371", "839ddec0"),
    ("2.13.68.0+6dfecc895", "9048582265414220701", "5d2d81ce"),
    ("2.1.0.76+2909d26a2", "1", "abb26765"),
]


@pytest.mark.parametrize(("version", "module_key", "flags_hash"), ADDRESSES)
def test_neuron_address_round_trip(version: str, module_key: str, flags_hash: str) -> None:
    address = neuron_address(version, module_key, flags_hash)
    assert address == f"neuronxcc-{version}/MODULE_{module_key}+{flags_hash}"
    parsed = parse_neuron_address(address)
    assert parsed == NeuronAddress(version, module_key, flags_hash)
    assert str(parsed) == address


def test_parse_neuron_address_of_real_cache_entries() -> None:
    parsed = parse_neuron_address(
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
    )
    assert parsed.compiler_version == "2.20.9961.0+0acef03a"
    assert parsed.module_key == "16518787498567201059"
    assert parsed.flags_hash == "3cc9a3cb"
    nxd = parse_neuron_address("neuronxcc-2.13.72.0+78a426937/MODULE_fefbaedf6fbc82fc61a8+ede6753c")
    assert nxd.compiler_version == "2.13.72.0+78a426937"
    assert nxd.module_key == "fefbaedf6fbc82fc61a8"
    assert nxd.flags_hash == "ede6753c"


@pytest.mark.parametrize(
    "address",
    [
        "",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_1651878749856720105953cc9a3cb",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3c",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cbb",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3CC9A3CB",
        "neuronxcc-../MODULE_16518787498567201059+3cc9a3cb",
        "neuronxcc-2.20.9961.0+0acef03a/../MODULE_16518787498567201059+3cc9a3cb",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_../x+3cc9a3cb",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_a/b+3cc9a3cb",
        "../neuronxcc-2.20.9961.0+0acef03a/MODULE_1+3cc9a3cb",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_+3cc9a3cb",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_1+3cc9a3cb/model.neff",
        "neuronxcc-/MODULE_1+3cc9a3cb",
        "neuronxcc-abc/MODULE_1+3cc9a3cb",
        "/neuronxcc-2.20.9961.0+0acef03a/MODULE_1+3cc9a3cb",
        "neuronxcc-2.20.9961.0+0acef03a/MODULE_" + "1" * 129 + "+3cc9a3cb",
    ],
)
def test_parse_neuron_address_rejects(address: str) -> None:
    with pytest.raises(KeyingError):
        parse_neuron_address(address)


@pytest.mark.parametrize(
    ("version", "module_key", "flags_hash"),
    [
        ("2.20.9961.0+0acef03a", "..", "3cc9a3cb"),
        ("2.20.9961.0+0acef03a", "a/b", "3cc9a3cb"),
        ("2.20.9961.0+0acef03a", "", "3cc9a3cb"),
        ("2.20.9961.0+0acef03a", "1", "3cc9a3c"),
        ("2.20.9961.0+0acef03a", "1", "3CC9A3CB"),
        ("../..", "1", "3cc9a3cb"),
    ],
)
def test_neuron_address_validates_parts(version: str, module_key: str, flags_hash: str) -> None:
    with pytest.raises(KeyingError):
        neuron_address(version, module_key, flags_hash)


@pytest.mark.parametrize("where", ["module_key", "flags_hash", "parsed"])
def test_neuron_address_rejects_trailing_newline(where: str) -> None:
    calls: dict[str, Callable[[], object]] = {
        "module_key": lambda: neuron_address(VERSION, "16518787498567201059\n", "3cc9a3cb"),
        "flags_hash": lambda: neuron_address(VERSION, "16518787498567201059", "3cc9a3cb\n"),
        "parsed": lambda: parse_neuron_address(
            f"neuronxcc-{VERSION}/MODULE_16518787498567201059+3cc9a3cb\n"
        ),
    }
    with pytest.raises(KeyingError):
        calls[where]()


def test_undecodable_environment_bytes_still_key_apart() -> None:
    # os.environ turns undecodable bytes into lone surrogates.
    a = key_of(env={"XLA_FLAGS": "--xla_path=/p/\udcff"})
    b = key_of(env={"XLA_FLAGS": "--xla_path=/p/\udcfe"})
    assert a.key != b.key
    assert key_of(flags=["--logfile-dir=/\udcff"]).key != key_of(flags=["--logfile-dir=/x"]).key
