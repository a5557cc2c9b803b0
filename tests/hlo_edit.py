"""A test-only schema for editing HloModuleProto fixtures.

Written separately from ``neffcache.keying._hlo_schema`` on purpose: the tests craft
their inputs with this one, so a field number wrong in the production schema cannot be
wrong the same way here and go unnoticed. Field numbers: xla/service/hlo.proto.
Undeclared fields survive edits as unknown fields.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_PKG = "tests.hlo_edit"


def _build() -> Any:
    proto = descriptor_pb2.FileDescriptorProto(name="tests/hlo_edit.proto", package=_PKG)
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
            ("instructions", 2, _F.TYPE_MESSAGE, True, "Instruction"),
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
                field.type_name = f".{_PKG}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PKG}.Module"))


Module: Any = _build()


def parse(data: bytes) -> Any:
    module = Module()
    module.ParseFromString(data)
    return module
