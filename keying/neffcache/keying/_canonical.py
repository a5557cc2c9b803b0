"""Canonical form and fingerprint of a serialized ``xla.HloModuleProto``.

Two modules get the same fingerprint when they differ only in what cannot change the
compiled program (docs/neuron-sdk.md#what-changes-the-key and #names-and-ids-in-hlomoduleproto):

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

The canonical form is four parts, framed with lengths:

1. outer: the module with computations in canonical order, every instruction, name and
   id removed;
2. instructions: every kept field of every instruction, in canonical order, each
   instruction closed by an empty field 1 and each computation by an empty field 7
   (fields that never stay in an instruction here, so the stream reads back
   unambiguously);
3. frontend attributes: per instruction, its attribute map serialized with sorted keys;
4. structure: per computation its size and root, and every operand, control
   predecessor and called computation as a canonical position; the entry; the schedule.

No Python code runs per instruction: ``_joined`` parses all instructions as one
message, which yields the id fields as flat lists and part 2 as its unknown fields.
Python work is per computation (an entry computation and its reduction regions) and
per module. That keeps fingerprinting within a small factor of a plain
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
from ._hlo_schema import BytesList, FramedModule, FrontendAttributes, HloModuleProto
from ._joined import (
    ATTRS_COMPUTATION_END,
    ATTRS_INSTRUCTION_END,
    COMPUTATION_END,
    INSTRUCTION_END,
    Joined,
    reorder,
    segments,
)
from ._order import canonical_order
from ._version import KEY_VERSION

# Frontend attribute key -> evidence that it never changes the compiled program.
DEBUG_FRONTEND_ATTRIBUTES: Mapping[str, str] = {}

_FINGERPRINT_CONTEXT = f"neffcache {KEY_VERSION} canonical HloModuleProto fingerprint"
_MAGIC = f"neffcache-canonical-hlo/{KEY_VERSION}\n".encode()


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
    graph = ordered_module(module_bytes)
    module, joined, moved, comp_pos = graph.module, graph.joined, graph.moved, graph.comp_pos
    structure = graph.wiring()
    structure += _schedule(module, graph.positions, comp_pos)
    content = joined.canonical_content(moved)
    attrs = _canonical_attributes(joined.attrs, moved, len(graph.ordered))
    # Last: _outer clears the computations' instructions and ids.
    parts = (_outer(module, comp_pos), content, attrs, structure)
    return _MAGIC + b"".join(len(part).to_bytes(8, "big") + part for part in parts)


@dataclass(frozen=True)
class OrderedModule:
    """A parsed module in canonical order: what the fingerprint and the graph summary
    (``_summary.py``) both start from."""

    module: Any
    joined: Joined
    ordered: list[Any]  # computations in canonical order
    comp_pos: dict[int, int]  # computation id -> canonical position
    positions: dict[int, int]  # instruction id -> canonical position
    moved: list[int] | None  # each canonical computation's index in the file; None: same
    entry_id: int

    def wiring(self) -> bytes:
        """The entry's position, then ``_structure``: sizes, roots, operands, control
        predecessors and calls as canonical positions."""
        out = array("q", [self.comp_pos[self.entry_id]]).tobytes()
        return out + _structure(
            self.joined, self.ordered, self.positions, self.comp_pos, self.moved
        )


def ordered_module(module_bytes: bytes) -> OrderedModule:
    """Parse and order a module (KeyingError for what is not a well-formed one)."""
    module = _parse(module_bytes)
    comps = list(module.computations)
    by_id = _computations_by_id(comps)
    joined = Joined.parse(comps)
    entry = _entry_computation(module, by_id)
    order = canonical_order(entry.id, dict(zip(by_id, joined.callees(len(comps)), strict=True)))
    comp_pos = {old: new for new, old in enumerate(order)}
    ordered = [by_id[old] for old in order]
    positions = _positions(joined.ids, comps, ordered)
    where = {comp_id: i for i, comp_id in enumerate(by_id)}
    # Index of each computation, in canonical order, among the file's; None if equal.
    moved = None if order == list(by_id) else [where[old] for old in order]
    return OrderedModule(module, joined, ordered, comp_pos, positions, moved, entry.id)


def _parse(module_bytes: bytes) -> Any:
    if not isinstance(module_bytes, (bytes, bytearray, memoryview)):
        raise KeyingError(
            f"expected the bytes of an HloModuleProto, got {type(module_bytes).__name__}"
        )
    data = bytes(module_bytes)
    if not data:
        raise KeyingError("not an HLO module: the input is empty")
    try:
        module = HloModuleProto.FromString(data)
    except DecodeError as exc:
        raise KeyingError(f"not an HLO module: {_why_not(data, exc)}") from exc
    if _wraps_a_module(module):
        raise KeyingError(
            "not an HLO module: this is an HloProto, as XLA's --xla_dump_hlo_as_proto "
            "writes; pass the HloModuleProto it holds as field 1"
        )
    if not module.computations:
        raise KeyingError(f"not an HLO module: {_why_not(data, None)}")
    try:
        FramedModule.FromString(data)
    except DecodeError as exc:
        raise KeyingError(f"not an HLO module: an instruction is malformed ({exc})") from exc
    return module


def _why_not(data: bytes, exc: DecodeError | None) -> str:
    if data.lstrip()[:9] == b"HloModule":
        return "this is HLO text; pass the serialized HloModuleProto (model.hlo_module.pb)"
    return f"protobuf decoding failed ({exc})" if exc else "it has no computations"


def _wraps_a_module(module: Any) -> bool:
    """Whether field 1, which a module uses for its name, holds a whole module.

    An HloProto keeps its module there (and a buffer assignment in field 3, which the
    module view would take for computations). Rejected rather than unwrapped: a module
    whose name is another module must not be keyed as that other module.
    """
    if not module.name or (module.name.isascii() and module.name.decode().isprintable()):
        return False  # a name, as every producer writes one
    try:
        inner = HloModuleProto.FromString(module.name)
    except DecodeError:
        return False
    return bool(inner.computations)


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


def _positions(ids: list[int], comps: Sequence[Any], ordered: Sequence[Any]) -> dict[int, int]:
    """Old instruction id -> position among all instructions in canonical order.

    XLA numbers instructions uniquely within a module, so one dict resolves every
    reference. (A reference into another computation is then encoded as such rather
    than rejected: still unambiguous, and no producer writes one.)
    """
    offsets: dict[int, int] = {}
    total = 0
    for comp in ordered:
        offsets[comp.id] = total
        total += len(comp.instructions)
    # In file order, as the ids come.
    spans = chain.from_iterable(
        range(offsets[comp.id], offsets[comp.id] + len(comp.instructions)) for comp in comps
    )
    # Well-formed, each instruction gives [id, END] and each computation [CEND, END]:
    # every second value is END, and the others are the ids and computation ends.
    real: list[int] = []
    if len(ids) % 2 == 0 and ids[1::2].count(INSTRUCTION_END) == len(ids) // 2:
        real = list(filter((0).__le__, ids[0::2]))
    if len(real) != total:
        real = _ids_allowing_zero(ids, comps)
    positions = dict(zip(real, spans, strict=True))
    if len(positions) != total:
        raise KeyingError("not an HLO module: an instruction id appears twice in the module")
    positions[INSTRUCTION_END] = INSTRUCTION_END
    positions[COMPUTATION_END] = COMPUTATION_END
    return positions


def _ids_allowing_zero(ids: list[int], comps: Sequence[Any]) -> list[int]:
    """One id per instruction where proto3 omitted ids of 0: an END alone means 0."""
    real: list[int] = []
    pending: list[int] = []
    after_computation = False
    for value in ids:
        if value >= 0:
            pending.append(value)
        elif value == COMPUTATION_END and not pending:
            after_computation = True  # its own END follows; it closes no instruction
        elif value == INSTRUCTION_END and after_computation:
            after_computation = False
        elif value == INSTRUCTION_END and len(pending) <= 1:
            real.append(pending[0] if pending else 0)
            pending = []
        else:
            raise KeyingError("not an HLO module: an instruction has malformed id fields")
    if pending or len(real) != sum(len(comp.instructions) for comp in comps):
        raise KeyingError("not an HLO module: an instruction has malformed id fields")
    return real


def _structure(
    joined: Joined,
    ordered: Sequence[Any],
    positions: Mapping[int, int],
    comp_pos: Mapping[int, int],
    moved: list[int] | None,
) -> bytes:
    """Sizes and roots, then operands, control predecessors and calls as positions."""
    try:
        roots = [positions[comp.root_id] for comp in ordered]
        operands = list(map(positions.__getitem__, joined.operands))
        preds = list(map(positions.__getitem__, joined.preds))
    except KeyError as exc:
        raise KeyingError(
            f"not an HLO module: a root or operand names instruction id {exc.args[0]}, "
            "which does not exist"
        ) from None
    if min(roots) < 0:  # a sentinel's own entry in ``positions``
        raise KeyingError("not an HLO module: a computation's root id is negative")
    calls = dict(comp_pos)
    calls[INSTRUCTION_END] = INSTRUCTION_END
    calls[COMPUTATION_END] = COMPUTATION_END
    called = list(map(calls.__getitem__, joined.called))
    sizes = [len(comp.instructions) for comp in ordered]
    out = array("q", [len(ordered)])
    out.extend(chain.from_iterable(zip(sizes, roots, strict=True)))
    parts = [out.tobytes()]
    for values in (operands, preds, called):
        data = array("q", values).tobytes()
        if moved is not None:
            data = reorder(data, moved)
        parts.append(len(data).to_bytes(8, "big") + data)
    return b"".join(parts)


def _schedule(module: Any, positions: Mapping[int, int], comp_pos: Mapping[int, int]) -> bytes:
    """Each scheduled computation's instruction order, as positions.

    Fields of a sequence this view does not declare are kept, as its leftover bytes;
    the schedule's own are kept by ``_outer``.
    """
    if not module.HasField("schedule"):
        return array("q", [-1]).tobytes()  # no schedule, as opposed to an empty one
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
        if ids and min(ids) < 0:
            raise KeyingError(
                f"not an HLO module: the schedule of computation id {old} is malformed"
            )
        sequence.ClearField("instruction_ids")
        sequences.append((comp_pos[old], ids, sequence.SerializeToString(deterministic=True)))
    sequences.sort()
    out = array("q", [len(sequences)])
    leftovers = []
    for pos, ids, leftover in sequences:
        out.extend((pos, len(ids), len(leftover)))
        out.extend(ids)
        leftovers.append(leftover)
    return out.tobytes() + b"".join(leftovers)


_TRIVIAL_ATTRIBUTES = frozenset({b"", ATTRS_INSTRUCTION_END, ATTRS_COMPUTATION_END})


def _canonical_attributes(blobs: list[bytes], moved: list[int] | None, count: int) -> bytes:
    """Each instruction's frontend attributes with sorted keys; absent and empty alike.

    Most modules carry none (JAX writes an empty map on every instruction), which is
    one byte. Otherwise each distinct map is canonicalized once: typically every
    instruction has one of a few.
    """
    distinct = set(blobs)
    if distinct <= _TRIVIAL_ATTRIBUTES:
        return b"\x00"
    if moved is not None:
        parts = segments(blobs, count, ATTRS_COMPUTATION_END)
        tail = [ATTRS_COMPUTATION_END, ATTRS_INSTRUCTION_END]
        blobs = list(chain.from_iterable(chain(parts[i], tail) for i in moved))
    canonical: dict[bytes, bytes] = {}
    for blob in distinct:
        if blob in _TRIVIAL_ATTRIBUTES:
            canonical[blob] = blob
            continue
        try:
            attrs = FrontendAttributes.FromString(blob)
        except DecodeError as exc:
            raise KeyingError(f"not an HLO module: malformed frontend attributes ({exc})") from exc
        _drop_debug_attributes(attrs)
        canonical[blob] = attrs.SerializeToString(deterministic=True)
    out = BytesList()
    out.items.extend(filter(None, map(canonical.__getitem__, blobs)))
    result: bytes = b"\x01" + out.SerializeToString()
    return result


def _outer(module: Any, comp_pos: Mapping[int, int]) -> bytes:
    module.computations.sort(key=lambda comp: comp_pos[comp.id])
    for comp in module.computations:
        for field in ("name", "instructions", "id", "root_id"):
            comp.ClearField(field)
        comp.program_shape.ClearField("parameter_names")
    for field in _IGNORED_MODULE_FIELDS:
        module.ClearField(field)
    if module.HasField("schedule"):
        module.schedule.ClearField("sequences")  # carried as positions; the rest is kept
    module.host_program_shape.ClearField("parameter_names")
    _drop_debug_attributes(module.frontend_attributes)
    result: bytes = module.SerializeToString(deterministic=True)
    return result


# Cleared from the module: names, ids (carried as positions in the structure part),
# and debug data.
_IGNORED_MODULE_FIELDS = (
    "name",
    "entry_computation_name",
    "id",
    "entry_computation_id",
    "profile_info",
    "stack_frame_index",
)


def _drop_debug_attributes(attrs: Any) -> None:
    for key in DEBUG_FRONTEND_ATTRIBUTES:
        if key in attrs.map:
            del attrs.map[key]
