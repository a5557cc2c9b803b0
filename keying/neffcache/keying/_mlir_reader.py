"""The container of MLIR bytecode, read in pure Python for keying only.

The format is upstream MLIR's (mlir/docs/BytecodeFormat.md, with the details the
document leaves out taken from mlir/lib/Bytecode/Reader/BytecodeReader.cpp):

    magic "ML\\xefR", version varint, producer (NUL-terminated), then sections, each
    an id byte (high bit: aligned), a length varint, [alignment varint, 0xCB padding],
    and its bytes. Sections: 0 strings, 1 dialects and operation names, 2 attributes
    and types, 3 their offsets, 4 the IR, 5 resources, 6 their offsets, 7 dialect
    versions (nested in 1), 8 operation properties (version 5 on).

A varint is a "PrefixVarInt": the trailing zero bits of the first byte say how many
bytes follow (none when the low bit is set; eight when the first byte is zero).

``parse_bytecode`` reads everything but the IR section (``_mlir_walk`` reads that).
Every count and length is checked against the bytes that remain before it is used,
so hostile input costs time and memory linear in its size; nothing recurses. A
version newer than ``MAX_VERSION``, a section id past 8, a duplicate or missing
section, or anything malformed is a KeyingError.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import KeyingError

MAGIC = b"ML\xefR"

# Versions this reader knows (mlir/include/mlir/Bytecode/Encoding.h): 1 dialect
# versions, 2 isolated regions as sections, 3 use-list orders, 4 block arguments
# without a location, 5 properties, 6 operand segment sizes as native properties
# (which only changes what is inside a properties blob).
MAX_VERSION = 6
V_DIALECT_VERSIONS, V_LAZY_LOADING, V_USE_LISTS, V_ELIDED_ARG_LOCS, V_PROPERTIES = 1, 2, 3, 4, 5

STRINGS, DIALECTS, ATTR_TYPES, ATTR_TYPE_OFFSETS, IR, RESOURCES, RESOURCE_OFFSETS = range(7)
DIALECT_VERSIONS, PROPERTIES = 7, 8
_SECTION_NAMES = (
    "strings",
    "dialects",
    "attributes and types",
    "attribute and type offsets",
    "IR",
    "resources",
    "resource offsets",
    "dialect versions",
    "properties",
)
_ALIGNMENT_BYTE = 0xCB

# Resource entry kinds (mlir/IR/AsmState.h AsmResourceEntryKind).
BLOB, BOOL, STRING = 0, 1, 2


def malformed(detail: str) -> KeyingError:
    return KeyingError(f"malformed MLIR bytecode: {detail}")


def long_varint(data: bytes, i: int) -> tuple[int, int]:
    """A varint of two or more bytes at ``i`` (the caller handled the one-byte case).

    Bounds are the caller's: ``data`` must end where the value must end. A short
    read raises IndexError, which the public entry points turn into KeyingError.
    """
    first = data[i]
    if first == 0:
        if i + 9 > len(data):
            raise IndexError("truncated varint")
        return int.from_bytes(data[i + 1 : i + 9], "little"), i + 9
    size = (first & -first).bit_length()
    if i + size > len(data):
        raise IndexError("truncated varint")
    return int.from_bytes(data[i : i + size], "little") >> size, i + size


def encode_varint(value: int) -> bytes:
    """The shortest PrefixVarInt of a non-negative value (as MLIR's writer emits)."""
    for size in range(1, 9):
        if value < 1 << (7 * size):
            return (value << size | 1 << (size - 1)).to_bytes(size, "little")
    return b"\x00" + value.to_bytes(8, "little")


class Cursor:
    """Bounded reads in ``data[pos:end]``; every overrun is a KeyingError."""

    __slots__ = ("data", "end", "pos", "what")

    def __init__(self, data: bytes, pos: int, end: int, what: str) -> None:
        self.data, self.pos, self.end, self.what = data, pos, end, what

    def remaining(self) -> int:
        return self.end - self.pos

    def at_end(self) -> bool:
        return self.pos >= self.end

    def varint(self) -> int:
        i = self.pos
        if i >= self.end:
            raise malformed(f"the {self.what} end in the middle of a number")
        first = self.data[i]
        if first & 1:
            self.pos = i + 1
            return first >> 1
        size = 9 if first == 0 else (first & -first).bit_length()
        if i + size > self.end:
            raise malformed(f"the {self.what} end in the middle of a number")
        value, self.pos = long_varint(self.data, i)
        return value

    def count(self, least_bytes_each: int = 1) -> int:
        """A count of items that take at least ``least_bytes_each`` bytes each."""
        n = self.varint()
        if n * least_bytes_each > self.remaining():
            raise malformed(f"the {self.what} claim {n} items in {self.remaining()} bytes")
        return n

    def byte(self) -> int:
        if self.pos >= self.end:
            raise malformed(f"the {self.what} end early")
        self.pos += 1
        return self.data[self.pos - 1]

    def skip(self, size: int) -> tuple[int, int]:
        """Consume ``size`` bytes and return their span."""
        if size > self.remaining():
            raise malformed(f"the {self.what} claim {size} bytes, {self.remaining()} remain")
        start = self.pos
        self.pos += size
        return start, self.pos

    def align(self, alignment: int) -> None:
        """Skip 0xCB padding up to ``alignment``, counted from the start of the file:
        MLIR's writer aligns relative to its output buffer."""
        if alignment < 1 or alignment & (alignment - 1):
            raise malformed(f"an alignment of {alignment} is not a power of two")
        start, stop = self.skip(-self.pos % alignment)
        if self.data[start:stop].strip(bytes([_ALIGNMENT_BYTE])):
            raise malformed("alignment padding is not 0xCB")

    def section(self) -> tuple[int, int, int]:
        """A section header and body: (id, start, end) of its bytes."""
        head = self.byte()
        size = self.varint()
        if head & 0x80:
            self.align(self.varint())
        start, end = self.skip(size)
        return head & 0x7F, start, end

    def expect_end(self) -> None:
        if self.pos != self.end:
            raise malformed(f"{self.end - self.pos} unread bytes at the end of the {self.what}")


@dataclass(frozen=True)
class OpName:
    dialect: int
    name: bytes
    registered: int  # 1 or 0 as written from version 5 on; 2: not recorded


@dataclass(frozen=True)
class Resource:
    group: bytes  # the provider: an external key, or a dialect name
    key: bytes
    kind: int
    start: int  # the encoded value's span in the file
    end: int


@dataclass(frozen=True)
class Bytecode:
    """Everything of a bytecode file but its IR, with attribute and type entries and
    property blobs as spans of ``data`` (decoded on demand by ``_mlir_attrs``)."""

    data: bytes
    version: int
    producer: bytes
    strings: list[bytes]
    dialects: list[bytes]
    dialect_versions: list[bytes | None]
    op_names: list[OpName]
    n_attrs: int
    entry_dialect: list[int]  # attributes first, then types
    entry_custom: list[bool]  # a dialect encoding, else the assembly text
    entry_start: list[int]
    entry_end: list[int]
    resources: list[Resource]
    handles: list[int]  # dialect resources, as referenced from attributes
    properties: list[tuple[int, int]]
    ir: tuple[int, int]

    @property
    def n_types(self) -> int:
        return len(self.entry_dialect) - self.n_attrs

    def entry(self, node: int) -> bytes:
        return self.data[self.entry_start[node] : self.entry_end[node]]


def parse_bytecode(data: bytes) -> Bytecode:
    """Read the header and every section but the IR's contents (KeyingError if bad)."""
    if data[:4] != MAGIC:
        raise KeyingError("not MLIR bytecode: no ML\\xefR magic number")
    top = Cursor(data, 4, len(data), "file header")
    version = top.varint()
    if version > MAX_VERSION:
        raise KeyingError(
            f"unsupported MLIR bytecode: version {version} is newer than {MAX_VERSION}, "
            "the newest this reader knows"
        )
    nul = data.find(b"\x00", top.pos)
    if nul < 0:
        raise malformed("the producer string has no terminating NUL")
    producer = data[top.pos : nul]
    top.pos = nul + 1
    top.what = "sections"
    sections = _sections(top, version)
    strings = _strings(data, sections[STRINGS])
    dialects, dialect_versions, op_names = _dialects(data, sections[DIALECTS], version, strings)
    resources, handles = _resources(data, sections, strings, dialects)
    entries = _entries(data, sections[ATTR_TYPE_OFFSETS], sections[ATTR_TYPES], len(dialects))
    return Bytecode(
        data=data,
        version=version,
        producer=producer,
        strings=strings,
        dialects=dialects,
        dialect_versions=dialect_versions,
        op_names=op_names,
        n_attrs=entries[0],
        entry_dialect=entries[1],
        entry_custom=entries[2],
        entry_start=entries[3],
        entry_end=entries[4],
        resources=resources,
        handles=handles,
        properties=_properties(data, sections.get(PROPERTIES)),
        ir=sections[IR],
    )


def _sections(top: Cursor, version: int) -> dict[int, tuple[int, int]]:
    sections: dict[int, tuple[int, int]] = {}
    while not top.at_end():
        section_id, start, end = top.section()
        if section_id > PROPERTIES:
            raise KeyingError(
                f"unsupported MLIR bytecode: section kind {section_id} is unknown to this reader"
            )
        if section_id in sections or section_id == DIALECT_VERSIONS:
            raise malformed(f"a {_SECTION_NAMES[section_id]} section where none may be")
        sections[section_id] = (start, end)
    required = [STRINGS, DIALECTS, ATTR_TYPES, ATTR_TYPE_OFFSETS, IR]
    if version >= V_PROPERTIES:
        required.append(PROPERTIES)
    missing = [_SECTION_NAMES[s] for s in required if s not in sections]
    if missing:
        raise malformed(f"no {' or '.join(missing)} section")
    if (RESOURCES in sections) != (RESOURCE_OFFSETS in sections):
        raise malformed("resources without their offsets, or offsets without resources")
    if version < V_PROPERTIES and PROPERTIES in sections:
        raise malformed(f"a properties section in version {version}")
    return sections


def _strings(data: bytes, span: tuple[int, int]) -> list[bytes]:
    """The string table: a count, the sizes in reverse order, then the strings, each
    with its NUL (which MLIR drops without looking at it)."""
    cur = Cursor(data, span[0], span[1], "string section")
    count = cur.count()
    sizes = [cur.varint() for _ in range(count)]
    sizes.reverse()
    offset = cur.pos
    if sum(sizes) != cur.remaining() or 0 in sizes:
        raise malformed("the string sizes do not add up to the string data")
    strings = []
    for size in sizes:
        strings.append(data[offset : offset + size - 1])
        offset += size
    return strings


def _string(strings: list[bytes], index: int) -> bytes:
    if index >= len(strings):
        raise malformed(f"string {index} of {len(strings)}")
    return strings[index]


def _dialects(
    data: bytes, span: tuple[int, int], version: int, strings: list[bytes]
) -> tuple[list[bytes], list[bytes | None], list[OpName]]:
    cur = Cursor(data, span[0], span[1], "dialect section")
    names: list[bytes] = []
    versions: list[bytes | None] = []
    for _ in range(cur.count()):
        if version < V_DIALECT_VERSIONS:
            names.append(_string(strings, cur.varint()))
            versions.append(None)
            continue
        value = cur.varint()
        names.append(_string(strings, value >> 1))
        versions.append(_dialect_version(cur) if value & 1 else None)
    if version >= V_ELIDED_ARG_LOCS:
        cur.varint()  # the number of operation names, a reservation hint
    return names, versions, _op_names(cur, version, strings, len(names))


def _dialect_version(cur: Cursor) -> bytes:
    section_id, start, end = cur.section()
    if section_id != DIALECT_VERSIONS:
        raise malformed(f"a dialect version in a section of kind {section_id}")
    return cur.data[start:end]


def _op_names(cur: Cursor, version: int, strings: list[bytes], n_dialects: int) -> list[OpName]:
    names: list[OpName] = []
    while not cur.at_end():
        dialect = _dialect_index(cur, n_dialects)
        for _ in range(cur.count()):
            value = cur.varint()
            if version < V_PROPERTIES:
                names.append(OpName(dialect, _string(strings, value), 2))
            else:
                names.append(OpName(dialect, _string(strings, value >> 1), value & 1))
    return names


def _dialect_index(cur: Cursor, n_dialects: int) -> int:
    dialect = cur.varint()
    if dialect >= n_dialects:
        raise malformed(f"dialect {dialect} of {n_dialects}")
    return dialect


def _entries(
    data: bytes, offsets: tuple[int, int], body: tuple[int, int], n_dialects: int
) -> tuple[int, list[int], list[bool], list[int], list[int]]:
    """Attribute then type entries, grouped by dialect in the offset section, each an
    encoded size with the low bit saying whether it is a dialect encoding."""
    cur = Cursor(data, offsets[0], offsets[1], "attribute and type offsets")
    n_attrs = cur.count()
    n_types = cur.count()
    if n_attrs + n_types > cur.remaining():
        raise malformed(f"{n_attrs + n_types} attributes and types in {cur.remaining()} bytes")
    dialect: list[int] = []
    custom: list[bool] = []
    starts: list[int] = []
    ends: list[int] = []
    position, stop = body
    for total in (n_attrs, n_attrs + n_types):
        while len(dialect) < total:
            group = _dialect_index(cur, n_dialects)
            count = cur.varint()
            if count > total - len(dialect):
                raise malformed("an attribute or type group overruns its table")
            for _ in range(count):
                value = cur.varint()
                size = value >> 1
                if size == 0 or size > stop - position:
                    raise malformed("an attribute or type entry overruns its section")
                dialect.append(group)
                custom.append(bool(value & 1))
                starts.append(position)
                position += size
                ends.append(position)
    cur.expect_end()
    if position != stop:
        raise malformed("the attribute and type section has bytes no entry covers")
    return n_attrs, dialect, custom, starts, ends


def _resources(
    data: bytes,
    sections: dict[int, tuple[int, int]],
    strings: list[bytes],
    dialects: list[bytes],
) -> tuple[list[Resource], list[int]]:
    """Every resource in file order, and which of them are dialect resources (the
    ones an attribute's resource handle indexes)."""
    if RESOURCES not in sections:
        return [], []
    cur = Cursor(data, *sections[RESOURCE_OFFSETS], "resource offsets")
    body = Cursor(data, *sections[RESOURCES], "resource section")
    resources: list[Resource] = []
    for _ in range(cur.count(2)):
        group = _string(strings, cur.varint())
        _resource_group(cur, body, strings, group, resources)
    first_dialect = len(resources)
    while not cur.at_end():
        group = dialects[_dialect_index(cur, len(dialects))]
        _resource_group(cur, body, strings, group, resources)
    body.expect_end()
    return resources, list(range(first_dialect, len(resources)))


def _resource_group(
    cur: Cursor, body: Cursor, strings: list[bytes], group: bytes, out: list[Resource]
) -> None:
    for _ in range(cur.count(3)):
        key = _string(strings, cur.varint())
        size = cur.varint()
        kind = cur.byte()
        if kind > STRING:
            raise malformed(f"resource kind {kind}")
        start, end = body.skip(size)
        out.append(Resource(group, key, kind, start, end))


def _properties(data: bytes, span: tuple[int, int] | None) -> list[tuple[int, int]]:
    """Property blobs: a count, then each as a size and its bytes."""
    if span is None or span[0] == span[1]:
        return []
    cur = Cursor(data, span[0], span[1], "properties section")
    blobs = []
    for _ in range(cur.count()):
        blobs.append(cur.skip(cur.varint()))
    cur.expect_end()
    return blobs
