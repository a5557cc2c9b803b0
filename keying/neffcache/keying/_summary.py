"""A graph's summary for explanations: its structure digest and its per-instruction shapes.

Two graphs that differ only in their shapes (a batch of 8 against one of 4, say) have
different fingerprints and so never share a key; to tell a user "the closest graph
differs in 2 of 118 instructions' shapes" the server needs something they do share.
That is the structure: the canonical graph (the same canonical order of computations
and instructions, and the same positions for ids, as the fingerprint's: ``_canonical``)
with every shape, layout, literal and attribute left out. What stays is what makes the
graph the same computation at another size:

* each instruction's opcode, and a custom call's target (which names the operation);
* the wiring: operands, control predecessors and called computations as canonical
  positions, each computation's size and root, the entry; parameter numbers and tuple
  indices (which input, which element);

Names, ids, metadata and the order computations were written in are ignored, as in the
fingerprint. ``shapes`` lists, in the same canonical order, ``"<opcode> <shape>"`` for
each instruction, shapes as XLA prints them (``f32[8,128]``, ``(f32[2], s32[])``),
without layouts. The structure never enters a cache key: it only finds candidates to
compare, so a collision costs a less apt explanation, never a wrong NEFF.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import blake3
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from ._canonical import ordered_module
from ._errors import KeyingError
from ._hlo_schema import BytesList
from ._inputs import Frozen

# Bump when the structure's canonical form changes: stored structure digests (the
# server's program map) then stop matching, which only costs explanations.
STRUCTURE_VERSION = "1"
_STRUCTURE_CONTEXT = f"neffcache graph structure v{STRUCTURE_VERSION}"
_MAGIC = f"neffcache-graph-structure/{STRUCTURE_VERSION}\n".encode()
# Events carry the shapes of graphs up to this many instructions (docs/explain.md).
SHAPES_MAX = 2048
# A tuple of many elements prints this many, then how many more.
_TUPLE_SHOWN = 8

T = TypeVar("T")


class GraphSummary(Frozen):
    """What an explanation compares between graphs that share no key.

    >>> summary = graph_summary(open("model.hlo_module.pb", "rb").read())  # doctest: +SKIP
    >>> summary.instructions, summary.shapes[:2]                         # doctest: +SKIP
    (118, ('parameter f32[8,16]', 'parameter f32[16,128]'))
    """

    __match_args__ = ("structure", "instructions", "shapes")
    __slots__ = _compared = __match_args__

    if TYPE_CHECKING:  # read-only fields, as a frozen dataclass's

        @property
        def structure(self) -> str: ...
        @property
        def instructions(self) -> int: ...
        @property
        def shapes(self) -> tuple[str, ...]: ...

    def __init__(self, structure: str, instructions: int, shapes: tuple[str, ...]) -> None:
        object.__setattr__(self, "structure", structure)
        object.__setattr__(self, "instructions", instructions)
        object.__setattr__(self, "shapes", shapes)

    def as_json(self, shapes_max: int | None = SHAPES_MAX) -> dict[str, Any]:
        """``{"structure", "instructions", "shapes"}``; ``shapes`` left out for graphs
        of more than ``shapes_max`` instructions (None: always kept)."""
        out: dict[str, Any] = {"structure": self.structure, "instructions": self.instructions}
        if shapes_max is None or self.instructions <= shapes_max:
            out["shapes"] = list(self.shapes)
        return out


def graph_summary(module_bytes: bytes) -> GraphSummary:
    """The structure digest, instruction count and per-instruction shapes of a module.

    Raises KeyingError for what is not a well-formed module, as ``fingerprint_hlo``
    does. The two read different fields (this one no frontend attributes; parameter
    numbers, tuple indices and shapes by their types), so either may refuse a module
    whose malformed field only the other reads.
    """
    graph = ordered_module(module_bytes)
    wiring = graph.wiring()
    rows = [_Rows.of(comp.instructions) for comp in graph.ordered]
    ops = [op for row in rows for op in row.ops]
    shapes = [shape for row in rows for shape in row.shapes]
    targets = [target for row in rows for target in row.targets]
    named = BytesList()
    # A custom call's target names its operation, as an opcode names any other's.
    named.items.extend(
        op + b"\x00" + target if target else op for op, target in zip(ops, targets, strict=True)
    )
    numbers = array("q", [n for row in rows for n in row.params])
    numbers.extend(n for row in rows for n in row.tuple_indices)
    parts = (wiring, named.SerializeToString(), numbers.tobytes())
    canonical = _MAGIC + b"".join(len(part).to_bytes(8, "big") + part for part in parts)
    digest: str = blake3.blake3(canonical, derive_key_context=_STRUCTURE_CONTEXT).hexdigest()
    return GraphSummary(digest, len(ops), _shape_strings(ops, shapes))


def _shape_strings(ops: Sequence[bytes], shapes: Sequence[bytes]) -> tuple[str, ...]:
    # Graphs repeat a few shapes many times: each distinct one is parsed once.
    shown: dict[bytes, str] = {}
    names: dict[bytes, str] = {}
    out = []
    for op, shape in zip(ops, shapes, strict=True):
        text = shown.get(shape)
        if text is None:
            text = shown[shape] = _shape_text(shape)
        name = names.get(op)
        if name is None:
            name = names[op] = op.decode("utf-8", "replace")
        out.append(f"{name} {text}")
    return tuple(out)


def _shape_text(data: bytes) -> str:
    try:
        return _format(_ShapeProto.FromString(data))
    except (DecodeError, RecursionError):
        return "?"  # kept by the fingerprint as bytes; not a shape this view can read


def _format(shape: Any) -> str:
    kind = shape.element_type
    if kind == _TUPLE:
        inner = [_format(s) for s in shape.tuple_shapes[:_TUPLE_SHOWN]]
        extra = len(shape.tuple_shapes) - _TUPLE_SHOWN
        if extra > 0:
            inner.append(f"... {extra} more")
        return f"({', '.join(inner)})"
    dynamic = list(shape.is_dynamic_dimension)
    dims = [
        f"<={size}" if i < len(dynamic) and dynamic[i] else str(size)
        for i, size in enumerate(shape.dimensions)
    ]
    return f"{_TYPE_NAMES.get(kind, f'type{kind}')}[{','.join(dims)}]"


class _Rows:
    """One computation's instructions, in order: opcode, shape bytes, parameter number,
    tuple index and custom-call target of each."""

    __slots__ = ("ops", "params", "shapes", "targets", "tuple_indices")

    def __init__(
        self,
        ops: list[bytes],
        shapes: list[bytes],
        params: list[int],
        tuple_indices: list[int],
        targets: list[bytes],
    ) -> None:
        self.ops = ops
        self.shapes = shapes
        self.params = params
        self.tuple_indices = tuple_indices
        self.targets = targets

    @classmethod
    def of(cls, instructions: Sequence[bytes]) -> _Rows:
        """All instructions joined and parsed as one message (as ``_joined`` does for
        the fingerprint): the five fields come out as flat lists, each instruction's
        values closed by a sentinel. A real value equal to one (only an int64 can be:
        the bytes sentinels are random) shows up as a miscount; those computations
        are read one instruction at a time instead."""
        count = len(instructions)
        try:
            message = _Summary.FromString(_SEPARATOR.join(instructions) + _SEPARATOR)
        except DecodeError as exc:
            raise KeyingError(f"not an HLO module: an instruction is malformed ({exc})") from exc
        try:
            return cls(
                _last(list(message.opcode), _END_BYTES, count, b""),
                _merged(list(message.shape), count),
                _last(list(message.parameter_number), _END_INT, count, 0),
                _last(list(message.tuple_index), _END_INT, count, 0),
                _last(list(message.custom_call_target), _END_BYTES, count, b""),
            )
        except _Miscount:
            return cls._one_by_one(instructions)

    @classmethod
    def _one_by_one(cls, instructions: Sequence[bytes]) -> _Rows:
        rows = cls([], [], [], [], [])
        for raw in instructions:
            message = _Summary.FromString(raw)
            rows.ops.append(message.opcode[-1] if message.opcode else b"")
            rows.shapes.append(b"".join(message.shape))
            rows.params.append(message.parameter_number[-1] if message.parameter_number else 0)
            rows.tuple_indices.append(message.tuple_index[-1] if message.tuple_index else 0)
            target = message.custom_call_target
            rows.targets.append(target[-1] if target else b"")
        return rows


class _Miscount(Exception):
    pass


def _last(values: list[T], end: T, count: int, default: T) -> list[T]:
    """Per instruction, the last value it wrote (protobuf's rule for a singular
    field), or ``default`` when it has none."""
    return _per_instruction(values, end, count, default, lambda _before, value: value)


def _merged(values: list[bytes], count: int) -> list[bytes]:
    """Per instruction, every value of a message field it wrote, concatenated: bytes
    that parse as their merge, protobuf's rule for a singular message field."""
    return _per_instruction(values, _END_BYTES, count, b"", lambda before, value: before + value)


