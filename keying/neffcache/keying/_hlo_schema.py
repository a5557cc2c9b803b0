"""Protobuf views of ``xla.HloModuleProto``, built at import time.

Field numbers and wire types are the public ones of ``xla/service/hlo.proto`` and
``xla/xla_data.proto`` (docs/neuron-sdk.md#names-and-ids-in-hlomoduleproto). Each view
declares only the fields canonicalization reads or removes; every other field stays an
*unknown field*, which protobuf keeps, in order, and writes back byte for byte. So
opcodes, shapes, layouts, literals, shardings, replica groups, backend configs, and any
field added to XLA after this was written, all reach the fingerprint unchanged: nothing
semantic is dropped silently.
Name-like fields are ``bytes`` so parsing never fails on UTF-8; maps are declared as
maps so deterministic serialization sorts them (XLA writes maps in hash order,
pytorch/xla #8537).

Three views of the same bytes:

``outer``   the module and its computations, with instructions left as raw ``bytes``.
``joined``  one message that *all* instructions, concatenated, parse into (see
            ``_joined``): repeated fields append, so the ignored fields and the id
            fields come out as flat lists in C, while every kept field lands, in order,
            in the message's unknown fields.
``framed``  every instruction as an opaque message, to check each one's framing.

The messages live in private descriptor pools under ``neffcache.keying.xla.*`` so they
never clash with a real ``xla`` schema registered by torch-xla or TensorFlow.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
BYTES, INT64, MESSAGE = _F.TYPE_BYTES, _F.TYPE_INT64, _F.TYPE_MESSAGE
ONE, MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# HloInstructionProto fields the fingerprint ignores: its name and debug data.
IGNORED_INSTRUCTION_FIELDS = {
    1: "name",
    7: "metadata",
    82: "statistics_viz",
    88: "original_value",  # source variable names, for value tracking
}
# The id fields, which the canonical form carries as positions instead.
ID_FIELDS = {
    35: "id",
    36: "operand_ids",
    37: "control_predecessor_ids",
    38: "called_computation_ids",
}
FRONTEND_ATTRIBUTES_FIELD = 68

_Spec = tuple[str, int, int, int, "str | None"]  # name, number, label, type, message type


class _FileBuilder:
    def __init__(self, package: str, syntax: str) -> None:
        self.package = package
        self.file = descriptor_pb2.FileDescriptorProto(
            name=f"{package.replace('.', '/')}.proto", package=package, syntax=syntax
        )

    def message(self, name: str, fields: list[_Spec], parent: Any = None) -> Any:
        msg = (parent.nested_type if parent is not None else self.file.message_type).add(name=name)
        for field_name, number, label, ftype, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=ftype, label=label)
            if type_name is not None:
                field.type_name = f".{self.package}.{type_name}"
        return msg

    def map_entry(
        self, parent: Any, name: str, key: int, value: int, value_type: str | None
    ) -> None:
        entry = self.message(
            name, [("key", 1, ONE, key, None), ("value", 2, ONE, value, value_type)], parent
        )
        entry.options.map_entry = True

    def frontend_attributes(self) -> None:
        # xla_data.proto: FrontendAttributes { map<string, string> map = 1; }
        attrs = self.message(
            "FrontendAttributes", [("map", 1, MANY, MESSAGE, "FrontendAttributes.MapEntry")]
        )
        self.map_entry(attrs, "MapEntry", _F.TYPE_STRING, _F.TYPE_STRING, None)

    def classes(self, *names: str) -> list[Any]:
        pool = descriptor_pool.DescriptorPool()
        pool.Add(self.file)
        return [
            message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{self.package}.{n}"))
            for n in names
        ]


def _outer_view() -> tuple[Any, Any]:
    b = _FileBuilder("neffcache.keying.xla.outer", "proto3")
    b.frontend_attributes()
    schedule = b.message(
        "HloScheduleProto",
        [("sequences", 1, MANY, MESSAGE, "HloScheduleProto.SequencesEntry")],
    )
    b.message("InstructionSequence", [("instruction_ids", 1, MANY, INT64, None)], schedule)
    b.map_entry(schedule, "SequencesEntry", INT64, MESSAGE, "HloScheduleProto.InstructionSequence")
    # ProgramShapeProto: parameters (1) and result (2) stay unknown, so kept.
    b.message("ProgramShapeProto", [("parameter_names", 3, MANY, BYTES, None)])
    b.message(
        "HloComputationProto",
        [
            ("name", 1, ONE, BYTES, None),
            ("instructions", 2, MANY, BYTES, None),
            ("program_shape", 4, ONE, MESSAGE, "ProgramShapeProto"),
            ("id", 5, ONE, INT64, None),
            ("root_id", 6, ONE, INT64, None),
        ],
    )
    b.message(
        "HloModuleProto",
        [
            ("name", 1, ONE, BYTES, None),
            ("entry_computation_name", 2, ONE, BYTES, None),
            ("computations", 3, MANY, MESSAGE, "HloComputationProto"),
            ("host_program_shape", 4, ONE, MESSAGE, "ProgramShapeProto"),
            ("id", 5, ONE, INT64, None),
            ("entry_computation_id", 6, ONE, INT64, None),
            ("schedule", 7, ONE, MESSAGE, "HloScheduleProto"),
            ("profile_info", 13, MANY, BYTES, None),
            ("stack_frame_index", 17, ONE, BYTES, None),
            ("frontend_attributes", 19, ONE, MESSAGE, "FrontendAttributes"),
        ],
    )
    module, attrs = b.classes("HloModuleProto", "FrontendAttributes")
    return module, attrs


def _joined_view() -> tuple[Any, Any]:
    # proto2: repeated scalars accept packed and unpacked input alike, and bytes are
    # never checked for UTF-8.
    b = _FileBuilder("neffcache.keying.xla.joined", "proto2")
    fields: list[_Spec] = [(n, k, MANY, BYTES, None) for k, n in IGNORED_INSTRUCTION_FIELDS.items()]
    fields += [(n, k, MANY, INT64, None) for k, n in ID_FIELDS.items()]
    fields.append(("frontend_attributes", FRONTEND_ATTRIBUTES_FIELD, MANY, BYTES, None))
    b.message("JoinedInstructions", fields)
    b.message("BytesList", [("items", 1, MANY, BYTES, None)])
    joined, blobs = b.classes("JoinedInstructions", "BytesList")
    return joined, blobs


def _framed_view() -> Any:
    """Every instruction as a message with no declared field: parsing checks that each
    instruction's fields end exactly where its length prefix says, so an instruction
    cannot reach into the bytes that follow it once instructions are joined."""
    b = _FileBuilder("neffcache.keying.xla.framed", "proto2")
    b.message("Instruction", [])
    b.message("Computation", [("instructions", 2, MANY, MESSAGE, "Instruction")])
    b.message("Module", [("computations", 3, MANY, MESSAGE, "Computation")])
    (module,) = b.classes("Module")
    return module


# The generated classes are dynamic, so they are typed as Any for mypy.
HloModuleProto, FrontendAttributes = _outer_view()
JoinedInstructions, BytesList = _joined_view()
FramedModule: Any = _framed_view()
