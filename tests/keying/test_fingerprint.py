"""fingerprint_hlo on real XLA-serialized modules (tests/fixtures/make_hlo_fixtures.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hlo_edit import RawModule, field
from hlo_edit import parse as _parse

from neffcache.keying import KeyingError, canonical_hlo, fingerprint_hlo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hlo"
# One manifest per producer script: jax.json (make_hlo_fixtures.py), torch_xla.json
# (make_torch_xla_fixtures.py).
MANIFEST: dict[str, dict[str, Any]] = {
    name: entry
    for manifest in sorted(FIXTURES.glob("*.json"))
    for name, entry in json.loads(manifest.read_text())["fixtures"].items()
}


def load(name: str) -> bytes:
    return (FIXTURES / f"{name}.pb").read_bytes()


def groups() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, entry in MANIFEST.items():
        out.setdefault(entry["group"], []).append(name)
    return out


SAME = [(g, a, b) for g, names in groups().items() for a, b in itertools.combinations(names, 2)]


def test_every_variant_kind_the_key_must_tell_apart_has_a_fixture() -> None:
    wanted = {"shape", "dtype", "op", "constant", "operand_order", "layout"}
    wanted |= {"sharding_rows", "sharding_cols"}
    assert {f"variant_{kind}" for kind in wanted} <= set(groups())
    assert {"allreduce_pair", "allreduce_single"} <= set(groups())
    assert {"torch_block", "torch_variant_shape"} <= set(groups())
    assert len(groups()["block"]) >= 6


@pytest.mark.parametrize(("group", "a", "b"), SAME, ids=[f"{a}={b}" for _, a, b in SAME])
def test_same_program_same_fingerprint(group: str, a: str, b: str) -> None:
    # The fixtures really differ as bytes: names, ids, metadata or map order.
    assert load(a) != load(b)
    assert fingerprint_hlo(load(a)) == fingerprint_hlo(load(b))


def test_different_programs_never_share_a_fingerprint() -> None:
    by_group: dict[str, set[str]] = {}
    for name, entry in MANIFEST.items():
        by_group.setdefault(entry["group"], set()).add(fingerprint_hlo(load(name)))
    assert all(len(prints) == 1 for prints in by_group.values())
    everyone = [next(iter(prints)) for prints in by_group.values()]
    assert len(set(everyone)) == len(everyone)


def test_metadata_and_names_really_were_in_the_inputs() -> None:
    # Guards the equality tests against fixtures that lost what they are meant to vary.
    assert b"block_a.py" in load("block_a")
    assert b"block_b.py" in load("block_b_renamed")
    assert b"encoder/layer_0" in load("block_b_renamed")
    assert b"block_a.py" not in load("block_a_source_paths_stripped")
    assert b"renamed_value_" in load("block_text_renamed")
    assert b"jit_block" in load("block_a")
    assert b"torch_block_a.py" in load("torch_block_debug")
    assert b"torch_block_b.py" in load("torch_block_other_file")
    assert b"torch_block_a.py" not in load("torch_block")


def test_fingerprint_is_64_hex_and_deterministic() -> None:
    data = load("block_a")
    first = fingerprint_hlo(data)
    assert len(first) == 64
    assert int(first, 16) >= 0
    assert fingerprint_hlo(bytearray(data)) == first
    assert fingerprint_hlo(memoryview(data)) == first


def test_canonical_form_drops_names_paths_and_metadata() -> None:
    canonical = canonical_hlo(load("block_b_renamed"))
    for debris in (b"block_b.py", b"layer_forward", b"encoder", b"inputs", b"weight"):
        assert debris not in canonical
    # ...and keeps what the compiler reads.
    for kept in (b"tanh", b"dot", b"reduce"):
        assert kept in canonical


def test_unknown_fields_are_kept_so_nothing_semantic_is_dropped() -> None:
    module = _parse(load("block_a"))
    # Field 500 of an instruction: unknown to the schema (and to XLA today). A future
    # semantic field must change the fingerprint, not vanish.
    module.computations[-1].instructions[3].MergeFromString(b"\xa0\x1f\x01")
    changed = module.SerializeToString()
    assert fingerprint_hlo(changed) != fingerprint_hlo(load("block_a"))


def test_computation_order_in_the_file_does_not_matter() -> None:
    module = _parse(load("allreduce_groups_pair"))
    assert len(module.computations) == 2
    reordered = _parse(load("allreduce_groups_pair"))
    first, second = (type(c)() for c in reordered.computations)
    first.CopyFrom(reordered.computations[1])
    second.CopyFrom(reordered.computations[0])
    del reordered.computations[:]
    reordered.computations.extend([first, second])
    assert reordered.SerializeToString() != module.SerializeToString()
    assert fingerprint_hlo(reordered.SerializeToString()) == fingerprint_hlo(
        load("allreduce_groups_pair")
    )


def test_id_offsets_do_not_matter() -> None:
    # torch-xla numbers instructions with process-wide counters: the same graph traced
    # later has every id shifted.
    module = _parse(load("block_a"))
    shift = 1000
    for comp in module.computations:
        comp.id += shift
        comp.root_id += shift
        for instr in comp.instructions:
            instr.id += shift
            instr.operand_ids[:] = [i + shift for i in instr.operand_ids]
            instr.called_computation_ids[:] = [i + shift for i in instr.called_computation_ids]
    module.entry_computation_id += shift
    shifted = module.SerializeToString()
    assert shifted != load("block_a")
    assert fingerprint_hlo(shifted) == fingerprint_hlo(load("block_a"))


def test_a_rewired_operand_changes_the_fingerprint() -> None:
    module = _parse(load("variant_operand_order"))
    entry = module.computations[-1]
    binary = next(i for i in entry.instructions if len(i.operand_ids) == 2)
    binary.operand_ids[:] = [binary.operand_ids[0], binary.operand_ids[0]]
    assert fingerprint_hlo(module.SerializeToString()) != fingerprint_hlo(
        load("variant_operand_order")
    )


NOT_HLO = {
    "empty": b"",
    "text": b"HloModule jit_f, entry_computation_layout={()->f32[]}\n",
    "garbage": bytes(range(256)) * 4,
    "json": b'{"key": "value"}',
    "truncated": None,  # filled from a fixture below
}


@pytest.mark.parametrize("kind", sorted(NOT_HLO))
def test_bytes_that_are_not_an_hlo_module_raise_keying_error(kind: str) -> None:
    data = NOT_HLO[kind]
    if data is None:
        data = load("block_a")[:-7]
    with pytest.raises(KeyingError, match="not an HLO module"):
        fingerprint_hlo(data)


def test_text_hlo_gets_a_hint() -> None:
    with pytest.raises(KeyingError, match="HLO text"):
        fingerprint_hlo(b"  HloModule m\n")


def test_non_bytes_input_is_rejected() -> None:
    with pytest.raises(KeyingError, match="bytes"):
        fingerprint_hlo("HloModule")  # type: ignore[arg-type]


def _mutated(mutate: Any) -> bytes:
    module = _parse(load("block_a"))
    mutate(module)
    data: bytes = module.SerializeToString()
    return data


def test_entry_found_by_name_when_its_id_is_stale() -> None:
    # Old producers named the entry instead of giving its id.
    stale = _mutated(lambda m: setattr(m, "entry_computation_id", 777))
    assert fingerprint_hlo(stale) == fingerprint_hlo(load("block_a"))


@pytest.mark.parametrize(
    ("what", "mutate"),
    [
        ("dangling operand", lambda m: m.computations[-1].instructions[2].operand_ids.append(99)),
        ("dangling root", lambda m: setattr(m.computations[-1], "root_id", 12345)),
        (
            "dangling entry",
            lambda m: (
                setattr(m, "entry_computation_id", 777),
                m.ClearField("entry_computation_name"),
            ),
        ),
        (
            "dangling call",
            lambda m: m.computations[-1].instructions[0].called_computation_ids.append(55),
        ),
        (
            "duplicate computation id",
            lambda m: setattr(m.computations[0], "id", m.computations[1].id),
        ),
        ("no computations", lambda m: m.ClearField("computations")),
        ("empty computation", lambda m: m.computations[0].ClearField("instructions")),
        ("root id -1", lambda m: setattr(m.computations[-1], "root_id", -1)),
        ("root id -2", lambda m: setattr(m.computations[-1], "root_id", -2)),
        ("operand id -1", lambda m: m.computations[-1].instructions[2].operand_ids.append(-1)),
    ],
)
def test_malformed_modules_raise_keying_error(what: str, mutate: Any) -> None:
    with pytest.raises(KeyingError, match="not an HLO module"):
        fingerprint_hlo(_mutated(mutate))


# Known digests: a change here changes every canonical key, so it must come with a
# KEY_VERSION bump (keying/neffcache/keying/_version.py).
GOLDEN = {
    "block": "618b30db463877df47cb018c569be563e03e4ec754b676002b5a022ad34c5335",
    "allreduce_pair": "7371067e4c1d8e766d2fb2e3fdb8ec6f16a3d154af0dc3c12f65a8adc202fdc8",
    "attrs": "48766162c5699b78fe9f54916f25da35b0310b2d76593932b466d4a186d6bfa7",
    "torch_block": "b0efa88cdff26339e0384b578ba9f1b141d187b608d7e9d125ff8d4b8d0ca5e9",
    "block_scheduled": "73d30d09bf16d9ed0980aa603bfe57d55aa22e1d503e373595e0d5fd80e61202",
}


@pytest.mark.parametrize("group", sorted(GOLDEN))
def test_golden_fingerprints(group: str) -> None:
    for name in groups()[group]:
        assert fingerprint_hlo(load(name)) == GOLDEN[group], name


def _swap_computations(module: Any) -> None:
    first, second = (type(c)() for c in module.computations)
    first.CopyFrom(module.computations[1])
    second.CopyFrom(module.computations[0])
    del module.computations[:]
    module.computations.extend([first, second])


# A field 536870911 (the largest field number), as the canonical form's own instruction
# marker is spelled, with some payload.
FAKE_MARK = b"\xfa\xff\xff\xff\x0f\x10" + bytes(range(16))


def test_kept_bytes_that_look_like_a_marker_still_reorder_correctly() -> None:
    # backend_config (field 43) holding a marker-like field: the bytes must not be
    # taken for a boundary, in file order or after computations move.
    def with_marker(module: Any) -> None:
        module.computations[-1].instructions[-1].MergeFromString(
            b"\xda\x02" + bytes([len(FAKE_MARK)]) + FAKE_MARK
        )

    in_order = _mutated_from("allreduce_groups_pair", with_marker)
    swapped = _mutated_from(
        "allreduce_groups_pair", lambda m: (with_marker(m), _swap_computations(m))
    )
    assert in_order != swapped
    assert fingerprint_hlo(in_order) == fingerprint_hlo(swapped)
    assert fingerprint_hlo(in_order) != fingerprint_hlo(load("allreduce_groups_pair"))


def test_a_marker_field_in_an_instruction_cannot_move_fields_to_its_neighbour() -> None:
    # With a fixed marker, an instruction carrying the marker field
    # could hand a kept field (here parameter_number=1, field 9) to the next
    # instruction, and modules with different parameters would share a fingerprint.
    def m1(module: Any) -> None:
        module.computations[-1].instructions[0].MergeFromString(FAKE_MARK + b"\x48\x01")

    def m2(module: Any) -> None:
        module.computations[-1].instructions[1].MergeFromString(FAKE_MARK)

    assert fingerprint_hlo(_mutated_from("block_a", m1)) != fingerprint_hlo(
        _mutated_from("block_a", m2)
    )


def test_frontend_attributes_follow_their_instruction_when_computations_move() -> None:
    # neff_input_names="input0" on the all-reduce's parameter, as a raw field 68.
    entry = b"\n\x10neff_input_names\x12\x06input0"
    attrs = b"\n" + bytes([len(entry)]) + entry

    def with_attrs(module: Any) -> None:
        module.computations[-1].instructions[0].MergeFromString(
            b"\xa2\x04" + bytes([len(attrs)]) + attrs
        )

    in_order = _mutated_from("allreduce_groups_pair", with_attrs)
    swapped = _mutated_from(
        "allreduce_groups_pair", lambda m: (with_attrs(m), _swap_computations(m))
    )
    assert fingerprint_hlo(in_order) == fingerprint_hlo(swapped)
    assert fingerprint_hlo(in_order) != fingerprint_hlo(load("allreduce_groups_pair"))


def test_computation_ids_whose_bytes_mimic_separators_are_just_ids() -> None:
    # -258 is fe fe ff ff ff ff ff ff in memory: read one byte late it looks like the
    # -2 that ends a computation in the canonical form's lists.
    def huge(module: Any) -> None:
        mapping = {c.id: -258 - 256 * i for i, c in enumerate(module.computations)}
        for comp in module.computations:
            comp.id = mapping[comp.id]
            for instr in comp.instructions:
                instr.called_computation_ids[:] = [mapping[c] for c in instr.called_computation_ids]
        module.entry_computation_id = mapping[module.entry_computation_id]

    changed = _mutated_from("allreduce_groups_pair", huge)
    assert changed != load("allreduce_groups_pair")
    assert fingerprint_hlo(changed) == fingerprint_hlo(load("allreduce_groups_pair"))


def test_an_instruction_with_id_zero_is_found() -> None:
    # proto3 does not write an id of 0; XLA's text parser numbers from 0.
    module = _parse(load("block_text"))
    assert 0 in {i.id for c in module.computations for i in c.instructions}
    assert fingerprint_hlo(load("block_text")) == fingerprint_hlo(load("block_a"))


def _mutated_from(name: str, mutate: Any) -> bytes:
    module = _parse(load(name))
    mutate(module)
    data: bytes = module.SerializeToString()
    return data


@pytest.mark.parametrize("buffer_assignment", [b"", field(2, b"\x08\x01")])
def test_an_hlo_proto_is_refused_with_a_hint(buffer_assignment: bytes) -> None:
    # XLA's --xla_dump_hlo_as_proto writes an HloProto: the module is its field 1, and
    # a buffer assignment (field 3) must not be read as computations:
    # with one buffer alias, two different wrapped programs would share a fingerprint.
    for name in ("block_a", "variant_op"):
        wrapped = field(1, load(name)) + (field(3, buffer_assignment) if buffer_assignment else b"")
        with pytest.raises(KeyingError, match="HloProto"):
            fingerprint_hlo(wrapped)


def test_a_module_named_like_hlo_text_is_still_a_module() -> None:
    module = _parse(load("allreduce_groups_pair"))
    module.name = b"HloModule"
    renamed = module.SerializeToString()
    assert renamed.startswith(b"\n\tHloModule")
    assert fingerprint_hlo(renamed) == fingerprint_hlo(load("allreduce_groups_pair"))


def test_unknown_fields_of_a_schedule_sequence_are_kept() -> None:
    # Schedule (module field 7) -> sequences map entry (1) -> value (2) -> field 9.
    base = load("block_scheduled")
    module = _parse(base)
    raw = module.SerializeToString()
    outer = _parse(raw)
    assert outer.SerializeToString() == raw
    changed = fingerprint_hlo(_append_to_first_sequence(base, b"\x48\x07"))
    assert changed != fingerprint_hlo(base)


def _append_to_first_sequence(data: bytes, extra: bytes) -> bytes:
    """Append raw fields to the first schedule sequence, with a schema of its own."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="t_sched.proto", package="tsched")
    proto.syntax = "proto3"
    seq = proto.message_type.add(name="Seq")
    seq.field.add(name="ids", number=1, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    entry = proto.message_type.add(name="Entry")
    entry.field.add(name="key", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    entry.field.add(
        name="value", number=2, type=f.TYPE_MESSAGE, type_name=".tsched.Seq", label=f.LABEL_OPTIONAL
    )
    sched = proto.message_type.add(name="Sched")
    sched.field.add(
        name="seqs",
        number=1,
        type=f.TYPE_MESSAGE,
        type_name=".tsched.Entry",
        label=f.LABEL_REPEATED,
    )
    mod = proto.message_type.add(name="Mod")
    mod.field.add(
        name="schedule",
        number=7,
        type=f.TYPE_MESSAGE,
        type_name=".tsched.Sched",
        label=f.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("tsched.Mod"))
    module = cls.FromString(data)
    assert module.schedule.seqs
    module.schedule.seqs[0].value.MergeFromString(extra)
    result: bytes = module.SerializeToString()
    return result


@pytest.mark.parametrize(
    "suffix",
    [
        b"\x12\x7f",  # a length running past the instruction
        b"\x0a\x2d",  # a name that would swallow the bytes that follow
        b"\x0c",  # an end-group tag with no group
        b"\x07",  # wire type 7
    ],
)
def test_instruction_bytes_that_do_not_parse_raise_keying_error(suffix: bytes) -> None:
    module = RawModule.FromString(load("block_a"))
    module.computations[-1].instructions[0] += suffix
    with pytest.raises(KeyingError, match="not an HLO module"):
        fingerprint_hlo(module.SerializeToString())