def _per_instruction(
    values: list[T], end: T, count: int, default: T, combine: Callable[[T, T], T]
) -> list[T]:
    if values.count(end) != count:
        raise _Miscount
    if len(values) == count:  # no instruction has the field
        return [default] * count
    if len(values) == 2 * count and values[1::2].count(end) == count:
        return values[0::2]  # every instruction has it once: the common case
    out: list[T] = []
    current = default
    for value in values:
        if value == end:
            out.append(current)
            current = default
        else:
            current = combine(current, value)
    return out


def _summary_view() -> tuple[Any, Any]:
    """The fields read, as repeated fields of one message (proto2: packed and unpacked
    scalars alike, bytes never checked for UTF-8), and ShapeProto (xla_data.proto)."""
    f = descriptor_pb2.FieldDescriptorProto
    package = "neffcache.keying.xla.summary"
    proto = descriptor_pb2.FileDescriptorProto(
        name="neffcache/keying/xla/summary.proto", package=package, syntax="proto2"
    )
    summary = proto.message_type.add(name="Summary")
    for name, number, kind in (
        ("opcode", 2, f.TYPE_BYTES),
        ("shape", 3, f.TYPE_BYTES),
        ("parameter_number", 9, f.TYPE_INT64),
        ("tuple_index", 13, f.TYPE_INT64),
        ("custom_call_target", 28, f.TYPE_BYTES),
    ):
        summary.field.add(name=name, number=number, type=kind, label=f.LABEL_REPEATED)
    shape = proto.message_type.add(name="ShapeProto")
    for name, number, kind, label in (
        ("element_type", 2, f.TYPE_INT32, f.LABEL_OPTIONAL),
        ("dimensions", 3, f.TYPE_INT64, f.LABEL_REPEATED),
        ("tuple_shapes", 4, f.TYPE_MESSAGE, f.LABEL_REPEATED),
        ("is_dynamic_dimension", 6, f.TYPE_BOOL, f.LABEL_REPEATED),
    ):
        field = shape.field.add(name=name, number=number, type=kind, label=label)
        if kind == f.TYPE_MESSAGE:
            field.type_name = f".{package}.ShapeProto"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(  # type: ignore[return-value]
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in ("Summary", "ShapeProto")
    )


