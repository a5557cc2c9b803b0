"""Canonical form and fingerprint of a serialized ``xla.HloModuleProto``.

Two modules get the same fingerprint when they differ only in what cannot change the
compiled program (facts §13, §17):

* names: module, entry computation, computations, instructions, and the parameter
  names of every program shape;
* the numbering of ids: every reference (operands, control predecessors, called
  computations, roots, the entry, the schedule) becomes a position in a canonical order;
* debug data: instruction ``metadata`` (op_type, op_name, source_file, source_line,
  stack frame ids), the module's ``stack_frame_index`` and ``profile_info``, and the
  instruction fields that only serve analysis tools (``statistics_viz``, and
  ``original_value``, which holds source variable names);
* the order in which the producer wrote computations and map entries.

Everything else is kept, including every field the schema does not declare: a spurious
miss costs one compile, a false hit hands a job the wrong executable.

Frontend attributes are kept: Neuron's torch-xla writes ``neff_input_names`` there,
which binds NEFF inputs at run time. ``DEBUG_FRONTEND_ATTRIBUTES`` lists keys shown to
be debug-only; it is empty because none has been. Adding one changes fingerprints, so
it bumps KEY_VERSION.

The canonical form is three parts, framed with lengths:

1. outer: the module with its computations in canonical order, every instruction, name
   and id removed;
2. instructions: every instruction, computation by computation in canonical order, with
   the ignored fields removed by the parser (``_hlo_schema`` stream view);
3. structure: per computation, its size, root, and each instruction's operands, control
   predecessors and called computations as canonical positions; then the entry and the
   schedule.

No Python loop runs per instruction: ids come from one parse of all instructions joined
with sentinel separators (``_references``), and ignored fields vanish inside the
protobuf parser. That keeps fingerprinting within a small factor of a plain
parse-and-serialize of the module (tests/bench/bench_keying.py).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import blake3
from google.protobuf.message import DecodeError

from ._errors import KeyingError
from ._hlo_schema import BOUNDARY_FIELD, HloModuleProto, InstructionStream, JoinedInstructions
from ._order import canonical_order
from ._version import KEY_VERSION

# Frontend attribute key -> evidence that it never changes the compiled program.
DEBUG_FRONTEND_ATTRIBUTES: Mapping[str, str] = {}

_FINGERPRINT_CONTEXT = f"neffcache {KEY_VERSION} canonical HloModuleProto fingerprint"
_MAGIC = f"neffcache-canonical-hlo/{KEY_VERSION}\n".encode()

_INSTRUCTION_END = -1  # sentinel after every instruction in the joined id lists
_COMPUTATION_END = -2  # sentinel after every computation
_REFERENCE_FIELDS = (35, 36, 37, 38)  # id, operand_ids, control_predecessor_ids, called


def fingerprint_hlo(module_bytes: bytes) -> str:
    """Return the 64-hex BLAKE3 fingerprint of a module's canonical form.

    >>> fingerprint_hlo(open("model.hlo_module.pb", "rb").read())  # doctest: +SKIP
    '5f1c...'

    Raises KeyingError when the bytes are not a well-formed HloModuleProto.
    """
    canonical = canonical_hlo(module_bytes)
    digest: str = blake3.blake3(canonical, derive_key_context=_FINGERPRINT_CONTEXT).hexdigest()
    return digest


def canonical_hlo(module_bytes: bytes) -> bytes:
    """Return the canonical form that ``fingerprint_hlo`` hashes (see the module doc)."""
    module = _parse(module_bytes)
    comps = list(module.computations)
    by_id = _computations_by_id(comps)
    flat = _flat_references(comps)
    called_segments = _segments(flat.called, len(comps))
    called = dict(zip(by_id, called_segments, strict=True))
    entry = _entry_computation(module, by_id)
    order = canonical_order(entry.id, called)
    comp_pos = {old: new for new, old in enumerate(order)}
    if order != list(by_id):
        flat = flat.reordered(order, list(by_id), called_segments)
    ordered = [by_id[old] for old in order]
    positions = _positions(flat.ids, ordered)
    structure = array("q", [comp_pos[entry.id]])
    _append_references(structure, flat, ordered, positions, comp_pos)
    _append_schedule(structure, module, positions, comp_pos)
    instructions = _instruction_stream([comp.instructions for comp in ordered])
    outer = _outer(module, comp_pos)
    parts = (outer, instructions, structure.tobytes())
    return _MAGIC + b"".join(len(part).to_bytes(8, "big") + part for part in parts)


def _parse(module_bytes: bytes) -> Any:
    if not isinstance(module_bytes, (bytes, bytearray, memoryview)):
        raise KeyingError(
            f"expected the bytes of an HloModuleProto, got {type(module_bytes).__name__}"
        )
    data = bytes(module_bytes)
    if not data:
        raise KeyingError("not an HLO module: the input is empty")
    if data.lstrip()[:9] == b"HloModule":
        raise KeyingError(
            "not an HLO module: this is HLO text; pass the serialized HloModuleProto "
            "(model.hlo_module.pb), not the text dump"
        )
    try:
        module = HloModuleProto.FromString(data)
    except DecodeError as exc:
        raise KeyingError(f"not an HLO module: protobuf decoding failed ({exc})") from exc
    if not module.computations:
        raise KeyingError("not an HLO module: it has no computations")
    return module


def _computations_by_id(comps: Sequence[Any]) -> dict[int, Any]:
    by_id: dict[int, Any] = {}
    for comp in comps:
        if comp.id in by_id:
            raise KeyingError(f"not an HLO module: computation id {comp.id} appears twice")
        if not comp.instructions:
            raise KeyingError(f"not an HLO module: computation id {comp.id} has no instructions")
        by_id[comp.id] = comp
    return by_id


def _entry_computation(module: Any, by_id: Mapping[int, Any]) -> Any:
    entry = by_id.get(module.entry_computation_id)
    if entry is not None:
        return entry
    # Old producers named the entry instead of giving its id.
    name = module.entry_computation_name
    for comp in by_id.values():
        if name and comp.name == name:
            return comp
    raise KeyingError(
        f"not an HLO module: entry computation id {module.entry_computation_id} "
        "matches no computation"
    )


@dataclass(frozen=True)
class _Flat:
    """The ids and id references of every instruction, as four flat lists.

    Each list holds, per instruction, its values followed by ``_INSTRUCTION_END``, and
    after each computation ``_COMPUTATION_END, _INSTRUCTION_END``: boundaries survive
    the flattening, so the lists are an unambiguous encoding of the references.
    """

    ids: list[int]
    operands: list[int]
    preds: list[int]
    called: list[int]

    def reordered(
        self, order: Sequence[int], file_order: Sequence[int], called: list[list[int]]
    ) -> _Flat:
        """The same lists with computations in ``order`` rather than file order.

        ``called`` is ``_segments(self.called)``, which the caller already has.
        """
        where = {comp_id: i for i, comp_id in enumerate(file_order)}
        lists = []
        for values in (self.ids, self.operands, self.preds, None):
            segments = called if values is None else _segments(values, len(file_order))
            out: list[int] = []
            for comp_id in order:
                out += segments[where[comp_id]]
                out += _COMPUTATION_TAIL
            lists.append(out)
        return _Flat(*lists)


def _varint_field(number: int, value: int) -> bytes:
    out = bytearray()
    for part in (number << 3, value & (2**64 - 1)):
        while True:
            byte, part = part & 0x7F, part >> 7
            out.append(byte | (0x80 if part else 0))
            if not part:
                break
    return bytes(out)


_INSTRUCTION_SEPARATOR = b"".join(_varint_field(n, _INSTRUCTION_END) for n in _REFERENCE_FIELDS)
_COMPUTATION_SEPARATOR = b"".join(_varint_field(n, _COMPUTATION_END) for n in _REFERENCE_FIELDS)


_COMPUTATION_TAIL = [_COMPUTATION_END, _INSTRUCTION_END]


def _flat_references(comps: Sequence[Any]) -> _Flat:
    """Read every instruction's id and references with one parse of all instructions.

    Concatenated messages parse as one message whose repeated fields append, so
    joining all instructions, each followed by a separator holding a sentinel in each
    id field (and each computation by one more), yields the four flat lists of
    ``_Flat``. Ids are never negative, so the sentinels cannot be confused with them;
    the check below rejects a module where one is.
    """
    items: list[bytes] = []
    for comp in comps:
        items.extend(comp.instructions)
        items.append(_COMPUTATION_SEPARATOR)
    joined = JoinedInstructions.FromString(
        _INSTRUCTION_SEPARATOR.join(items) + _INSTRUCTION_SEPARATOR
    )
    flat = _Flat(
        list(joined.id),
        list(joined.operand_ids),
        list(joined.control_predecessor_ids),
        list(joined.called_computation_ids),
    )
    # The parser keeps the separators in order, so the boundaries are where they were
    # put; a real id equal to a sentinel would show up as one sentinel too many.
    instructions, computations = len(items) - len(comps), len(comps)
    for values in (flat.ids, flat.operands, flat.preds, flat.called):
        if (
            values.count(_INSTRUCTION_END) != instructions + computations
            or values.count(_COMPUTATION_END) != computations
        ):
            raise KeyingError("not an HLO module: an instruction has negative or malformed ids")
    return flat


def _segments(values: list[int], count: int) -> list[list[int]]:
    """Split a checked flat list into its computations' parts, tails removed."""
    out: list[list[int]] = []
    start = 0
    for _ in range(count):
        end = values.index(_COMPUTATION_END, start)
        out.append(values[start:end])
        start = end + len(_COMPUTATION_TAIL)
    return out


