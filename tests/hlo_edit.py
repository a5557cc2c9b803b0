"""A test-only schema for editing HloModuleProto fixtures.

Written separately from ``neffcache.keying._hlo_schema`` on purpose: the tests craft
their inputs with this one, so a field number wrong in the production schema cannot be
wrong the same way here and go unnoticed. Field numbers: xla/service/hlo.proto.
Undeclared fields survive edits as unknown fields. Declared ones are written first on
re-serialization, so only fields that lead an instruction anyway (name, opcode) and
the id fields, which canonicalization replaces, are declared: an edit then keeps the
order of every kept field, as XLA writes it.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_PKG = "tests.hlo_edit"


def _build(raw_instructions: bool = False) -> Any:
    package = f"{_PKG}.raw" if raw_instructions else _PKG
    proto = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package)
    proto.syntax = "proto3"
    layouts = {
        "Instruction": [
            ("name", 1, _F.TYPE_BYTES, False, None),
            ("opcode", 2, _F.TYPE_BYTES, False, None),
            ("id", 35, _F.TYPE_INT64, False, None),
            ("operand_ids", 36, _F.TYPE_INT64, True, None),
            ("control_predecessor_ids", 37, _F.TYPE_INT64, True, None),
            ("called_computation_ids", 38, _F.TYPE_INT64, True, None),
        ],
        "Computation": [
            ("name", 1, _F.TYPE_BYTES, False, None),
            (
                "instructions",
                2,
                *(
                    (_F.TYPE_BYTES, True, None)
                    if raw_instructions
                    else (_F.TYPE_MESSAGE, True, "Instruction")
                ),
            ),
            ("id", 5, _F.TYPE_INT64, False, None),
            ("root_id", 6, _F.TYPE_INT64, False, None),
        ],
        "Module": [
            ("name", 1, _F.TYPE_BYTES, False, None),
            ("entry_computation_name", 2, _F.TYPE_BYTES, False, None),
            ("computations", 3, _F.TYPE_MESSAGE, True, "Computation"),
            ("entry_computation_id", 6, _F.TYPE_INT64, False, None),
        ],
    }
    for message, fields in layouts.items():
        msg = proto.message_type.add(name=message)
        for name, number, ftype, repeated, type_name in fields:
            field = msg.field.add(name=name, number=number, type=ftype)
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if type_name:
                field.type_name = f".{package}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Module"))


Module: Any = _build()
# The same, with each instruction as raw bytes: for inputs no schema could write.
RawModule: Any = _build(raw_instructions=True)


def parse(data: bytes) -> Any:
    module = Module()
    module.ParseFromString(data)
    return module


def varint(value: int) -> bytes:
    """``value`` in protobuf's varint encoding (a negative one as its 64-bit two's
    complement, as protobuf writes an int64), for tests that write raw wire bytes."""
    value &= 2**64 - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): a message, string or bytes."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload
