"""fingerprint_mlir on real StableHLO bytecode (tests/fixtures/make_mlir_fixtures.py)."""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from neffcache.keying import (
    KeyingError,
    _canonical,
    _mlir,
    _mlir_props,
    fingerprint_hlo,
    fingerprint_mlir,
    is_mlir_bytecode,
    is_mlir_text,
)
from neffcache.keying._mlir_attrs import Entries
from neffcache.keying._mlir_reader import encode_varint, parse_bytecode

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MLIR = FIXTURES / "mlir"
MANIFEST: dict[str, dict[str, Any]] = json.loads((MLIR / "mlir.json").read_text())["fixtures"]
# A change to this digest changes every MLIR key: bump KEY_VERSION (keying/_version.py).
GOLDEN_BLOCK_A = "31605a48188795db708e4ea00e270daef25983d44885e66e4e8f2dd27cc85f56"


def load(name: str) -> bytes:
    return (MLIR / f"{name}.mlirbc").read_bytes()


def groups() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, entry in MANIFEST.items():
        out.setdefault(entry["group"], []).append(name)
    return out


def pinned(data: bytes) -> bool:
    """Whether the fingerprint had to pin the tables by position (an opaque entry)."""
    canonical = _mlir._Canonical(parse_bytecode(data))
    list(canonical.parts())
    return canonical.entries.pinned


def locations(data: bytes) -> int:
    return sum(Entries(parse_bytecode(data)).is_location)


def edit_string(data: bytes, old: bytes, new: bytes) -> bytes:
    """Replace one string of the string table by another of the same length."""
    assert len(old) == len(new)
    assert data.count(old + b"\x00") == 1, old
    return data.replace(old + b"\x00", new + b"\x00")


SAME = [(g, a, b) for g, names in groups().items() for a, b in itertools.combinations(names, 2)]


def test_every_variant_kind_the_brief_names_has_a_fixture() -> None:
    wanted = {"shape", "dtype", "op", "constant", "operand_order"}
    assert {f"variant_{kind}" for kind in wanted} <= set(groups())
    assert {"calls", "calls_renamed_callee", "dense_constant", "dense_constant_changed"} <= set(
        groups()
    )
    assert len(groups()["block"]) >= 6
    assert (MLIR / "block_a.mlir").is_file()
    # An older writer: version 1 keeps attributes in dictionaries, not properties.
    assert parse_bytecode(load("block_a_v1")).version == 1
    assert len(groups()["block_v1"]) == 2


@pytest.mark.parametrize(("group", "a", "b"), SAME, ids=[f"{a}={b}" for _, a, b in SAME])
def test_same_program_same_fingerprint(group: str, a: str, b: str) -> None:
    # The fixtures really differ as bytes: locations, names, numbering.
    assert load(a) != load(b)
    assert fingerprint_mlir(load(a)) == fingerprint_mlir(load(b))


def test_different_programs_never_share_a_fingerprint() -> None:
    by_group: dict[str, set[str]] = {}
    for name, entry in MANIFEST.items():
        by_group.setdefault(entry["group"], set()).add(fingerprint_mlir(load(name)))
    assert all(len(prints) == 1 for prints in by_group.values())
    everyone = [next(iter(prints)) for prints in by_group.values()]
    assert len(set(everyone)) == len(everyone)


def test_golden_digest() -> None:
    assert fingerprint_mlir(load("block_a")) == GOLDEN_BLOCK_A


def test_locations_and_names_really_were_in_the_inputs() -> None:
    # Guards the equality tests against fixtures that lost what they are meant to vary.
    assert b"block_a.py" in load("block_a")
    assert b"block_b.py" in load("block_b_renamed")
    assert b"encoder/layer_0" in load("block_b_renamed")
    assert b"jit_layer_forward" in load("block_b_renamed")
    assert b"jit_block" in load("block_a")
    assert b".py" not in load("block_a_stripped")
    assert b"args[0]" in load("block_a_no_locations")  # names, but fewer locations:
    assert locations(load("block_a_no_locations")) < locations(load("block_a"))
    assert locations(load("block_a")) < locations(load("block_a_full_tracebacks"))
    assert b"calls_c.py" in load("calls_c_other_file")
    assert b"scaled_tanh" in load("calls_a")
    assert b"squashed" in load("calls_b_renamed_callee")