def _positions(ids: list[int], ordered: Sequence[Any]) -> dict[int, int]:
    """Old instruction id -> position among all instructions in canonical order.

    XLA numbers instructions uniquely within a module, so one dict resolves every
    reference. (A reference into another computation is then encoded as such rather
    than rejected: still unambiguous, and no producer writes one.)
    """
    total = sum(len(comp.instructions) for comp in ordered)
    # Well-formed, each instruction gives [id, END] and each computation [CEND, END]:
    # every second value is END, and the others are the ids and computation ends.
    if len(ids) % 2 == 0 and ids[1::2].count(_INSTRUCTION_END) == len(ids) // 2:
        real = list(filter((0).__le__, ids[0::2]))
    else:
        real = []
    if len(real) != total:
        real = _with_zero_ids(ids, ordered)
    positions = dict(zip(real, range(total), strict=True))
    if len(positions) != total:
        raise KeyingError("not an HLO module: an instruction id appears twice in the module")
    positions[_INSTRUCTION_END] = _INSTRUCTION_END
    positions[_COMPUTATION_END] = _COMPUTATION_END
    return positions


def _with_zero_ids(ids: list[int], ordered: Sequence[Any]) -> list[int]:
    """proto3 omits an id of 0, so an instruction may contribute only its sentinel."""
    real: list[int] = []
    for comp, segment in zip(ordered, _segments(ids, len(ordered)), strict=True):
        real += _split_ids(segment, len(comp.instructions), comp.id)
    return real


