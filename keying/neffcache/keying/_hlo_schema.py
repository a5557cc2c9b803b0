"""Protobuf views of ``xla.HloModuleProto``, built at import time.

Field numbers and wire types are the public ones of ``xla/service/hlo.proto`` and
``xla/xla_data.proto`` (facts §17). Each view declares only the fields canonicalization
reads or removes; every other field stays an *unknown field*, which protobuf keeps and
writes back byte for byte. So opcodes, shapes, layouts, literals, shardings, replica
groups, backend configs, and any field added to XLA after this was written, all reach
the fingerprint unchanged: nothing semantic can be dropped silently. Name-like fields
are ``bytes`` so parsing never fails on UTF-8; maps are declared as maps so
deterministic serialization sorts them (XLA writes maps in hash order, pytorch/xla
#8537).

Three views of the same bytes:

``outer``   the module and its computations, with instructions as raw ``bytes``.
``joined``  one message that all instructions, concatenated, parse into: repeated
            fields append, so ids and id references come out as flat lists in C.
``stream``  instructions as a stream of groups whose ignored fields the parser drops.

The messages live in private descriptor pools under ``neffcache.keying.xla.*`` so they
never clash with a real ``xla`` schema registered by torch-xla or TensorFlow.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
BYTES, INT64, INT32, BOOL, FLOAT = (
    _F.TYPE_BYTES,
    _F.TYPE_INT64,
    _F.TYPE_INT32,
    _F.TYPE_BOOL,
    _F.TYPE_FLOAT,
)
ONE, MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
# Marks a field as a member of its message's oneof.
PRESENCE = -1

# HloInstructionProto fields the fingerprint ignores: its name, its debug data, its id
# and the id references (which the structure part of the canonical form carries as
# positions instead). Field number -> name and type.
IGNORED_INSTRUCTION_FIELDS = {
    1: ("name", BYTES),
    7: ("metadata", BYTES),
    35: ("id", INT64),
    36: ("operand_ids", BYTES),  # packed, so one length-delimited field
    37: ("control_predecessor_ids", BYTES),
    38: ("called_computation_ids", BYTES),
    82: ("statistics_viz", BYTES),
    88: ("original_value", BYTES),
}
FRONTEND_ATTRIBUTES_FIELD = 68
# A field number XLA will never use (the largest protobuf allows), appended to every
# instruction in the stream view; see ``_stream_view``.
BOUNDARY_FIELD = 2**29 - 1

_Spec = tuple[str, int, int, int, "str | None"]  # name, number, label, type, message type


class _FileBuilder:
    def __init__(self, package: str, syntax: str = "proto3") -> None:
        self.package = package
        self.file = descriptor_pb2.FileDescriptorProto(
            name=f"{package.replace('.', '/')}.proto", package=package, syntax=syntax
        )

    def message(
        self, name: str, fields: list[_Spec], parent: Any = None, *, oneof: str | None = None
    ) -> Any:
        """Add a message; fields labelled PRESENCE join the one oneof named ``oneof``."""
        msg = (parent.nested_type if parent is not None else self.file.message_type).add(name=name)
        if oneof is not None:
            msg.oneof_decl.add(name=oneof)
        for field_name, number, label, ftype, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=ftype)
            field.label = MANY if label == MANY else ONE
            if label == PRESENCE:
                field.oneof_index = 0
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
            "FrontendAttributes", [("map", 1, MANY, _F.TYPE_MESSAGE, "FrontendAttributes.MapEntry")]
        )
        self.map_entry(attrs, "MapEntry", _F.TYPE_STRING, _F.TYPE_STRING, None)

    def schedule(self) -> None:
        schedule = self.message(
            "HloScheduleProto",
            [("sequences", 1, MANY, _F.TYPE_MESSAGE, "HloScheduleProto.SequencesEntry")],
        )
        self.message("InstructionSequence", [("instruction_ids", 1, MANY, INT64, None)], schedule)
        self.map_entry(
            schedule,
            "SequencesEntry",
            INT64,
            _F.TYPE_MESSAGE,
            "HloScheduleProto.InstructionSequence",
        )

    def classes(self, *names: str) -> list[Any]:
        pool = descriptor_pool.DescriptorPool()
        pool.Add(self.file)
        return [
            message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{self.package}.{n}"))
            for n in names
        ]


_MSG = _F.TYPE_MESSAGE


def _outer_view() -> Any:
    b = _FileBuilder("neffcache.keying.xla.outer")
    b.frontend_attributes()
    b.schedule()
    b.message("ProgramShapeProto", [("parameter_names", 3, MANY, BYTES, None)])
    b.message(
        "HloComputationProto",
        [
            ("name", 1, ONE, BYTES, None),
            ("instructions", 2, MANY, BYTES, None),
            ("program_shape", 4, ONE, _MSG, "ProgramShapeProto"),
            ("id", 5, ONE, INT64, None),
            ("root_id", 6, ONE, INT64, None),
        ],
    )
    b.message(
        "HloModuleProto",
        [
            ("name", 1, ONE, BYTES, None),
            ("entry_computation_name", 2, ONE, BYTES, None),
            ("computations", 3, MANY, _MSG, "HloComputationProto"),
            ("host_program_shape", 4, ONE, _MSG, "ProgramShapeProto"),
            ("id", 5, ONE, INT64, None),
            ("entry_computation_id", 6, ONE, INT64, None),
            ("schedule", 7, ONE, _MSG, "HloScheduleProto"),
            ("profile_info", 13, MANY, BYTES, None),
            ("stack_frame_index", 17, ONE, BYTES, None),
            ("frontend_attributes", 19, ONE, _MSG, "FrontendAttributes"),
        ],
    )
    (module,) = b.classes("HloModuleProto")
    return module


def _joined_view() -> Any:
    b = _FileBuilder("neffcache.keying.xla.joined")
    b.message(
        "JoinedInstructions",
        [
            ("id", 35, MANY, INT64, None),
            ("operand_ids", 36, MANY, INT64, None),
            ("control_predecessor_ids", 37, MANY, INT64, None),
            ("called_computation_ids", 38, MANY, INT64, None),
        ],
    )
    (joined,) = b.classes("JoinedInstructions")
    return joined


def _stream_view() -> Any:
    """Instructions as consecutive proto2 groups, each ending in BOUNDARY_FIELD.

    The ignored fields and the boundary are members of one oneof, so parsing each
    member clears the previous one and the boundary, written last, clears them all:
    the parser itself drops every ignored field, with no pass over instructions in
    Python. Groups are delimited by tags rather than length prefixes, so the stream is
    one ``bytes.join`` of the raw instructions.
    """
    b = _FileBuilder("neffcache.keying.xla.stream", syntax="proto2")
    b.frontend_attributes()
    stream = b.message(
        "InstructionStream", [("instr", 1, MANY, _F.TYPE_GROUP, "InstructionStream.Instr")]
    )
    fields: list[_Spec] = [
        (name, number, PRESENCE, ftype, None)
        for number, (name, ftype) in IGNORED_INSTRUCTION_FIELDS.items()
    ]
    fields.append(("boundary", BOUNDARY_FIELD, PRESENCE, INT32, None))
    fields.append(
        ("frontend_attributes", FRONTEND_ATTRIBUTES_FIELD, ONE, _MSG, "FrontendAttributes")
    )
    b.message("Instr", fields, stream, oneof="ignored")
    (cls,) = b.classes("InstructionStream")
    return cls


# The generated classes are dynamic, so they are typed as Any for mypy.
HloModuleProto: Any = _outer_view()
JoinedInstructions: Any = _joined_view()
InstructionStream: Any = _stream_view()
