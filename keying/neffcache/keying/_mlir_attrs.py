"""Content digests of the attributes and types of MLIR bytecode.

Each attribute or type entry is decoded by the encoding of its dialect and hashed over
its kind, its own data and the digests of the entries it refers to, never their
numbers: the writer numbers entries by use count, and a location's references move
everything after it (see ``_mlir``). Known encodings (the layouts below):

* builtin, from mlir/include/mlir/IR/BuiltinDialectBytecode.td (attribute codes 0-22,
  type codes 0-32);
* stablehlo, from stablehlo/dialect/StablehloBytecode.cpp (attribute codes 1-22, type
  codes 0-1); chlo, from ChloBytecode.cpp (attribute codes 0-1).

Entries written as assembly text (the fallback of any dialect) hash their text,
which refers to nothing by number. Entries of other dialects with a dialect encoding,
and codes these layouts do not know, are *opaque*: they hash their raw bytes, which
may hold numbers of other entries, strings or resources, so using one sets
``pinned`` and the caller then hashes every table by position (see ``_mlir``).

Locations (builtin codes 10-15 and 22, and assembly text ``loc(...)``) all hash to one
constant and are never decoded: whatever they hold cannot reach a key.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import and_, itemgetter
from typing import cast

import blake3

from ._mlir_reader import Bytecode, long_varint, malformed

Part = bytes | int | memoryview  # literal bytes, or the number of an entry (a child)
Kind = tuple[bytes, int]  # (dialect, code); code -1: assembly text

LOCATION_CODES = frozenset({10, 11, 12, 13, 14, 15, 22})
# First byte -> 1 if it is the one-byte varint of a location code.
_LOCATION_FIRST_BYTES = bytes(int(b & 1 == 1 and b >> 1 in LOCATION_CODES) for b in range(256))
_STRING_FIRST_BYTE = bytes(int(b == 0x05) for b in range(256))  # builtin StringAttr, code 2
LOCATION = blake3.blake3(b"neffcache MLIR location").digest()

# Layouts: one letter per field, in encoding order (see _FIELDS).
BUILTIN_ATTRS = {
    0: "A", 1: "P", 2: "x", 3: "xt", 4: "a", 5: "aA", 6: "t", 7: "", 8: "tr", 9: "tr",
    16: "th", 17: "tvD", 18: "tD", 19: "tvX", 20: "taa", 21: "Ia",
}  # fmt: skip
BUILTIN_TYPES = {
    0: "v", 1: "", 2: "TT", 9: "t", 10: "Sta", 11: "aSta", 12: "", 13: "St", 14: "aSt",
    15: "T", 16: "t", 17: "at", 18: "t", 19: "St", 20: "BSt",
    **{code: "" for code in (3, 4, 5, 6, 7, 8, *range(21, 33))},  # float types
}  # fmt: skip
STABLEHLO_ATTRS = {
    1: "ss", 2: "v", 3: "v", 4: "ssSssSssS", 5: "SSSS", 6: "v", 7: "SSSSSs", 8: "v",
    9: "v", 10: "v", 11: "SSSSSs", 12: "v", 13: "S", 14: "SsS", 15: "tttsssb", 16: "v",
    17: "sssa", 18: "aA", 19: "ss", 20: "xo", 21: "xs", 22: "ao",
}  # fmt: skip
LAYOUTS: dict[tuple[bytes, bool], dict[int, str]] = {
    (b"builtin", False): BUILTIN_ATTRS,
    (b"builtin", True): BUILTIN_TYPES,
    (b"stablehlo", False): STABLEHLO_ATTRS,
    (b"stablehlo", True): {0: "", 1: "T"},
    (b"chlo", False): {0: "v", 1: "v"},
}
# Dialects whose decode failures are version skew rather than damage: opaque, not
# KeyingError (the builtin encodings are MLIR's stable format).
_LENIENT = frozenset({b"stablehlo", b"chlo"})


class Entries:
    """Digests of a file's attributes (numbers 0..n_attrs-1) and types (after them)."""

    def __init__(self, bc: Bytecode) -> None:
        self.bc = bc
        self.n_attrs = bc.n_attrs
        self.pinned = False  # an opaque entry's digest was used
        size = len(bc.entry_dialect)
        self._digests: list[bytes] = [b""] * size  # b"": not computed yet
        self._bodies: list[list[Part] | None] = [None] * size
        self._visiting = bytearray(size)  # on the digest stack, children pushed
        self._tags: dict[tuple[int, bool], bytes] = {}
        self.is_location, self._is_string = self._classify()
        for node, flag in enumerate(self.is_location):
            if flag:
                self._digests[node] = LOCATION

    def _classify(self) -> tuple[bytes, bytes]:
        """Per attribute, whether it is a location (a builtin entry whose one-byte
        code is a location's, or assembly text starting ``loc(``), and whether it is a
        builtin StringAttr (digested without the stack, see ``digest``). Done with
        bytes.translate and map, not a Python step per entry."""
        bc = self.bc
        n = bc.n_attrs
        if not n:
            return b"", b""
        starts = bc.entry_start[:n]
        # itemgetter of one index gives the item, of several a tuple.
        firsts = bytes(itemgetter(*starts)(bc.data)) if n > 1 else bytes([bc.data[starts[0]]])
        builtin = bc.dialects.index(b"builtin") if b"builtin" in bc.dialects else -1
        custom = bytes(bc.entry_custom[:n])
        builtin_custom = bytes(map(and_, map(builtin.__eq__, bc.entry_dialect[:n]), custom))
        locations = bytearray(map(and_, firsts.translate(_LOCATION_FIRST_BYTES), builtin_custom))
        strings = bytes(map(and_, firsts.translate(_STRING_FIRST_BYTE), builtin_custom))
        node = custom.find(0)
        while node >= 0:  # assembly text: a location if it starts with loc(
            locations[node] = bc.data[starts[node] : starts[node] + 4] == b"loc("
            node = custom.find(0, node + 1)
        return bytes(locations), strings

    def kind(self, node: int) -> Kind:
        dialect = self.bc.dialects[self.bc.entry_dialect[node]]
        if not self.bc.entry_custom[node]:
            return dialect, -1
        data = self.bc.data
        start = self.bc.entry_start[node]
        first = data[start]
        if first & 1:
            return dialect, first >> 1
        try:
            return dialect, long_varint(data[start : self.bc.entry_end[node]], 0)[0]
        except IndexError:
            raise malformed("an attribute or type entry ends inside its code") from None

    def digest(self, node: int) -> bytes:
        """The content digest of entry ``node``, computing its children first with an
        explicit stack (a cycle is a KeyingError)."""
        digests = self._digests
        if digests[node]:
            return digests[node]
        visiting = self._visiting
        stack = [node]
        while stack:
            top = stack[-1]
            if digests[top]:
                stack.pop()
                continue
            body = self._body(top)
            if not visiting[top]:
                pending = [part for part in body if part.__class__ is int and not digests[part]]
                if pending:
                    visiting[top] = 1
                    for part in pending:
                        if part < self.n_attrs and self._is_string[part]:
                            digests[part] = _hash(self._body(part), digests)
                        elif visiting[part]:
                            raise malformed("an attribute or type refers to itself")
                        else:
                            stack.append(part)
                    continue
            # Every child is done: a child still pending would be on the stack below.
            digests[top] = _hash(body, digests)
            visiting[top] = 0
            stack.pop()
        return digests[node]

    def digest_without(self, node: int, key: bytes) -> bytes:
        """The digest of dictionary ``node`` as if it had no entry named ``key``."""
        body = self._body(node)
        pairs = body[4:]  # after the tag, the mode, the code and the count
        kept: list[Part] = []
        for name, value in zip(pairs[::2], pairs[1::2], strict=True):
            assert isinstance(name, int)
            assert isinstance(value, int)
            if self.string_node(name) != key:
                kept += [self.digest(name), self.digest(value)]
        count = (len(kept) // 2).to_bytes(8, "big")
        return _hash([*body[:3], count, *kept], self._digests)

    def string_node(self, node: int) -> bytes | None:
        """The value of a builtin StringAttr entry, else None."""
        if self.kind(node) not in ((b"builtin", 2), (b"builtin", 3)):
            return None
        literal = self._body(node)[3]  # after the tag, the mode and the code
        assert isinstance(literal, bytes)
        return literal[8:]

    def _body(self, node: int) -> list[Part]:
        """The parts ``_hash`` hashes: the framed tag (entry kind and dialect), then the
        literals and children (entry numbers) of the entry, cached."""
        cached = self._bodies[node]
        if cached is None:
            cached = self._bodies[node] = self._decode(node)
        return cached

    def _decode(self, node: int) -> list[Part]:
        bc = self.bc
        dialect = bc.dialects[bc.entry_dialect[node]]
        is_type = node >= self.n_attrs
        tag = self._tags.get((bc.entry_dialect[node], is_type))
        if tag is None:
            tag = _framed((b"T" if is_type else b"A") + _framed(dialect))
            self._tags[bc.entry_dialect[node], is_type] = tag
        start, end = bc.entry_start[node], bc.entry_end[node]
        if dialect == b"builtin" and bc.entry_custom[node] and not is_type:
            first = bc.data[start]
            if first == _STRING_FIRST:
                return [tag, b"dialect", b"\x05", self._string(start + 1, end)]
            if first in _FAST_CODES:
                return [tag, b"dialect", *self._fast_builtin(bc.data[start:end])]
        # Raw entries are hashed from the file's memory: a constant can be large.
        raw = memoryview(bc.data)[start:end]
        if not bc.entry_custom[node]:
            if bc.data.find(b"\x00", start, end) != end - 1:
                raise malformed("an attribute or type in assembly form is not one string")
            return [tag, b"asm", raw]
        layout = LAYOUTS.get((dialect, is_type), {}).get(self.kind(node)[1])
        if layout is not None:
            try:
                return [tag, b"dialect", *_Reader(self, node).read(layout)]
            except _Undecodable as exc:
                if dialect not in _LENIENT:
                    raise malformed(f"a {dialect.decode(errors='replace')} entry: {exc}") from None
        self.pinned = True
        return [tag, b"opaque", raw]

    def _string(self, pos: int, end: int) -> bytes:
        """A builtin StringAttr's string number, at ``pos``, framed as its text."""
        data = self.bc.data
        first = data[pos] if pos < end else 0
        if first & 1:
            number, pos = first >> 1, pos + 1
        elif first & 2 and pos + 1 < end:
            number, pos = (first | data[pos + 1] << 8) >> 2, pos + 2
        else:
            try:
                number, pos = long_varint(data, pos)
            except IndexError:
                raise malformed("a string attribute ends in the middle of a number") from None
        if pos != end or number >= len(self.bc.strings):
            raise malformed("a string attribute is not one string number")
        return _framed(self.bc.strings[number])

    def _fast_builtin(self, entry: bytes) -> list[Part]:
        """Arrays and dictionaries, the bulk of a module's attributes (argument and
        result attributes), read without the layout machinery; the parts are the ones
        ``_Reader`` makes for layouts "A" and "P"."""
        try:
            values = _all_varints(entry, 1)
        except IndexError:
            raise malformed("an attribute ends in the middle of a number") from None
        code = entry[:1]
        refs = values[1:]
        if not values or len(refs) != values[0] * (2 if code == _DICT_CODE else 1):
            raise malformed("an array or dictionary attribute does not hold its count")
        if refs and max(refs) >= self.n_attrs:
            raise malformed(f"attribute {max(refs)} of {self.n_attrs}")
        parts: list[Part] = [code, values[0].to_bytes(8, "big")]
        parts += refs
        return parts


# Builtin array (0), dictionary (1) and string (2) codes as one-byte varints.
_DICT_CODE = b"\x03"
_FAST_CODES = frozenset(b"\x01\x03")
_STRING_FIRST = 0x05


def _all_varints(data: bytes, pos: int) -> list[int]:
    """Every varint from ``pos`` to the end (IndexError if the last is cut short)."""
    values: list[int] = []
    append = values.append
    size = len(data)
    while pos < size:
        first = data[pos]
        if first & 1:
            append(first >> 1)
            pos += 1
        elif first & 2 and pos + 1 < size:
            append((first | data[pos + 1] << 8) >> 2)
            pos += 2
        else:
            value, pos = long_varint(data, pos)
            append(value)
    return values


def _framed(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def _hash(body: list[Part], digests: list[bytes]) -> bytes:
    """BLAKE3 of the literals and the children's digests. A large payload (a dense
    constant, always the last part) goes to the hasher from the file's memory."""
    last = body[-1]
    if last.__class__ is memoryview:
        body = body[:-1]
    # An int part is an entry number: its digest stands in for it.
    pieces = [digests[part] if part.__class__ is int else part for part in body]
    hasher = blake3.blake3(b"".join(cast("list[bytes]", pieces)))
    if last.__class__ is memoryview:
        hasher.update(last)
    digest: bytes = hasher.digest()
    return digest


class _Undecodable(Exception):
    """An entry does not fit its layout (internal: the caller decides what it means)."""


class _Reader:
    """Reads one entry by a layout string into literal parts and child numbers. Every
    literal is self-delimiting (a raw varint or list, or length-framed), so the parts
    read back unambiguously given the layout. Reads the file in place, between the
    entry's bounds."""

    def __init__(self, entries: Entries, node: int) -> None:
        self.entries, self.node = entries, node
        self.data = entries.bc.data
        self.pos, self.end = entries.bc.entry_start[node], entries.bc.entry_end[node]
        self.parts: list[Part] = []

    def read(self, layout: str) -> list[Part]:
        self.parts.append(self.raw_varint())  # the code
        for letter in layout:
            _FIELDS[letter](self)
        if self.pos != self.end:
            raise _Undecodable(f"{self.end - self.pos} bytes past its fields")
        return self.parts

    def remaining(self) -> int:
        return self.end - self.pos

    def varint(self) -> int:
        if self.pos >= self.end:
            raise _Undecodable("it ends early")
        first = self.data[self.pos]
        if first & 1:
            self.pos += 1
            return first >> 1
        try:
            value, self.pos = long_varint(self.data, self.pos)
        except IndexError:
            raise _Undecodable("it ends in the middle of a number") from None
        if self.pos > self.end:
            raise _Undecodable("it ends in the middle of a number")
        return value

    def raw_varint(self) -> bytes:
        start = self.pos
        self.varint()
        return self.data[start : self.pos]

    def count(self) -> int:
        n = self.varint()
        if n > self.remaining():
            raise _Undecodable(f"a list of {n} in {self.remaining()} bytes")
        return n

    def take(self, size: int) -> bytes:
        if size > self.remaining():
            raise _Undecodable("it ends early")
        self.pos += size
        return self.data[self.pos - size : self.pos]

    def attr(self) -> None:
        number = self.varint()
        if number >= self.entries.n_attrs:
            raise _Undecodable(f"attribute {number} of {self.entries.n_attrs}")
        self.parts.append(number)

    def type(self) -> None:
        number = self.varint()
        if number >= self.entries.bc.n_types:
            raise _Undecodable(f"type {number} of {self.entries.bc.n_types}")
        self.parts.append(self.entries.n_attrs + number)

    def string(self) -> None:
        self.parts.append(self.framed_string())

    def framed_string(self) -> bytes:
        number = self.varint()
        strings = self.entries.bc.strings
        if number >= len(strings):
            raise _Undecodable(f"string {number} of {len(strings)}")
        return _framed(strings[number])

    def literal_list(self, item: Callable[[_Reader], object]) -> None:
        start = self.pos
        for _ in range(self.count()):
            item(self)
        self.parts.append(self.data[start : self.pos])


def _refs(types: bool, per: int = 1) -> Callable[[_Reader], None]:
    """A counted list of attribute or type references (``per`` to an item), read in
    one pass: a function type of a large model lists thousands."""

    def read(reader: _Reader) -> None:
        n = reader.count()
        reader.parts.append(n.to_bytes(8, "big"))
        numbers, reader.pos = _some_varints(reader.data, reader.pos, n * per)
        if reader.pos > reader.end:
            raise _Undecodable("a list runs past its entry")
        if numbers:
            limit = reader.entries.bc.n_types if types else reader.entries.n_attrs
            if max(numbers) >= limit:
                raise _Undecodable(f"a reference past the {limit} entries of its table")
            offset = reader.entries.n_attrs if types else 0
            reader.parts += [offset + number for number in numbers] if offset else numbers

    return read


def _some_varints(data: bytes, pos: int, count: int) -> tuple[list[int], int]:
    """``count`` varints from ``pos``, and the position after them."""
    values: list[int] = []
    append = values.append
    try:
        for _ in range(count):
            first = data[pos]
            if first & 1:
                append(first >> 1)
                pos += 1
            else:
                value, pos = long_varint(data, pos)
                append(value)
    except IndexError:
        raise _Undecodable("it ends in the middle of a list") from None
    return values, pos


def _blob(reader: _Reader) -> None:
    """A size and that many bytes; the last field of its layout ("tD", "tvD"), so a
    large one is the last part, which ``_hash`` streams from the file's memory."""
    size = reader.varint()
    if size > reader.remaining():
        raise _Undecodable(f"a blob of {size} bytes in {reader.remaining()}")
    reader.parts.append(size.to_bytes(8, "big"))
    start = reader.pos
    reader.pos += size
    if size > 4096:
        reader.parts.append(memoryview(reader.data)[start : reader.pos])
    else:
        reader.parts.append(reader.data[start : reader.pos])


def _strings_to_end(reader: _Reader) -> None:
    """Dense string elements: string numbers up to the end of the entry."""
    strings = []
    while reader.pos < reader.end:
        strings.append(reader.framed_string())
    reader.parts.append(len(strings).to_bytes(8, "big") + b"".join(strings))


def _rest(reader: _Reader) -> None:
    """An APInt or APFloat, whose width the type gives: its bytes to the end."""
    if reader.pos >= reader.end:
        raise _Undecodable("no value")
    reader.parts.append(reader.take(reader.remaining()))


def _optional_attr(reader: _Reader) -> None:
    """A bool byte, then an attribute if it is set (stablehlo AxisRef, Mesh)."""
    flag = reader.take(1)
    reader.parts.append(flag)
    if flag != b"\x00":
        reader.attr()


def _handle(reader: _Reader) -> None:
    """A dialect resource handle: its number, pinned by position in the resource part."""
    number = reader.varint()
    if number >= len(reader.entries.bc.handles):
        raise _Undecodable(f"resource {number} of {len(reader.entries.bc.handles)}")
    reader.parts.append(number.to_bytes(8, "big"))


def _own_number(reader: _Reader) -> None:
    """A DistinctAttr is unique by identity, not content: its entry number keeps two
    distinct attributes with the same content apart (a spurious miss at worst)."""
    reader.parts.append(reader.node.to_bytes(8, "big"))


def _bools(reader: _Reader) -> None:
    start = reader.pos
    reader.take(reader.count())
    reader.parts.append(reader.data[start : reader.pos])


def _raw(reader: _Reader) -> None:
    reader.parts.append(reader.raw_varint())


def _svarint_list(reader: _Reader) -> None:
    reader.literal_list(_Reader.varint)


_FIELDS: dict[str, Callable[[_Reader], None]] = {
    "v": _raw,  # varint
    "s": _raw,  # signed varint (APFloat of f64 in ResultAccuracy too)
    "S": _svarint_list,  # a count and that many signed varints
    "b": lambda r: r.parts.append(r.take(1)),  # a bool byte
    "B": _bools,  # a count and that many bool bytes
    "a": _Reader.attr,
    "t": _Reader.type,
    "x": _Reader.string,
    "A": _refs(types=False),
    "T": _refs(types=True),
    "P": _refs(types=False, per=2),  # (name, value) pairs
    "o": _optional_attr,
    "h": _handle,
    "D": _blob,
    "X": _strings_to_end,
    "r": _rest,
    "I": _own_number,
}