def _split_ids(flat: list[int], count: int, comp_id: int) -> list[int]:
    """One id per instruction from ``[id, END, id, END, ...]``.

    proto3 omits an id of 0, so an instruction may contribute only its sentinel.
    """
    if len(flat) == 2 * count and flat[1::2].count(_INSTRUCTION_END) == count:
        return flat[0::2]
    ids: list[int] = []
    pending: list[int] = []
    for value in flat:
        if value != _INSTRUCTION_END:
            pending.append(value)
            continue
        if len(pending) > 1:
            raise _malformed(comp_id)
        ids.append(pending[0] if pending else 0)
        pending = []
    if len(ids) != count or pending:
        raise _malformed(comp_id)
    return ids


def _malformed(comp_id: int) -> KeyingError:
    return KeyingError(
        f"not an HLO module: an instruction of computation id {comp_id} has malformed id fields"
    )


def _append_references(
    structure: array[int],
    flat: _Flat,
    ordered: Sequence[Any],
    positions: Mapping[int, int],
    comp_pos: Mapping[int, int],
) -> None:
    try:
        roots = [positions[comp.root_id] for comp in ordered]
        operands = list(map(positions.__getitem__, flat.operands))
        preds = list(map(positions.__getitem__, flat.preds))
    except KeyError as exc:
        raise KeyingError(
            f"not an HLO module: a root or operand names instruction id {exc.args[0]}, "
            "which does not exist"
        ) from None
    sizes = [len(comp.instructions) for comp in ordered]
    structure.append(len(ordered))
    structure.extend(chain.from_iterable(zip(sizes, roots, strict=True)))
    calls = dict(comp_pos)
    calls[_INSTRUCTION_END] = _INSTRUCTION_END
    calls[_COMPUTATION_END] = _COMPUTATION_END
    called = list(map(calls.__getitem__, flat.called))
    for values in (operands, preds, called):
        structure.append(len(values))
        structure.extend(values)


