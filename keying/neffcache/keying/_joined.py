"""All instructions of a module, parsed as one message.

Concatenated protobuf messages parse as one message whose repeated fields append. So
every instruction, each followed by a separator, joined into one byte string and
parsed with the ``joined`` view (``_hlo_schema``) gives, in C and without a Python
step per instruction:

* the id fields (id, operands, control predecessors, called computations) and the
  frontend attributes as flat lists, in which the separators' sentinels mark where
  each instruction and each computation ends;
* every kept field of every instruction, in order, as the message's unknown fields,
  each instruction closed by the separator's marker field.

The parser keeps every separator in order, so the boundaries are exactly where they
were put; a real value equal to a sentinel shows up as one sentinel too many and is
rejected. The marks' payloads are random nonces drawn when the process starts, so no
instruction can carry a copy of one: the stream splits exactly at instruction and
computation ends, and a malformed instruction that swallows a separator leaves one
mark too few, which is rejected too. The marks are replaced by fixed fields before
anything is hashed.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from ._errors import KeyingError
from ._hlo_schema import (
    FRONTEND_ATTRIBUTES_FIELD,
    ID_FIELDS,
    IGNORED_INSTRUCTION_FIELDS,
    JoinedInstructions,
)
from ._inputs import Frozen

# Sentinels in the joined lists. Ids are never negative, so they cannot be confused
# with these; attribute sentinels are not valid FrontendAttributes messages.
INSTRUCTION_END = -1
COMPUTATION_END = -2
ATTRS_INSTRUCTION_END = b"\xff"
ATTRS_COMPUTATION_END = b"\xfe"
_MARK_FIELD = 2**29 - 1  # the largest field number protobuf allows; XLA never uses it


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= 2**64 - 1  # negative int64 values take ten bytes, as protobuf writes them
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _sentinels(id_value: int, attrs: bytes) -> bytes:
    ids = b"".join(_varint(number << 3) + _varint(id_value) for number in ID_FIELDS)
    return ids + _length_delimited(FRONTEND_ATTRIBUTES_FIELD, attrs)


# Close each instruction and computation in the unknown-field stream, and are replaced
# before anything is hashed: random, so no instruction can carry a copy.
_MARK = _length_delimited(_MARK_FIELD, os.urandom(16))
_COMPUTATION_MARK = _length_delimited(_MARK_FIELD, os.urandom(16))
_INSTRUCTION_SEPARATOR = _sentinels(INSTRUCTION_END, ATTRS_INSTRUCTION_END) + _MARK
# Stands in the item list after each computation's instructions; like every item it is
# followed by an instruction separator, so in every flat list a computation ends with
# the two sentinels COMPUTATION_END, INSTRUCTION_END.
_COMPUTATION_ITEM = _sentinels(COMPUTATION_END, ATTRS_COMPUTATION_END) + _COMPUTATION_MARK
_COMPUTATION_CLOSE = _COMPUTATION_MARK + _MARK
# What the marks become in the canonical form: empty fields 1 (name) and 7 (metadata).
# The joined view declares both, so neither can occur among the kept fields, which are
# complete fields: the canonical stream tokenizes back into exactly its instructions
# and computations.
_INSTRUCTION_END_FIELD = _length_delimited(1, b"")
_COMPUTATION_END_FIELD = _length_delimited(7, b"")
_TAIL = array("q", [COMPUTATION_END, INSTRUCTION_END]).tobytes()
_END = array("q", [INSTRUCTION_END]).tobytes()
_JOINED_FIELDS = (
    *IGNORED_INSTRUCTION_FIELDS.values(),
    *ID_FIELDS.values(),
    "frontend_attributes",
)


class Joined(Frozen):
    """All instructions of a module, parsed as one message (see the module doc).

    ``ids``, ``operands``, ``preds``, ``called`` and ``attrs`` hold, per instruction,
    its values followed by an end sentinel, and per computation two more sentinels;
    ``content`` holds every kept field, in order, each instruction and computation
    closed by its mark.
    """

    __match_args__ = ("ids", "operands", "preds", "called", "attrs", "content")
    __slots__ = _compared = __match_args__

    if TYPE_CHECKING:  # read-only fields, as a frozen dataclass's

        @property
        def ids(self) -> list[int]: ...
        @property
        def operands(self) -> list[int]: ...
        @property
        def preds(self) -> list[int]: ...
        @property
        def called(self) -> list[int]: ...
        @property
        def attrs(self) -> list[bytes]: ...
        @property
        def content(self) -> bytes: ...  # the unknown-field stream: kept fields and marks

    def __init__(
        self,
        ids: list[int],
        operands: list[int],
        preds: list[int],
        called: list[int],
        attrs: list[bytes],
        content: bytes,
    ) -> None:
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "operands", operands)
        object.__setattr__(self, "preds", preds)
        object.__setattr__(self, "called", called)
        object.__setattr__(self, "attrs", attrs)
        object.__setattr__(self, "content", content)

    @classmethod
    def parse(cls, comps: Sequence[Any]) -> Joined:
        items: list[bytes] = []
        for comp in comps:
            items.extend(comp.instructions)
            items.append(_COMPUTATION_ITEM)
        try:
            message = JoinedInstructions.FromString(
                _INSTRUCTION_SEPARATOR.join(items) + _INSTRUCTION_SEPARATOR
            )
        except DecodeError as exc:
            raise KeyingError(f"not an HLO module: an instruction is malformed ({exc})") from exc
        joined = cls(
            list(message.id),
            list(message.operand_ids),
            list(message.control_predecessor_ids),
            list(message.called_computation_ids),
            list(message.frontend_attributes),
            b"",
        )
        checks: list[tuple[list[Any], object, object]] = [
            (joined.ids, INSTRUCTION_END, COMPUTATION_END),
            (joined.operands, INSTRUCTION_END, COMPUTATION_END),
            (joined.preds, INSTRUCTION_END, COMPUTATION_END),
            (joined.called, INSTRUCTION_END, COMPUTATION_END),
            (joined.attrs, ATTRS_INSTRUCTION_END, ATTRS_COMPUTATION_END),
        ]
        for values, end, comp_end in checks:
            if values.count(end) != len(items) or values.count(comp_end) != len(comps):
                raise KeyingError("not an HLO module: an instruction has malformed id fields")
        for field in _JOINED_FIELDS:
            message.ClearField(field)
        # Only unknown fields are left: every kept field of every instruction, in order.
        content = message.SerializeToString()
        if content.count(_MARK) != len(items) or content.count(_COMPUTATION_MARK) != len(comps):
            raise KeyingError("not an HLO module: an instruction is malformed")
        return cls(joined.ids, joined.operands, joined.preds, joined.called, joined.attrs, content)

    def callees(self, count: int) -> list[list[int]]:
        """Per computation, in file order, the computations its instructions call."""
        # Nearly every instruction calls nothing: split the list's bytes at computation
        # ends and decode only the parts that hold more than instruction ends.
        pieces = array("q", self.called).tobytes().split(_TAIL)
        if len(pieces) != count + 1:  # an id whose bytes mimic the tail
            parts = segments(self.called, count, COMPUTATION_END)
            return [[c for c in part if c != INSTRUCTION_END] for part in parts]
        out: list[list[int]] = []
        for piece in pieces[:-1]:
            if piece.count(_END) * len(_END) == len(piece):
                out.append([])
            else:
                out.append([c for c in array("q", piece) if c != INSTRUCTION_END])
        return out

    def canonical_content(self, moved: list[int] | None) -> bytes:
        """The kept fields, computations in canonical order, marks made canonical."""
        chunks = self.content.split(_COMPUTATION_CLOSE)
        chunks.pop()  # what follows the last computation: nothing
        if moved is not None:
            chunks = [chunks[i] for i in moved]
        content = _COMPUTATION_END_FIELD.join(chunks) + _COMPUTATION_END_FIELD
        return content.replace(_MARK, _INSTRUCTION_END_FIELD)


def segments(values: list[Any], count: int, comp_end: object) -> list[list[Any]]:
    """Split a checked flat list into its computations' parts, the two sentinels removed."""
    out: list[list[Any]] = []
    start = 0
    for _ in range(count):
        end = values.index(comp_end, start)
        out.append(values[start:end])
        start = end + 2
    return out


def reorder(data: bytes, moved: list[int]) -> bytes:
    """Put the computations of a flat int64 list in canonical order.

    Every value is a position (>= 0) or a sentinel (-1, -2), so the 16 bytes of
    [-2, -1] occur only where a computation ends: no value's bytes can start with the
    0xfe of -2 unless it is -2.
    """
    pieces = data.split(_TAIL)
    if len(pieces) != len(moved) + 1:
        raise KeyingError("not an HLO module: an instruction has malformed id fields")
    return _TAIL.join(pieces[i] for i in moved) + _TAIL
