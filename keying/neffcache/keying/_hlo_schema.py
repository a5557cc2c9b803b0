"""A partial protobuf schema of ``xla.HloModuleProto``, built at import time.

Only the fields canonicalization reads or rewrites are declared, with the public
field numbers of ``xla/service/hlo.proto`` and ``xla/xla_data.proto`` (facts §17).
Everything else (opcodes, shapes, layouts, literals, dimension numbers, sharding,
replica groups, backend configs, aliasing, ...) is left undeclared on purpose: the
protobuf runtime keeps undeclared fields as unknown fields and writes them back
byte for byte, so a field this schema does not know can never be dropped silently.

Name-like fields are declared as ``bytes`` rather than ``string`` so parsing never
fails on UTF-8 and never pays for validation; fields that are only cleared
(metadata, stack frames, statistics) are declared as ``bytes`` so their contents are
not parsed at all. Maps are declared as maps so deterministic serialization sorts
them: XLA writes maps in hash order (pytorch/xla #8537).

The messages live in a private descriptor pool under the package
``neffcache.keying.xla`` so they can never clash with a real ``xla`` schema that
torch-xla or TensorFlow registers in the default pool.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "neffcache.keying.xla"

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL = _F.LABEL_OPTIONAL
_REPEATED = _F.LABEL_REPEATED

# (name, number, label, type, type_name or None)
_FieldSpec = tuple[str, int, int, int, "str | None"]


def _message(
    name: str, fields: list[_FieldSpec], *, map_entry: bool = False
) -> descriptor_pb2.DescriptorProto:
    msg = descriptor_pb2.DescriptorProto(name=name)
    if map_entry:
        msg.options.map_entry = True
    for field_name, number, label, ftype, type_name in fields:
        field = msg.field.add(name=field_name, number=number, label=label, type=ftype)
        if type_name is not None:
            field.type_name = f".{_PACKAGE}.{type_name}"
    return msg


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="neffcache/keying/hlo_partial.proto", package=_PACKAGE, syntax="proto3"
    )
    # xla_data.proto: FrontendAttributes { map<string, string> map = 1; }
    attrs = _message("FrontendAttributes", [("map", 1, _REPEATED, _F.TYPE_MESSAGE, None)])
    attrs.nested_type.append(
        _message(
            "MapEntry",
            [
                ("key", 1, _OPTIONAL, _F.TYPE_STRING, None),
                ("value", 2, _OPTIONAL, _F.TYPE_STRING, None),
            ],
            map_entry=True,
        )
    )
    attrs.field[0].type_name = f".{_PACKAGE}.FrontendAttributes.MapEntry"
    # xla_data.proto: ProgramShapeProto; parameters (1) and result (2) stay unknown.
    shape = _message("ProgramShapeProto", [("parameter_names", 3, _REPEATED, _F.TYPE_BYTES, None)])
    instruction = _message(
        "HloInstructionProto",
        [
            ("name", 1, _OPTIONAL, _F.TYPE_BYTES, None),
            ("opcode", 2, _OPTIONAL, _F.TYPE_BYTES, None),
            ("metadata", 7, _OPTIONAL, _F.TYPE_BYTES, None),
            ("id", 35, _OPTIONAL, _F.TYPE_INT64, None),
            ("operand_ids", 36, _REPEATED, _F.TYPE_INT64, None),
            ("control_predecessor_ids", 37, _REPEATED, _F.TYPE_INT64, None),
            ("called_computation_ids", 38, _REPEATED, _F.TYPE_INT64, None),
            ("frontend_attributes", 68, _OPTIONAL, _F.TYPE_MESSAGE, "FrontendAttributes"),
            ("statistics_viz", 82, _OPTIONAL, _F.TYPE_BYTES, None),
            ("original_value", 88, _OPTIONAL, _F.TYPE_BYTES, None),
        ],
    )
    computation = _message(
        "HloComputationProto",
        [
            ("name", 1, _OPTIONAL, _F.TYPE_BYTES, None),
            ("instructions", 2, _REPEATED, _F.TYPE_MESSAGE, "HloInstructionProto"),
            ("program_shape", 4, _OPTIONAL, _F.TYPE_MESSAGE, "ProgramShapeProto"),
            ("id", 5, _OPTIONAL, _F.TYPE_INT64, None),
            ("root_id", 6, _OPTIONAL, _F.TYPE_INT64, None),
        ],
    )
    schedule = _message("HloScheduleProto", [("sequences", 1, _REPEATED, _F.TYPE_MESSAGE, None)])
    schedule.nested_type.append(
        _message("InstructionSequence", [("instruction_ids", 1, _REPEATED, _F.TYPE_INT64, None)])
    )
    schedule.nested_type.append(
        _message(
            "SequencesEntry",
            [
                ("key", 1, _OPTIONAL, _F.TYPE_INT64, None),
                ("value", 2, _OPTIONAL, _F.TYPE_MESSAGE, "HloScheduleProto.InstructionSequence"),
            ],
            map_entry=True,
        )
    )
    schedule.field[0].type_name = f".{_PACKAGE}.HloScheduleProto.SequencesEntry"
    module = _message(
        "HloModuleProto",
        [
            ("name", 1, _OPTIONAL, _F.TYPE_BYTES, None),
            ("entry_computation_name", 2, _OPTIONAL, _F.TYPE_BYTES, None),
            ("computations", 3, _REPEATED, _F.TYPE_MESSAGE, "HloComputationProto"),
            ("host_program_shape", 4, _OPTIONAL, _F.TYPE_MESSAGE, "ProgramShapeProto"),
            ("id", 5, _OPTIONAL, _F.TYPE_INT64, None),
            ("entry_computation_id", 6, _OPTIONAL, _F.TYPE_INT64, None),
            ("schedule", 7, _OPTIONAL, _F.TYPE_MESSAGE, "HloScheduleProto"),
            ("profile_info", 13, _REPEATED, _F.TYPE_BYTES, None),
            ("stack_frame_index", 17, _OPTIONAL, _F.TYPE_BYTES, None),
            ("frontend_attributes", 19, _OPTIONAL, _F.TYPE_MESSAGE, "FrontendAttributes"),
        ],
    )
    file.message_type.extend([attrs, shape, instruction, computation, schedule, module])
    return file


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_build_file())

# The generated classes are dynamic, so they are typed as Any for mypy.
HloModuleProto: Any = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName(f"{_PACKAGE}.HloModuleProto")
)