def _append_schedule(
    structure: array[int], module: Any, positions: Mapping[int, int], comp_pos: Mapping[int, int]
) -> None:
    if not module.HasField("schedule"):
        structure.append(-1)  # no schedule, as opposed to an empty one
        return
    sequences = []
    for old, sequence in module.schedule.sequences.items():
        if old not in comp_pos:
            raise KeyingError(
                f"not an HLO module: the schedule names computation id {old}, which does not exist"
            )
        try:
            ids = list(map(positions.__getitem__, sequence.instruction_ids))
        except KeyError as exc:
            raise KeyingError(
                f"not an HLO module: the schedule of computation id {old} names instruction "
                f"id {exc.args[0]}, which does not exist"
            ) from None
        sequences.append((comp_pos[old], ids))
    sequences.sort()
    structure.append(len(sequences))
    for pos, ids in sequences:
        structure.extend((pos, len(ids)))
        structure.extend(ids)


_GROUP_START = _varint_field(1, 0)[:1].replace(b"\x08", b"\x0b")  # field 1, start group
_GROUP_END = b"\x0c"  # field 1, end group
_BOUNDARY = _varint_field(BOUNDARY_FIELD, 1)


def _instruction_stream(blocks: Sequence[Any]) -> bytes:
    """Every instruction in order, ignored fields dropped by the parser (``_hlo_schema``)."""
    separator = _BOUNDARY + _GROUP_END + _GROUP_START
    raw = _GROUP_START + separator.join(chain.from_iterable(blocks)) + _BOUNDARY + _GROUP_END
    try:
        stream = InstructionStream.FromString(raw)
    except DecodeError as exc:
        raise KeyingError(f"not an HLO module: an instruction is malformed ({exc})") from exc
    if len(stream.instr) != sum(len(block) for block in blocks):
        raise KeyingError("not an HLO module: an instruction is malformed")
    if DEBUG_FRONTEND_ATTRIBUTES:
        for instr in stream.instr:
            _drop_debug_attributes(instr.frontend_attributes)
    result: bytes = stream.SerializeToString(deterministic=True)
    return result


def _outer(module: Any, comp_pos: Mapping[int, int]) -> bytes:
    module.computations.sort(key=lambda comp: comp_pos[comp.id])
    for comp in module.computations:
        for field in ("name", "instructions", "id", "root_id"):
            comp.ClearField(field)
        comp.program_shape.ClearField("parameter_names")
    for field in _IGNORED_MODULE_FIELDS:
        module.ClearField(field)
    module.host_program_shape.ClearField("parameter_names")
    if DEBUG_FRONTEND_ATTRIBUTES:
        _drop_debug_attributes(module.frontend_attributes)
    result: bytes = module.SerializeToString(deterministic=True)
    return result


# Cleared from the module: names, ids (carried as positions in the structure part),
# the schedule (likewise), and debug data.
_IGNORED_MODULE_FIELDS = (
    "name",
    "entry_computation_name",
    "id",
    "entry_computation_id",
    "schedule",
    "profile_info",
    "stack_frame_index",
)


def _drop_debug_attributes(attrs: Any) -> None:
    for key in DEBUG_FRONTEND_ATTRIBUTES:
        if key in attrs.map:
            del attrs.map[key]
