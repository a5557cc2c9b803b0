"""The IR section of MLIR bytecode as a canonical byte stream, for keying.

An operation is encoded (BytecodeReader.cpp, parseOpWithoutRegions) as

    name varint, mask byte, location varint, [attribute dictionary varint],
    [properties varint], [results: count, type numbers], [operands: count, value
    numbers], [successors: count, block numbers], [use-list orders],
    [regions: count << 1 | isolated]

and its regions follow it: a block count, a value count, then each block as
``op count << 1 | has arguments``, its arguments, its operations. From version 2 the
regions of an isolated operation are a nested IR section.

The canonical stream is the section's own bytes with every location reference removed
(an operation's, and a block argument's with the flag that announces it), the headers
of nested sections dropped, and three kinds of references taken out for the caller to
resolve by content (``Placeholder``): attribute dictionaries, whose numbers move when
locations come and go; the properties of top-level operations (the module's name lives
there); and the properties of operations that were not registered where they were
written, which are an attribute number. Everything else stays as written: names,
masks, type, value and block numbers, counts, use-list orders and property numbers.
Those numbers do not depend on locations (operation names and types are numbered by
use counts no location contributes to, properties by first use), and the caller pins
each to its content by position; for properties it gets the (name, number) pairs used.
Each kept field is self-delimiting and every removed one is at a place the kept bytes
determine, so the stream reads back unambiguously.

Kept numbers are not range-checked (a file with one out of range cannot be loaded by
MLIR, and its stream is still a function of its bytes); every reference the canonical
form resolves is, when resolved. Truncation inside the section shows as IndexError,
which ``walk`` turns into KeyingError; nothing recurses.

Speed: a large module is mostly operations, and this runs once per operation, so the
operation loop reads its varints inline, skips results, operands and successors with
one compiled pattern per mask (``_Tails``), and records property use in a list. A
nested section seen before (a reduction body: most regions of a model repeat byte for
byte) reuses the stream it produced.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from ._mlir_reader import (
    IR,
    V_ELIDED_ARG_LOCS,
    V_LAZY_LOADING,
    V_PROPERTIES,
    V_USE_LISTS,
    encode_varint,
    long_varint,
    malformed,
)

# Operation mask bits (mlir/lib/Bytecode/Encoding.h OpEncodingMask).
HAS_ATTRS, HAS_RESULTS, HAS_OPERANDS, HAS_SUCCESSORS = 0x01, 0x02, 0x04, 0x08
HAS_REGIONS, HAS_USE_LISTS, HAS_PROPERTIES = 0x10, 0x20, 0x40

# Placeholder kinds: an attribute dictionary; a properties blob; the properties of
# an operation that was not registered where it was written (an attribute).
DICT, PROPS, PROPS_ATTR = 0, 1, 2
Placeholder = tuple[int, int, int, bool]  # (kind, operation name, number, top level)
TailMatch = Callable[[bytes, int], "re.Match[bytes] | None"]


@dataclass(frozen=True)
class WalkContext:
    version: int
    base: int  # the IR section's offset in the file, for nested sections' alignment
    is_location: bytes  # per attribute: 1 if it is a location
    registered: bytes  # per operation name: 1 if registered where it was written


@dataclass
class IrStream:
    parts: list[bytes | Placeholder] = field(default_factory=list)
    holes: list[int] = field(default_factory=list)  # where ``parts`` has placeholders
    # Which operation name uses each properties blob below the top level (-1: none),
    # and the other (name, blob) pairs when one blob serves several names.
    owners: list[int] = field(default_factory=list)
    shared: set[tuple[int, int]] = field(default_factory=set)

    @property
    def properties(self) -> set[tuple[int, int]]:
        """(operation name, properties number) of every operation below the top level
        that has properties; the caller pins each pair to its decoded content."""
        used = {(name, number) for number, name in enumerate(self.owners) if name >= 0}
        return used | self.shared


def walk(ir: bytes, ctx: WalkContext, n_properties: int) -> IrStream:
    """The canonical stream of an IR section (KeyingError if it is malformed)."""
    try:
        return _Walk(ir, ctx, n_properties).run()
    except IndexError:
        raise malformed("the IR section ends inside an operation, or refers past a table") from None


def _varint(data: bytes, i: int) -> tuple[int, int]:
    first = data[i]
    if first & 1:
        return first >> 1, i + 1
    return long_varint(data, i)


class _Walk:
    """One walk over an IR section. ``run`` reads the nesting (blocks, regions, nested
    sections), ``_ops`` the operations of a block. The hot paths read varints inline:
    a function call costs more than the one-byte varint it would read."""

    def __init__(self, ir: bytes, ctx: WalkContext, n_properties: int) -> None:
        self.ir, self.ctx = ir, ctx
        self.stream = stream = IrStream(owners=[-1] * n_properties)
        self.seg = 0  # start of the bytes not yet copied to the stream
        # Nested sections: the stream each walked one produced, by its bytes; and the
        # ones being walked (bytes, where their parts and holes start, aligned count).
        self.sections: dict[bytes, tuple[list[bytes | Placeholder], list[int]]] = {}
        self.open: list[tuple[bytes, int, int, int]] = []
        self.aligned = 0  # aligned nested sections met so far
        self.hot = (
            ir,
            stream.parts,
            stream.parts.append,
            stream.owners,
            stream.holes.append,
            ctx.is_location,
            ctx.registered,
            _tail_patterns(ctx.version),
        )

    def run(self) -> IrStream:
        ir = self.ir
        size = len(ir)
        lazy = self.ctx.version >= V_LAZY_LOADING
        header, i = _varint(ir, 0)
        if header & 1:
            raise malformed("the top-level block has arguments")
        # The frame of the regions being read: ops left in the block, blocks left in
        # the region, regions left, the end of the nested section they make up (-1:
        # none), whether the block is the top level.
        ops, blocks, regions, end, top = header >> 1, 0, 0, -1, True
        if ops > size - i:
            raise malformed(f"the top-level block claims {ops} operations")
        stack: list[tuple[int, int, int, int, bool]] = []
        while True:
            if ops:
                i, ops, opened = self._ops(i, ops, top)
                if opened >= 0:
                    if opened >> 1 > size - i:
                        raise malformed(f"an operation claims {opened >> 1} regions")
                    section = -1
                    if opened & 1 and lazy:  # isolated regions: a nested section
                        i, section = self._enter(i, end)
                        if section < 0:  # seen before: its stream is reused
                            continue
                    stack.append((ops, blocks, regions, end, top))
                    ops, blocks, regions, end, top = 0, 0, opened >> 1, section, False
            elif blocks:
                blocks -= 1
                i, ops = self._block(i)
            elif regions:
                regions -= 1
                i, blocks = self._region(i)
            else:
                if end >= 0:
                    self._leave(i, end)
                if not stack:
                    break
                ops, blocks, regions, end, top = stack.pop()
        if i != size:
            raise malformed(f"{size - i} bytes after the last operation of the IR section")
        self.stream.parts.append(ir[self.seg :])
        return self.stream

    def _enter(self, i: int, end: int) -> tuple[int, int]:
        """Enter a nested IR section, dropping its header. A section seen before (a
        reduction body: most of a module's regions repeat byte for byte) gets the
        stream it got then, and the walk goes on after it: returns (its end, -1).
        Otherwise returns (its start, its end)."""
        parts = self.stream.parts
        parts.append(self.ir[self.seg : i])
        section_id, start, stop = _nested_section(self.ir, i, self.ctx.base)
        self.aligned += self.ir[i] >> 7
        if section_id != IR:
            raise malformed(f"isolated regions in a section of kind {section_id}")
        if end >= 0 and stop > end:
            raise malformed("a nested IR section overruns the one it is in")
        key = self.ir[start:stop]
        seen = self.sections.get(key)
        if seen is not None:
            self.stream.holes += [len(parts) + hole for hole in seen[1]]
            parts += seen[0]
            self.seg = stop
            return stop, -1
        self.open.append((key, len(parts), len(self.stream.holes), self.aligned))
        self.seg = start
        return start, stop

    def _leave(self, i: int, end: int) -> None:
        """Close a nested section and remember its stream, unless a section inside it
        was aligned (its padding depends on where it sits in the file)."""
        if i != end:
            raise malformed("a nested IR section does not end where its regions do")
        parts, holes = self.stream.parts, self.stream.holes
        parts.append(self.ir[self.seg : i])
        self.seg = i
        key, first_part, first_hole, aligned = self.open.pop()
        if aligned == self.aligned:
            self.sections[key] = (
                parts[first_part:],
                [hole - first_part for hole in holes[first_hole:]],
            )

    def _own(self, name: int, number: int) -> None:
        """Note that an operation named ``name`` uses properties blob ``number``."""
        if self.stream.owners[number] < 0:
            self.stream.owners[number] = name
        else:
            self.stream.shared.add((name, number))

    def _region(self, i: int) -> tuple[int, int]:
        """A region header: its block count, and its value count (kept)."""
        blocks, i = _varint(self.ir, i)
        if blocks > len(self.ir) - i:
            raise malformed(f"a region claims {blocks} blocks")
        if blocks:
            i = _varint(self.ir, i)[1]
        return i, blocks

    def _block(self, i: int) -> tuple[int, int]:
        """A block header (``op count << 1 | has arguments``) and its arguments."""
        header, i = _varint(self.ir, i)
        if header >> 1 > len(self.ir) - i:
            raise malformed(f"a block claims {header >> 1} operations")
        if header & 1:
            i = self._arguments(i)
        return i, header >> 1

    def _arguments(self, i: int) -> int:
        """A block's arguments: their types without locations (and, from version 4,
        without the flag that says one follows); then their use-list orders."""
        ir, version, is_location = self.ir, self.ctx.version, self.ctx.is_location
        count, i = _varint(ir, i)
        if count > len(ir) - i:
            raise malformed(f"a block claims {count} arguments")
        self.stream.parts.append(ir[self.seg : i])
        types = bytearray()
        for _ in range(count):
            value, i = _varint(ir, i)
            if version >= V_ELIDED_ARG_LOCS:
                value, has_location = value >> 1, value & 1
            else:
                has_location = 1
            if has_location:
                location, i = _varint(ir, i)
                if not is_location[location]:
                    raise malformed("a block argument's location is not a location")
            types += bytes((value << 1 | 1,)) if value < 0x80 else encode_varint(value)
        self.stream.parts.append(bytes(types))
        self.seg = i
        if version >= V_USE_LISTS:
            has_orders = ir[i]
            i += 1
            if has_orders:
                i = _use_lists(ir, i, count)
        return i

    def _ops(self, i: int, ops: int, top: bool) -> tuple[int, int, int]:
        """Read up to ``ops`` operations from ``i``, stopping after one with regions.

        Returns the position, the operations left, and the region encoding of the
        operation that stopped it (-1: none did). This runs once per operation: every
        field is read inline, and results, operands and successors are skipped by one
        compiled pattern per mask.
        """
        ir, parts, append, owners, hole, is_location, registered, tails = self.hot
        seg = self.seg
        while ops:
            ops -= 1
            first = ir[i]
            if first & 1:
                name = first >> 1
                i += 1
            else:
                name, i = long_varint(ir, i)
            mask = ir[i]
            i += 1
            append(ir[seg:i])
            first = ir[i]
            if first & 1:
                location = first >> 1
                i += 1
            else:
                location, i = long_varint(ir, i)
            if not is_location[location]:
                raise malformed("an operation's location is not a location")
            # Literal masks below: HAS_ATTRS, HAS_PROPERTIES, HAS_REGIONS (a global
            # costs a lookup per operation).
            if mask & 0x01:
                attrs, i = _varint(ir, i)
                hole(len(parts))
                append((DICT, name, attrs, top))
            seg = i
            if mask & 0x40:
                first = ir[i]
                if first & 1:
                    number = first >> 1
                    i += 1
                else:
                    number, i = long_varint(ir, i)
                if top or not registered[name]:
                    hole(len(parts))
                    append((PROPS if registered[name] else PROPS_ATTR, name, number, top))
                    seg = i
                elif owners[number] != name:  # a list, not a set: this runs per op
                    self._own(name, number)
            tail = tails[mask]
            matched = tail(ir, i) if tail is not None else None
            i = matched.end() if matched is not None else _slow_tail(ir, i, mask, self.ctx)
            if mask & 0x10:
                first = ir[i]
                if first & 1:
                    encoded, i = first >> 1, i + 1
                else:
                    encoded, i = long_varint(ir, i)
                if encoded >> 1:
                    self.seg = seg
                    return i, ops, encoded
        self.seg = seg
        return i, ops, -1


def _nested_section(ir: bytes, i: int, base: int) -> tuple[int, int, int]:
    """A section header inside the IR section: (id, start, end) of its bytes, its
    padding aligned relative to the file (``base`` is the IR section's offset)."""
    head = ir[i]
    size, i = _varint(ir, i + 1)
    if head & 0x80:
        alignment, i = _varint(ir, i)
        if alignment < 1 or alignment & (alignment - 1):
            raise malformed(f"an alignment of {alignment} is not a power of two")
        pad = -(base + i) % alignment
        if pad > len(ir) - i or ir[i : i + pad].strip(b"\xcb"):
            raise malformed("bad alignment padding in the IR section")
        i += pad
    if size > len(ir) - i:
        raise malformed("a nested IR section overruns the IR section")
    return head & 0x7F, i, i + size


def _slow_tail(ir: bytes, i: int, mask: int, ctx: WalkContext) -> int:
    """Results, operands, successors and use-list orders, one varint at a time: the
    operations the compiled patterns do not cover (long lists, large numbers,
    use-list orders) and invalid masks."""
    allowed = 0x1F | (HAS_USE_LISTS if ctx.version >= V_USE_LISTS else 0)
    if ctx.version >= V_PROPERTIES:
        allowed |= HAS_PROPERTIES
    if mask & ~allowed:
        raise malformed(f"operation mask {mask:#x} in version {ctx.version}")
    results = 0
    for bit in (HAS_RESULTS, HAS_OPERANDS, HAS_SUCCESSORS):
        if mask & bit:
            count, i = _skip_list(ir, i)
            if bit == HAS_RESULTS:
                results = count
    if mask & HAS_USE_LISTS:
        i = _use_lists(ir, i, results)
    return i


def _skip_list(ir: bytes, i: int) -> tuple[int, int]:
    count, i = _varint(ir, i)
    if count > len(ir) - i:
        raise malformed(f"a list of {count} numbers in {len(ir) - i} bytes")
    for _ in range(count):
        i = _varint(ir, i)[1]
    return count, i


def _use_lists(ir: bytes, i: int, values: int) -> int:
    """Use-list orders of ``values`` results or arguments (BytecodeReader.cpp
    parseUseListOrderForRange), kept as written."""
    lists = 1
    if values > 1:
        lists, i = _varint(ir, i)
        if lists > len(ir) - i:
            raise malformed(f"{lists} use-list orders in {len(ir) - i} bytes")
    for _ in range(lists):
        if values > 1:
            i = _varint(ir, i)[1]
        encoded, i = _varint(ir, i)
        if encoded >> 1 > len(ir) - i:
            raise malformed("a use-list order overruns the IR section")
        for _ in range(encoded >> 1):
            i = _varint(ir, i)[1]
    return i


# The compiled tails cover varints of up to three bytes (values below 2**21) and
# lists of fewer than _LIST_MAX entries: anything longer takes _slow_tail.
_LIST_MAX = 12
_SLOW = None  # in a tail table: _slow_tail decides


def _byte_class(keep: Callable[[int], bool]) -> bytes:
    return b"[" + b"".join(re.escape(bytes([b])) for b in range(256) if keep(b)) + b"]"


_ANY = b"[\\x00-\\xff]"
_VARINT = b"(?:%s|%s%s|%s%s{2})" % (
    _byte_class(lambda b: b & 1 == 1),
    _byte_class(lambda b: b & 3 == 2),
    _ANY,
    _byte_class(lambda b: b & 7 == 4),
    _ANY,
)
# A list is a count then that many varints; one alternative per count, told apart by
# the count's single byte, so a match is exact or there is none.
_LIST = b"(?:%s)" % b"|".join(
    re.escape(bytes([2 * n + 1])) + (_VARINT + b"{%d}" % n if n else b"") for n in range(_LIST_MAX)
)
_LIST_BITS = HAS_RESULTS | HAS_OPERANDS | HAS_SUCCESSORS


class _Tails(dict[int, "TailMatch | None"]):
    """Per mask byte, the matcher of its results, operands and successors, or _SLOW
    (use-list orders, bits the version lacks). Compiled on first use: a file uses a
    few masks, and each pattern takes milliseconds to compile."""

    def __init__(self, version: int) -> None:
        super().__init__()
        self.allowed = 0x1F | (HAS_PROPERTIES if version >= V_PROPERTIES else 0)

    def __missing__(self, mask: int) -> TailMatch | None:
        if mask & ~self.allowed:
            self[mask] = _SLOW
        else:
            self[mask] = _list_matcher(mask & _LIST_BITS)
        return self[mask]


@cache
def _list_matcher(bits: int) -> TailMatch:
    lists = [_LIST for bit in (HAS_RESULTS, HAS_OPERANDS, HAS_SUCCESSORS) if bits & bit]
    return re.compile(b"".join(lists)).match


@cache
def _tail_patterns(version: int) -> _Tails:
    return _Tails(version)