def test_locations_shift_attribute_and_string_numbers() -> None:
    # The experiment behind resolving references by content: the same program with
    # and without locations numbers its attributes and strings differently, while
    # operation names, types and properties keep their numbers.
    with_locs, without = parse_bytecode(load("block_a")), parse_bytecode(load("block_a_stripped"))

    def attrs(bc: Any) -> list[bytes]:
        return [bc.entry(n) for n in range(bc.n_attrs)]

    empty_dict = b"\x03\x01"
    assert attrs(with_locs).index(empty_dict) != attrs(without).index(empty_dict)
    assert with_locs.strings.index(b"main") != without.strings.index(b"main")
    assert with_locs.op_names == without.op_names
    types = [with_locs.entry(n) for n in range(with_locs.n_attrs, len(with_locs.entry_dialect))]
    assert types == [without.entry(n) for n in range(without.n_attrs, len(without.entry_dialect))]
    assert len(with_locs.properties) == len(without.properties)
    assert [with_locs.data[slice(*p)] for p in with_locs.properties] != [
        without.data[slice(*p)] for p in without.properties
    ]


@pytest.mark.parametrize("name", [n for n in MANIFEST if not n.startswith("vhlo")])
def test_jax_stablehlo_needs_no_opaque_entry(name: str) -> None:
    # Every attribute, type and properties blob JAX writes is decoded by content, so
    # no table has to be pinned by position (which would make locations split keys).
    assert not pinned(load(name))


def test_vhlo_is_opaque_and_keyed_conservatively() -> None:
    data = load("vhlo_block")
    assert is_mlir_bytecode(data)
    assert pinned(data)
    assert fingerprint_mlir(data) == fingerprint_mlir(bytes(data))
    assert fingerprint_mlir(data) != fingerprint_mlir(load("block_a"))


def test_the_top_level_module_name_is_dropped() -> None:
    data = load("block_a")
    renamed = edit_string(data, b"jit_block", b"jit_other")
    assert fingerprint_mlir(renamed) == fingerprint_mlir(data)


def test_a_file_name_in_locations_is_dropped() -> None:
    data = load("block_b_renamed")
    path = next(s for s in parse_bytecode(data).strings if s.endswith(b"block_b.py"))
    renamed = edit_string(data, path, path[:-10] + b"other_b.py")
    assert fingerprint_mlir(renamed) == fingerprint_mlir(data)


def test_function_names_are_kept() -> None:
    # func.func @main: its name is what calls and the runtime refer to.
    data = load("block_a")
    assert fingerprint_mlir(edit_string(data, b"main", b"mian")) != fingerprint_mlir(data)
    calls = load("calls_a")
    renamed = edit_string(calls, b"scaled_tanh", b"scaled_tanx")
    assert fingerprint_mlir(renamed) != fingerprint_mlir(calls)


def test_attribute_values_are_kept() -> None:
    data = load("block_a")
    edited = edit_string(data, b"result", b"resulu")  # jax.result_info = "result"
    assert fingerprint_mlir(edited) != fingerprint_mlir(data)


def test_an_undecodable_properties_blob_pins_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the layout of dot_general its properties are opaque: the key stays a
    # function of the program, but locations now split it (a spurious miss, never a
    # false hit).
    layouts = dict(_mlir_props.LAYOUTS)
    del layouts[b"stablehlo.dot_general"]
    monkeypatch.setattr(_mlir, "LAYOUTS", layouts)
    a, stripped = load("block_a"), load("block_a_stripped")
    assert pinned(a)
    assert fingerprint_mlir(a) == fingerprint_mlir(bytes(a))
    assert fingerprint_mlir(a) != fingerprint_mlir(stripped)
    monkeypatch.undo()
    assert fingerprint_mlir(a) == fingerprint_mlir(stripped)


def test_fingerprint_is_64_hex_and_deterministic() -> None:
    data = load("zoo")
    first = fingerprint_mlir(data)
    assert len(first) == 64
    assert int(first, 16) >= 0
    assert first == first.lower()
    assert fingerprint_mlir(bytearray(data)) == first  # type: ignore[arg-type]
    assert fingerprint_mlir(memoryview(data)) == first  # type: ignore[arg-type]


def test_its_own_domain() -> None:
    assert _mlir._FINGERPRINT_CONTEXT != _canonical._FINGERPRINT_CONTEXT
    assert "StableHLO bytecode" in _mlir._FINGERPRINT_CONTEXT


