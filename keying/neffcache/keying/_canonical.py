"""Canonical form and fingerprint of a serialized ``xla.HloModuleProto``.

Two modules get the same fingerprint when they differ only in what cannot change the
compiled program (facts §13, §17):

* names: module, entry computation, computations, instructions, and the parameter
  names of every program shape;
* the numbering of ids: computations and instructions are renumbered densely in a
  deterministic order and every reference is remapped (operands, control
  predecessors, called computations, roots, the entry, the schedule);
* debug data: instruction ``metadata`` (op_type, op_name, source_file, source_line,
  stack frame ids), the module's ``stack_frame_index`` and ``profile_info``, and the
  instruction fields that only serve analysis tools (``statistics_viz``,
  ``original_value``, which holds source variable names);
* the order in which the producer happened to write computations and map entries.

Everything else is kept, including every field the schema does not declare
(see ``_hlo_schema``): a spurious miss costs one compile, a false hit serves a job the
wrong executable, so when in doubt a field stays in.

Frontend attributes are kept: Neuron's torch-xla writes ``neff_input_names`` there,
which binds NEFF inputs at run time. ``DEBUG_FRONTEND_ATTRIBUTES`` lists the keys shown
to be debug-only; it is empty because no key has been shown to be. Adding one changes
fingerprints, so it bumps KEY_VERSION.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import blake3
from google.protobuf.message import DecodeError

from ._errors import KeyingError
from ._hlo_schema import HloModuleProto
from ._version import KEY_VERSION

# Frontend attribute key -> evidence that it never changes the compiled program.
DEBUG_FRONTEND_ATTRIBUTES: Mapping[str, str] = {}

_FINGERPRINT_CONTEXT = f"neffcache {KEY_VERSION} canonical HloModuleProto fingerprint"

# Instruction fields that never reach the compiled program; see the module docstring.
_DROPPED_INSTRUCTION_FIELDS = ("name", "metadata", "statistics_viz", "original_value")
_DROPPED_MODULE_FIELDS = ("name", "entry_computation_name", "id", "profile_info", "stack_frame_index")


def fingerprint_hlo(module_bytes: bytes) -> str:
    """Return the 64-hex BLAKE3 fingerprint of a module's canonical form.

    >>> fingerprint_hlo(open("model.hlo_module.pb", "rb").read())  # doctest: +SKIP
    '5f1c...'

    Raises KeyingError when the bytes are not a well-formed HloModuleProto.
    """
    canonical = canonical_hlo(module_bytes)
    return blake3.blake3(canonical, derive_key_context=_FINGERPRINT_CONTEXT).hexdigest()


def canonical_hlo(module_bytes: bytes) -> bytes:
    """Return the canonical serialization that ``fingerprint_hlo`` hashes."""
    module = _parse(module_bytes)
    _canonicalize(module)
    result: bytes = module.SerializeToString(deterministic=True)
    return result


def _parse(module_bytes: bytes) -> Any:
    if not isinstance(module_bytes, (bytes, bytearray, memoryview)):
        raise KeyingError(f"expected the bytes of an HloModuleProto, got {type(module_bytes).__name__}")
    data = bytes(module_bytes)
    if not data:
        raise KeyingError("not an HLO module: the input is empty")
    if data.lstrip()[:9] == b"HloModule":
        raise KeyingError(
            "not an HLO module: this is HLO text; pass the serialized HloModuleProto "
            "(model.hlo_module.pb), not the text dump"
        )
    module = HloModuleProto()
    try:
        module.ParseFromString(data)
    except DecodeError as exc:
        raise KeyingError(f"not an HLO module: protobuf decoding failed ({exc})") from exc
    if not module.computations:
        raise KeyingError("not an HLO module: it has no computations")
    return module


def _canonicalize(module: Any) -> None:
    computations = {}
    for comp in module.computations:
        if comp.id in computations:
            raise KeyingError(f"not an HLO module: computation id {comp.id} appears twice")
        computations[comp.id] = comp
    entry = _entry_computation(module, computations)
    order = _canonical_order(entry, computations)
    comp_ids = {old_id: new_id for new_id, old_id in enumerate(order)}
    module.entry_computation_id = comp_ids[entry.id]
    instr_maps = _renumber_instructions(order, computations, comp_ids)
    _remap_schedule(module, comp_ids, instr_maps)
    # Producers may list computations in any order that puts callees first, and the
    # order carries no meaning: store them in canonical order (new id == position).
    module.computations.sort(key=_computation_id)
    for field in _DROPPED_MODULE_FIELDS:
        module.ClearField(field)
    module.host_program_shape.ClearField("parameter_names")
    if DEBUG_FRONTEND_ATTRIBUTES:
        _drop_debug_attributes(module.frontend_attributes)


def _computation_id(comp: Any) -> int:
    comp_id: int = comp.id
    return comp_id


def _entry_computation(module: Any, computations: Mapping[int, Any]) -> Any:
    entry = computations.get(module.entry_computation_id)
    if entry is not None:
        return entry
    # Old producers named the entry instead of giving its id.
    for comp in computations.values():
        if module.entry_computation_name and comp.name == module.entry_computation_name:
            return comp
    raise KeyingError(
        f"not an HLO module: entry computation id {module.entry_computation_id} "
        "matches no computation"
    )


def _canonical_order(entry: Any, computations: Mapping[int, Any]) -> list[int]:
    """Post-order from the entry through called computations, callees first.

    Computations no instruction reaches follow in their original order; they are kept
    because they are part of what the producer asked to compile.
    """
    order: list[int] = []
    seen: set[int] = set()
    # Iterative DFS: deep call chains must not hit Python's recursion limit.
    stack: list[tuple[int, Iterable[int]]] = [(entry.id, _callees(entry, computations))]
    seen.add(entry.id)
    while stack:
        comp_id, callees = stack[-1]
        for callee in callees:
            if callee not in seen:
                seen.add(callee)
                stack.append((callee, _callees(computations[callee], computations)))
                break
        else:
            stack.pop()
            order.append(comp_id)
    order.extend(comp_id for comp_id in computations if comp_id not in seen)
    return order


def _callees(comp: Any, computations: Mapping[int, Any]) -> Iterable[int]:
    callees = []
    for instr in comp.instructions:
        for callee in instr.called_computation_ids:
            if callee not in computations:
                raise KeyingError(
                    f"not an HLO module: an instruction calls computation id {callee}, "
                    "which does not exist"
                )
            callees.append(callee)
    return iter(callees)


def _renumber_instructions(
    order: list[int], computations: Mapping[int, Any], comp_ids: Mapping[int, int]
) -> dict[int, dict[int, int]]:
    """Give instructions dense module-wide ids in canonical order; return old->new per computation."""
    instr_maps: dict[int, dict[int, int]] = {}
    next_id = 0
    for old_comp_id in order:
        comp = computations[old_comp_id]
        instructions = comp.instructions
        if not instructions:
            raise KeyingError(f"not an HLO module: computation id {old_comp_id} has no instructions")
        mapping: dict[int, int] = {}
        for instr in instructions:
            mapping[instr.id] = next_id
            next_id += 1
        if len(mapping) != len(instructions):
            raise KeyingError(
                f"not an HLO module: computation id {old_comp_id} repeats an instruction id"
            )
        _rewrite_instructions(instructions, mapping, comp_ids, old_comp_id)
        try:
            comp.root_id = mapping[comp.root_id]
        except KeyError:
            raise KeyingError(
                f"not an HLO module: root id {comp.root_id} of computation id {old_comp_id} "
                "is not one of its instructions"
            ) from None
        comp.id = comp_ids[old_comp_id]
        comp.ClearField("name")
        comp.program_shape.ClearField("parameter_names")
        instr_maps[old_comp_id] = mapping
    return instr_maps


def _rewrite_instructions(
    instructions: Any, mapping: Mapping[int, int], comp_ids: Mapping[int, int], comp_id: int
) -> None:
    # The hot loop of fingerprinting: one pass, locals bound, no per-field checks
    # beyond what remapping needs.
    dropped = _DROPPED_INSTRUCTION_FIELDS
    debug_attrs = bool(DEBUG_FRONTEND_ATTRIBUTES)
    try:
        for instr in instructions:
            instr.id = mapping[instr.id]
            operands = instr.operand_ids
            if operands:
                operands[:] = [mapping[i] for i in operands]
            preds = instr.control_predecessor_ids
            if preds:
                preds[:] = [mapping[i] for i in preds]
            called = instr.called_computation_ids
            if called:
                called[:] = [comp_ids[i] for i in called]
            for field in dropped:
                instr.ClearField(field)
            if debug_attrs:
                _drop_debug_attributes(instr.frontend_attributes)
    except KeyError as exc:
        raise KeyingError(
            f"not an HLO module: computation id {comp_id} refers to id {exc.args[0]}, "
            "which is not one of its instructions"
        ) from None


def _remap_schedule(
    module: Any, comp_ids: Mapping[int, int], instr_maps: Mapping[int, Mapping[int, int]]
) -> None:
    if not module.HasField("schedule"):
        return
    old = {comp_id: list(seq.instruction_ids) for comp_id, seq in module.schedule.sequences.items()}
    module.schedule.ClearField("sequences")
    for old_comp_id, ids in old.items():
        if old_comp_id not in comp_ids:
            raise KeyingError(
                f"not an HLO module: the schedule names computation id {old_comp_id}, "
                "which does not exist"
            )
        mapping = instr_maps[old_comp_id]
        try:
            new_ids = [mapping[i] for i in ids]
        except KeyError as exc:
            raise KeyingError(
                f"not an HLO module: the schedule of computation id {old_comp_id} names "
                f"instruction id {exc.args[0]}, which is not one of its instructions"
            ) from None
        module.schedule.sequences[comp_ids[old_comp_id]].instruction_ids.extend(new_ids)


def _drop_debug_attributes(attrs: Any) -> None:
    for key in DEBUG_FRONTEND_ATTRIBUTES:
        if key in attrs.map:
            del attrs.map[key]
