"""graph_summary on real XLA-serialized modules: the structure digest (the graph with
shapes, layouts, literals and names erased) and the per-instruction shapes.

Edited inputs are made with tests/hlo_edit.py and hand-encoded protobuf fields, never
with the code under test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hlo_edit import Module, RawModule, field, varint
from hlo_edit import parse as _parse

from neffcache.keying import GraphSummary, KeyingError, fingerprint_hlo, graph_summary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hlo"
MANIFEST: dict[str, dict[str, Any]] = {
    name: entry
    for manifest in sorted(FIXTURES.glob("*.json"))
    for name, entry in json.loads(manifest.read_text())["fixtures"].items()
}


def load(name: str) -> bytes:
    return (FIXTURES / f"{name}.pb").read_bytes()


def summary(name: str) -> GraphSummary:
    return graph_summary(load(name))


# Known digests. The structure never enters a key, but the server's program map stores
# them: a change here must come with a STRUCTURE_VERSION bump (keying/_summary.py).
GOLDEN = {
    "8decc9fa7d16bed5e5fab2a24b2ee7edf7d0c7271b5601eb82fe7251a9eef0e4": {
        # The block, however produced, and every variant that keeps its ops and wiring:
        # other shapes, constants, layouts and shardings.
        *(n for n, e in MANIFEST.items() if e["group"] in ("block", "block_scheduled")),
        "variant_shape",
        "variant_constant",
        "variant_layout",
        "variant_sharding_rows",
        "variant_sharding_cols",
    },
    "82144c0155160e022eb121e2d2315d62a7319aa786dbe4421d7023f82bad2723": {
        *(n for n, e in MANIFEST.items() if e["group"] == "torch_block"),
        "torch_variant_shape",
    },
    "5fa1ff4b6d81168d1374e279dd02a17683a61feeb0cb69438152425df8315041": {
        "allreduce_groups_pair",
        "allreduce_groups_pair_renamed",
        "allreduce_groups_single",  # replica groups are an attribute
    },
    "d856bbcb5f39ed9c58b159245e28f5ad4721f108537c3ebf0016cb360fe591f2": {
        "attrs_ab",
        "attrs_ba",
        "attrs_other_value",
    },
    "ee2a5926e6ec91dd118bb78d1ab4adf244e0a8dd3fe21a5b4003071982c1a687": {"variant_op"},
    "3c86c21af96544f81f912f5104890b52db010428fcedbaf716fc5dac30788f39": {"variant_operand_order"},
    # bf16 inputs: XLA adds converts, so the graph itself changes.
    "589154581001b597567d4874765784fe352f713191a285c99e1d8a84ae0a87ec": {"variant_dtype"},
}

BLOCK_A_SHAPES = (
    "parameter f32[]",
    "parameter f32[]",
    "add f32[]",
    "parameter f32[8,16]",
    "parameter f32[16,32]",
    "dot f32[8,32]",
    "parameter f32[32]",
    "reshape f32[1,32]",
    "broadcast f32[1,32]",
    "reshape f32[32]",
    "broadcast f32[8,32]",
    "add f32[8,32]",
    "tanh f32[8,32]",
    "constant f32[]",
    "reduce f32[8]",
    "constant f32[]",
    "broadcast f32[8]",
    "multiply f32[8]",
)


def test_every_fixture_has_a_golden_structure() -> None:
    pinned = set().union(*GOLDEN.values())
    assert pinned == set(MANIFEST)


@pytest.mark.parametrize("digest", sorted(GOLDEN))
def test_golden_structures(digest: str) -> None:
    for name in sorted(GOLDEN[digest]):
        assert summary(name).structure == digest, name


def test_golden_shapes_of_block_a_in_canonical_order() -> None:
    # The reduction region (called by the reduce) comes first: callees before callers.
    got = summary("block_a")
    assert got.instructions == 18
    assert got.shapes == BLOCK_A_SHAPES


def test_golden_shapes_of_a_torch_xla_step_end_in_its_tuple() -> None:
    got = summary("torch_block")
    assert got.instructions == 20
    assert got.shapes[-1] == "tuple (f32[8])"
    assert got.shapes[3] == "constant s32[]"


def test_structure_is_64_hex_and_apart_from_the_fingerprint() -> None:
    got = summary("block_a")
    assert len(got.structure) == 64
    assert int(got.structure, 16) >= 0
    assert got.structure != fingerprint_hlo(load("block_a"))
    assert graph_summary(bytearray(load("block_a"))) == got
    assert graph_summary(memoryview(load("block_a"))) == got


@pytest.mark.parametrize(
    "name",
    [n for n, e in MANIFEST.items() if e["group"] == "block" and n != "block_a"]
    + ["block_scheduled_renamed", "torch_block_debug", "torch_block_other_file"],
)
def test_names_ids_and_debug_metadata_change_nothing(name: str) -> None:
    reference = "torch_block" if name.startswith("torch") else "block_a"
    assert load(name) != load(reference)
    assert summary(name) == summary(reference)
    assert summary(name).shapes == summary(reference).shapes


def _edited(name: str, edit: Any, *, raw: bool = False) -> bytes:
    module = RawModule() if raw else Module()
    module.ParseFromString(load(name))
    edit(module)
    data: bytes = module.SerializeToString()
    return data


def test_renaming_everything_changes_nothing() -> None:
    def rename(module: Any) -> None:
        module.name = b"other_module"
        module.entry_computation_name = b"other_entry"
        for c, comp in enumerate(module.computations):
            comp.name = f"comp_{c}".encode()
            for i, instr in enumerate(comp.instructions):
                instr.name = f"v{c}_{i}".encode()

    renamed = _edited("block_a", rename)
    assert renamed != load("block_a")
    assert graph_summary(renamed) == summary("block_a")


def test_renumbering_ids_changes_nothing() -> None:
    def renumber(module: Any) -> None:
        new = {c.id: 500 + 7 * n for n, c in enumerate(module.computations)}
        ids = {i.id: 9000 - 3 * n for n, i in enumerate(_instructions(module))}
        for comp in module.computations:
            comp.id = new[comp.id]
            comp.root_id = ids[comp.root_id]
            for instr in comp.instructions:
                instr.id = ids[instr.id]
                instr.operand_ids[:] = [ids[o] for o in instr.operand_ids]
                instr.called_computation_ids[:] = [new[c] for c in instr.called_computation_ids]
        module.entry_computation_id = new[module.entry_computation_id]

    renumbered = _edited("block_a", renumber)
    assert renumbered != load("block_a")
    assert graph_summary(renumbered) == summary("block_a")
    assert graph_summary(renumbered).shapes == BLOCK_A_SHAPES


def _instructions(module: Any) -> list[Any]:
    return [instr for comp in module.computations for instr in comp.instructions]


def test_the_order_computations_are_written_in_changes_nothing() -> None:
    def swap(module: Any) -> None:
        first, second = (type(c)() for c in module.computations)
        first.CopyFrom(module.computations[1])
        second.CopyFrom(module.computations[0])
        del module.computations[:]
        module.computations.extend([first, second])

    swapped = _edited("allreduce_groups_pair", swap)
    assert swapped != load("allreduce_groups_pair")
    assert graph_summary(swapped) == summary("allreduce_groups_pair")
    assert graph_summary(swapped).shapes == summary("allreduce_groups_pair").shapes


def test_a_shape_change_changes_shapes_and_not_structure() -> None:
    # The committed variant: x is f32[4,16] instead of f32[8,16].
    a, b = summary("block_a"), summary("variant_shape")
    assert a.structure == b.structure
    differing = [i for i, (x, y) in enumerate(zip(a.shapes, b.shapes, strict=True)) if x != y]
    assert [b.shapes[i] for i in differing] == [
        "parameter f32[4,16]",
        "dot f32[4,32]",
        "broadcast f32[4,32]",
        "add f32[4,32]",
        "tanh f32[4,32]",
        "reduce f32[4]",
        "broadcast f32[4]",
        "multiply f32[4]",
    ]


def _shape(
    element_type: int, dims: tuple[int, ...] = (), *, dynamic: tuple[bool, ...] = ()
) -> bytes:
    """A ShapeProto (xla_data.proto): element_type 2, dimensions 3, is_dynamic 6."""
    body = b"\x10" + varint(element_type)
    body += b"".join(b"\x18" + varint(d) for d in dims)
    body += b"".join(b"\x30" + varint(int(d)) for d in dynamic)
    return body


def _tuple_shape(*elements: bytes) -> bytes:
    return b"\x10\x0d" + b"".join(field(4, e) for e in elements)  # TUPLE = 13


def test_one_instruction_with_another_shape_differs_in_that_one_shape() -> None:
    # A second shape field on the dot merges into the first (protobuf's rule for a
    # singular message): dimensions append, f32[8,32] becomes f32[8,32,2].
    def widen(module: Any) -> None:
        module.computations[-1].instructions[2] += field(3, b"\x18\x02")

    edited = graph_summary(_edited("block_a", widen, raw=True))
    assert edited.structure == summary("block_a").structure
    assert edited.shapes[5] == "dot f32[8,32,2]"
    assert [i for i, s in enumerate(edited.shapes) if s != BLOCK_A_SHAPES[i]] == [5]


def test_an_opcode_change_changes_the_structure() -> None:
    def to_sin(module: Any) -> None:
        tanh = next(i for i in module.computations[-1].instructions if i.opcode == b"tanh")
        tanh.opcode = b"sine"

    edited = graph_summary(_edited("block_a", to_sin))
    assert edited.structure != summary("block_a").structure
    assert edited.shapes[12] == "sine f32[8,32]"
    assert edited.structure == summary("variant_op").structure  # JAX's own sin


def test_the_last_opcode_written_wins() -> None:
    # Two opcode fields in one instruction's bytes: protobuf keeps the last.
    def twice(module: Any) -> None:
        module.computations[-1].instructions[9] += field(2, b"sine")

    edited = graph_summary(_edited("block_a", twice, raw=True))
    assert edited.shapes[12] == "sine f32[8,32]"
    assert edited.structure == summary("variant_op").structure


def test_rewiring_an_operand_changes_the_structure_not_the_shapes() -> None:
    def rewire(module: Any) -> None:
        add = next(i for i in module.computations[-1].instructions if i.opcode == b"add")
        add.operand_ids[:] = [add.operand_ids[1], add.operand_ids[0]]

    edited = graph_summary(_edited("block_a", rewire))
    assert edited.structure != summary("block_a").structure
    assert edited.shapes == BLOCK_A_SHAPES


def test_parameter_numbers_and_custom_call_targets_are_structure() -> None:
    def swap_params(module: Any) -> None:
        entry = module.computations[-1]
        entry.instructions[0] += b"\x48\x01"  # parameter_number (9) = 1
        entry.instructions[1] += b"\x48\x00"  # and 0: x and w trade places

    def custom(target: bytes) -> Any:
        def edit(module: Any) -> None:
            tanh = module.computations[-1].instructions[9]
            module.computations[-1].instructions[9] = (
                tanh + field(2, b"custom-call") + field(28, target)
            )

        return edit

    base = summary("block_a").structure
    assert graph_summary(_edited("block_a", swap_params, raw=True)).structure != base
    rms = graph_summary(_edited("block_a", custom(b"AwsNeuronRmsNorm"), raw=True))
    gelu = graph_summary(_edited("block_a", custom(b"AwsNeuronGelu"), raw=True))
    assert rms.structure != gelu.structure
    assert rms.shapes == gelu.shapes
    assert rms.shapes[12] == "custom-call f32[8,32]"


def test_a_parameter_number_equal_to_the_sentinel_is_read_one_by_one() -> None:
    # The smallest int64 closes each instruction in the joined parse; a real value
    # equal to it must not shift values between instructions.
    def edit(module: Any) -> None:
        module.computations[-1].instructions[0] += b"\x48" + varint(-(2**63))

    edited = graph_summary(_edited("block_a", edit, raw=True))
    assert edited.shapes == BLOCK_A_SHAPES
    assert edited.structure != summary("block_a").structure


def test_tuples_tokens_dynamic_dimensions_and_unknown_types_print_as_xla_does() -> None:
    many = _tuple_shape(*[_shape(11, (2,))] * 10, _shape(4))

    def shapes(module: Any) -> None:
        entry = module.computations[-1]
        # Unused instructions, as XLA allows: the root stays.
        extra = [
            (_tuple_shape(_shape(11, (2,)), _shape(4)), 9001),
            (many, 9002),
            (_shape(17), 9003),  # TOKEN
            (_shape(16, (8, 128), dynamic=(True, False)), 9004),  # BF16, first dynamic
            (_shape(99, (3,)), 9005),  # a type this view does not know
        ]
        for shape, new_id in extra:
            entry.instructions.append(
                field(2, b"tuple") + field(3, shape) + b"\x98\x02" + varint(new_id)
            )

    got = graph_summary(_edited("block_a", shapes, raw=True))
    assert got.shapes[-5:] == (
        "tuple (f32[2], s32[])",
        "tuple (" + ", ".join(["f32[2]"] * 8) + ", ... 3 more)",
        "tuple token[]",
        "tuple bf16[<=8,128]",
        "tuple type99[3]",
    )
    assert got.instructions == 23


def test_a_shape_that_does_not_parse_prints_as_a_question_mark() -> None:
    def garble(module: Any) -> None:
        module.computations[-1].instructions[2] += field(3, b"\xff")

    got = graph_summary(_edited("block_a", garble, raw=True))
    assert got.shapes[5] == "dot ?"
    assert got.structure == summary("block_a").structure


def test_as_json_leaves_out_the_shapes_of_large_graphs() -> None:
    got = summary("block_a")
    assert got.as_json() == {
        "structure": got.structure,
        "instructions": 18,
        "shapes": list(BLOCK_A_SHAPES),
    }
    assert "shapes" not in got.as_json(shapes_max=17)
    assert got.as_json(shapes_max=None)["shapes"] == list(BLOCK_A_SHAPES)


NOT_HLO = {
    "empty": b"",
    "text": b"HloModule jit_f, entry_computation_layout={()->f32[]}\n",
    "garbage": bytes(range(256)) * 4,
    "truncated": None,
}


@pytest.mark.parametrize("kind", sorted(NOT_HLO))
def test_what_fingerprint_hlo_refuses_graph_summary_refuses(kind: str) -> None:
    data = NOT_HLO[kind]
    if data is None:
        data = load("block_a")[:-7]
    with pytest.raises(KeyingError, match="not an HLO module") as summarized:
        graph_summary(data)
    with pytest.raises(KeyingError) as fingerprinted:
        fingerprint_hlo(data)
    assert str(summarized.value) == str(fingerprinted.value)


def test_a_dangling_operand_is_refused() -> None:
    module = _parse(load("block_a"))
    module.computations[-1].instructions[2].operand_ids.append(99)
    with pytest.raises(KeyingError, match="does not exist"):
        graph_summary(module.SerializeToString())


def test_non_bytes_input_is_refused() -> None:
    with pytest.raises(KeyingError, match="bytes"):
        graph_summary("HloModule")  # type: ignore[arg-type]