def test_the_same_bytes_give_the_same_fingerprint_in_another_process() -> None:
    path = MLIR / "zoo.mlirbc"
    code = (
        "import sys; from neffcache.keying import fingerprint_mlir; "
        "print(fingerprint_mlir(open(sys.argv[1], 'rb').read()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert out == fingerprint_mlir(path.read_bytes())


# --- recognizing inputs ---------------------------------------------------------------


def test_sniffers_on_fixtures() -> None:
    text = (MLIR / "block_a.mlir").read_bytes()
    hlo = (FIXTURES / "hlo" / "block_a.pb").read_bytes()
    for name in MANIFEST:
        assert is_mlir_bytecode(load(name))
        assert not is_mlir_text(load(name))
    assert is_mlir_text(text)
    assert not is_mlir_bytecode(text)
    assert not is_mlir_text(hlo)
    assert not is_mlir_bytecode(hlo)
    fingerprint_hlo(hlo)  # it really is an HLO module


@pytest.mark.parametrize(
    "text",
    [
        b"module {\n}\n",
        b"  \n// a comment\nmodule @jit_f attributes {} {\n}",
        b'"builtin.module"() ({\n}) : () -> ()',
        b"func.func @main(%arg0: tensor<f32>) -> tensor<f32> {\n",
        b"#loc = loc(unknown)\nmodule {}",
        b"#map = affine_map<(d0) -> (d0)>\n",
    ],
)
def test_mlir_text_is_recognized(text: bytes) -> None:
    assert is_mlir_text(text)
    assert not is_mlir_bytecode(text)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"HloModule jit_f, entry_computation_layout={()->f32[]}\n",
        b"\x0a\x07jit_f\x12\x00",
        b"\xff\xfe\x00module",
        b"# a python comment\nimport module",
        b"modules are fun",
        b"ML\xefR",
    ],
)
def test_other_inputs_are_not_mlir_text(data: bytes) -> None:
    assert not is_mlir_text(data)


def test_mlir_text_has_no_canonical_form() -> None:
    with pytest.raises(KeyingError, match="MLIR text has no canonical form"):
        fingerprint_mlir((MLIR / "block_a.mlir").read_bytes())


@pytest.mark.parametrize("data", [b"", b"HloModule x\n", b"\x00" * 16, "a str"])
def test_not_bytecode(data: Any) -> None:
    with pytest.raises(KeyingError):
        fingerprint_mlir(data)


def test_an_hlo_module_is_not_mlir_bytecode() -> None:
    with pytest.raises(KeyingError, match="not MLIR bytecode"):
        fingerprint_mlir((FIXTURES / "hlo" / "block_a.pb").read_bytes())


# --- what the reader does not know ----------------------------------------------------


def test_unknown_bytecode_version() -> None:
    data = load("block_a")
    assert data[4:5] == encode_varint(6)
    with pytest.raises(KeyingError, match="version 7 is newer"):
        fingerprint_mlir(data[:4] + encode_varint(7) + data[5:])


def test_unknown_section_kind() -> None:
    data = load("block_a") + b"\x09\x01"  # a section of kind 9, empty
    with pytest.raises(KeyingError, match="section kind 9"):
        fingerprint_mlir(data)


def test_a_duplicate_section() -> None:
    bc = parse_bytecode(load("block_a"))
    start, end = bc.ir
    ir = bc.data[start:end]
    data = bc.data + b"\x04" + encode_varint(len(ir)) + ir
    with pytest.raises(KeyingError, match="section where none may be"):
        fingerprint_mlir(data)


# --- the layout table ----------------------------------------------------------------


def _binding_layouts() -> dict[bytes, list[tuple[str, bool]]]:
    """Operation properties from jaxlib's ODS-generated Python bindings: attributes
    set under ``if`` in ``__init__`` are optional, the others required."""
    jaxlib = pytest.importorskip("jaxlib")
    dialects = Path(jaxlib.__file__).parent / "mlir" / "dialects"
    out: dict[bytes, list[tuple[str, bool]]] = {}
    for module in ("builtin", "func", "stablehlo", "chlo"):
        tree = ast.parse((dialects / f"_{module}_ops_gen.py").read_text())
        for cls in tree.body:
            name, attrs = _op_attributes(cls)
            if name is not None and attrs:
                out[name.encode()] = sorted(attrs.items())
    return out


def _op_attributes(cls: ast.stmt) -> tuple[str | None, dict[str, bool]]:
    if not isinstance(cls, ast.ClassDef) or cls.name.endswith("Adaptor"):
        return None, {}
    name = None
    segments = False
    for st in cls.body:
        if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
            target, value = st.targets[0].id, st.value
            if target == "OPERATION_NAME" and isinstance(value, ast.Constant):
                name = str(value.value)
            if target == "_ODS_OPERAND_SEGMENTS" and not isinstance(value, ast.Constant):
                segments = True
    init = next(
        (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None
    )
    if name is None or init is None or segments:
        return None, {}
    attrs: dict[str, bool] = {}

    def visit(body: list[ast.stmt], optional: bool) -> None:
        for st in body:
            if isinstance(st, ast.If):
                visit(st.body, True)
                visit(st.orelse, optional)
            elif isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Subscript):
                target = st.targets[0]
                if isinstance(target.value, ast.Name) and target.value.id == "attributes":
                    assert isinstance(target.slice, ast.Constant)
                    attrs[str(target.slice.value)] = optional

    visit(init.body, False)
    return name, attrs


def test_layouts_match_the_installed_bindings() -> None:
    bindings = _binding_layouts()
    ours = {
        op: [(name, optional) for name, optional, _ in fields]
        for op, fields in _mlir_props.LAYOUTS.items()
    }
    assert ours == bindings