_Summary, _ShapeProto = _summary_view()

# Closes each instruction in the joined stream: a sentinel in each of the five fields.
# The bytes one is random, so no instruction can carry a copy; the int64 one is the
# smallest int64, which no parameter number or tuple index is (else: _Miscount).
_END_BYTES = b"\x00end " + os.urandom(16)
_END_INT = -(2**63)
_SEPARATOR = _Summary(
    opcode=[_END_BYTES],
    shape=[_END_BYTES],
    parameter_number=[_END_INT],
    tuple_index=[_END_INT],
    custom_call_target=[_END_BYTES],
).SerializeToString()

# xla_data.proto PrimitiveType, as XLA's HLO text spells each.
_TUPLE = 13
_TYPE_NAMES = {
    1: "pred",
    2: "s8",
    3: "s16",
    4: "s32",
    5: "s64",
    6: "u8",
    7: "u16",
    8: "u32",
    9: "u64",
    10: "f16",
    11: "f32",
    12: "f64",
    14: "opaque",
    15: "c64",
    16: "bf16",
    17: "token",
    18: "c128",
    19: "f8e5m2",
    20: "f8e4m3fn",
    21: "s4",
    22: "u4",
    23: "f8e4m3b11fnuz",
    24: "f8e5m2fnuz",
    25: "f8e4m3fnuz",
    26: "s2",
    27: "u2",
    28: "f8e4m3",
    29: "f8e3m4",
    30: "s1",
    31: "u1",
    32: "f4e2m1fn",
    33: "f8e8m0fnu",
    34: "buffer",
}
