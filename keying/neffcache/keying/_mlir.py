"""Canonical fingerprint of StableHLO MLIR bytecode, the ``module.mlir`` TorchNeuron
hands to neuronx-cc (written by MLIR's ``writeBytecodeToFile``), and of VHLO portable
artifacts (jax.export). Pure Python: the standard library and blake3.

Two files get one fingerprint when they differ only in

* locations, of every kind (file:line:col and ranges, names, call sites, fused,
  unknown and opaque locations), on operations and on block arguments;
* the symbol name of the top-level ``builtin.module`` (``module @jit_f``);

and everything else splits them: operations and their order, types and shapes,
attributes and constants (dense elements, resources), the names calls refer to,
dialect versions, even the producer string.

The canonical form, hashed under its own BLAKE3 derive-key domain, is eight parts,
each framed with its length:

1. the bytecode version and the producer;
2. the dialects in file order, each with its version blob;
3. the operation names in file order: dialect number, name, registered flag;
4. the types in file order, each as its content digest (``_mlir_attrs``);
5. the IR (``_mlir_walk``): the section as written without location references,
   with each attribute dictionary, and the properties of each top-level operation,
   replaced by its content digest;
6. for each (operation name, properties number) used below the top level, in that
   order, the blob's content under the operation's fields (``_mlir_props``);
7. the resources in file order: provider, key, kind and value (several framed parts);
8. the pin: nothing, or, once an opaque entry was used, the digest of every
   attribute and every string by position.

Where locations are, and how they go. An operation's location and a block argument's
are attribute numbers in the IR: ``_mlir_walk`` removes them (and the flag that says
an argument has one). Location entries are never decoded and all hash to one constant,
so one inside another attribute contributes only "a location is here". Their strings
(file names, names) are reached only through them.

Why numbers cannot be hashed as written. MLIR's writer (IRNumbering.cpp) numbers
attributes by use count and strings by first use, and locations are attributes with
strings: adding or removing them moves the numbers of everything else. The fixtures
show it (tests/fixtures/mlir; test_mlir.py checks it): in ``block_a``,
``block_a_no_locations`` and ``block_a_stripped`` the empty dictionary is attribute 6,
3 and 1, the broadcast dimensions ``array<i64: 1>`` 9, 7 and 3, the string ``main``
15, 20 and 17; every properties blob holding such numbers differs. Therefore every
attribute reference is resolved by content: attributes and types hash the digests of what they
refer to (a Merkle DAG, iteratively, cycles rejected), dictionaries in the IR and
attributes in properties are replaced by digests, and strings are hashed as text where
they are used. What the fixtures show does not move, and why: operation names and
types are numbered by use counts no location contributes to (locations refer to no
type), properties by first use of each distinct blob (in operation order; blobs that
differ only by renumbered attributes stay distinct or equal together), dialects by
first use (the builtin module comes first) and resources by their dialect's order.
Those numbers are kept as written and pinned by position: parts 2, 3, 4, 6 and 7 hash
what sits at each number.

Why no two different programs share a fingerprint. Every field that carries meaning
is hashed as written or replaced by what fixes its meaning: numbers kept as written
denote table positions whose content is hashed; numbers that move are replaced by
content digests; strings are hashed as text. Not hashed are only the locations and the
top-level module's name (the two things dropped on purpose), section framing (lengths
and padding, which only delimit what is hashed), the count of operation names (a
reservation hint) and entries nothing refers to. Every kept field is self-delimiting
and every digest sits at a place the kept bytes determine, so the canonical form reads
back to the program. The one gap is an opaque entry: an attribute or type of a
dialect whose encoding this reader does not know (VHLO's, for one), a code it does
not know, a dialect version it cannot read, or a properties blob that does not fit its
operation's fields. Such an entry is hashed as its raw bytes, which may hold numbers
of attributes, types, strings or resources (a dialect reads them with
``readAttribute``, ``readType``, ``readString``, ``readResourceHandle`` anywhere in its
encoding). Raw bytes are only safe if everything any of those numbers could denote is
pinned by position, so part 8 then adds every attribute and every string; types,
operation names, dialects and resources are pinned already. Locations stay one
constant in that pin, which is sound: a number that denotes a location denotes "a
location" in every file pinned the same way. The price is spurious misses only: with
an opaque entry, files whose numbering differs (because their locations do, say)
miss. The remaining assumption is that operation properties were written with the
fields in ``_mlir_props`` (see there for why that is the compiler's assumption too).

MLIR text has no canonical form here (its raw-bytes key still applies); anything
this reader does not know, a newer bytecode version or a section kind past 8, is a
KeyingError, never a guess.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import cast

import blake3

from ._errors import KeyingError
from ._mlir_attrs import LOCATION, Entries
from ._mlir_props import LAYOUTS, decode_properties
from ._mlir_reader import (
    BLOB,
    BOOL,
    MAGIC,
    Bytecode,
    Cursor,
    encode_varint,
    malformed,
    parse_bytecode,
)
from ._mlir_walk import DICT, PROPS, IrStream, Placeholder, WalkContext, walk
from ._version import KEY_VERSION

_FINGERPRINT_CONTEXT = f"neffcache {KEY_VERSION} StableHLO bytecode fingerprint"
_MAGIC = f"neffcache-canonical-mlir/{KEY_VERSION}\n".encode()
_TOP_MODULE = b"builtin.module"
_MODULE_NAME = "sym_name"
# Dialects whose version blob is three varints (StablehloBytecode.cpp writeVersion,
# and VHLO's alike): no numbers of other entries.
_PLAIN_VERSIONS = frozenset({b"stablehlo", b"vhlo", b"chlo"})


def fingerprint_mlir(data: bytes) -> str:
    """Return the 64-hex BLAKE3 fingerprint of MLIR bytecode's canonical form.

    >>> fingerprint_mlir(open("module.mlir", "rb").read())  # doctest: +SKIP
    '3a9e...'

    Raises KeyingError when the bytes are not MLIR bytecode this reader knows (MLIR
    text included: it has no canonical form; the raw-bytes key still applies).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise KeyingError(f"expected MLIR bytecode, got {type(data).__name__}")
    data = bytes(data)
    if not is_mlir_bytecode(data):
        if is_mlir_text(data):
            raise KeyingError("MLIR text has no canonical form; the raw-bytes key still applies")
        raise KeyingError("not MLIR bytecode: no ML\\xefR magic number")
    hasher = blake3.blake3(_MAGIC, derive_key_context=_FINGERPRINT_CONTEXT)
    for part in _Canonical(parse_bytecode(data)).parts():
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    digest: str = hasher.hexdigest()
    return digest


def is_mlir_bytecode(data: bytes) -> bool:
    """Whether ``data`` starts with MLIR bytecode's magic number."""
    return bytes(data[:4]) == MAGIC


# A file of MLIR text starts, after blank lines and // comments, with an operation or
# an alias definition: module, builtin.module, func.func, "op.name"(, #loc..., #x = ...
_TEXT_START = re.compile(
    r"""(?:module|builtin\.module|func\.func|stablehlo\.\w+|"[a-z_]+\.[\w.]+")[\s@{(<]
      | \#loc
      | [#!][A-Za-z_][\w.$-]*\s*=\s
      | %[\w.$-]+(?::\d+)?\s*=\s*"?[a-z_]+\.""",
    re.VERBOSE,
)
_BLANK = re.compile(r"(?:\s+|//[^\n]*)*")


def is_mlir_text(data: bytes) -> bool:
    """A cheap, conservative guess that ``data`` is MLIR's textual form: its first
    kilobytes decode as UTF-8 and, after blank lines and comments, start the way
    MLIR text does. For recognizing an input only, never for keying it."""
    head = bytes(data[:8192])
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=len(data) <= 8192)
    except UnicodeDecodeError:
        return False
    blank = _BLANK.match(text)
    return _TEXT_START.match(text, blank.end() if blank else 0) is not None


class _Canonical:
    """The parts of one file's canonical form (see the module docstring)."""

    def __init__(self, bc: Bytecode) -> None:
        self.bc = bc
        self.entries = Entries(bc)
        self.names = [bc.dialects[op.dialect] + b"." + op.name for op in bc.op_names]

    def parts(self) -> Iterator[bytes | memoryview]:
        bc = self.bc
        yield encode_varint(bc.version) + _framed(bc.producer)
        yield self._dialects()
        yield b"".join(
            encode_varint(op.dialect) + _framed(op.name) + bytes([op.registered])
            for op in bc.op_names
        )
        yield b"".join(map(self.entries.digest, range(bc.n_attrs, len(bc.entry_dialect))))
        stream = self._ir()
        yield self._ir_bytes(stream)
        yield self._properties(stream)
        yield from self._resources()
        yield self._pin()

    def _dialects(self) -> bytes:
        out = []
        for name, version in zip(self.bc.dialects, self.bc.dialect_versions, strict=True):
            out.append(_framed(name))
            if version is None:
                out.append(b"\x00")
                continue
            # Another dialect's version is read by its own code, which may read
            # numbers of attributes: opaque.
            self.entries.pinned |= name not in _PLAIN_VERSIONS
            out.append(b"\x01" + _framed(version))
        return b"".join(out)

    def _ir(self) -> IrStream:
        bc = self.bc
        start, end = bc.ir
        ctx = WalkContext(
            version=bc.version,
            base=start,
            is_location=self.entries.is_location,
            registered=bytes(op.registered for op in bc.op_names),
        )
        return walk(bc.data[start:end], ctx, len(bc.properties))

    def _ir_bytes(self, stream: IrStream) -> bytes:
        parts = stream.parts
        for index in stream.holes:
            hole = parts[index]
            assert isinstance(hole, tuple)
            parts[index] = self._resolve(hole)
        return b"".join(cast("list[bytes]", parts))  # every hole is filled

    def _resolve(self, hole: Placeholder) -> bytes:
        kind, name, number, top = hole
        module = top and self.names[name] == _TOP_MODULE
        if kind == PROPS:
            return self._properties_digest(name, number, module)
        if number >= self.bc.n_attrs:
            raise malformed(f"attribute {number} of {self.bc.n_attrs}")
        if kind == DICT:
            if self.entries.kind(number) != (b"builtin", 1):
                raise malformed("an operation's attribute dictionary is not a dictionary")
            if module:
                return self.entries.digest_without(number, _MODULE_NAME.encode())
        return self.entries.digest(number)

    def _properties(self, stream: IrStream) -> bytes:
        return b"".join(
            encode_varint(name) + encode_varint(number) + self._properties_digest(name, number)
            for name, number in sorted(stream.properties)
        )

    def _properties_digest(self, name: int, number: int, module: bool = False) -> bytes:
        if number >= len(self.bc.properties):
            raise malformed(f"properties {number} of {len(self.bc.properties)}")
        start, end = self.bc.properties[number]
        blob = self.bc.data[start:end]
        layout = LAYOUTS.get(self.names[name])
        drop = _MODULE_NAME if module else ""
        content = decode_properties(blob, layout, self.entries, drop) if layout else None
        if content is None:
            self.entries.pinned = True
            return _digest(b"opaque properties", blob)
        return _digest(b"properties", content)

    def _resources(self) -> Iterator[bytes | memoryview]:
        """Part 7, as several parts: the count, then per resource its header and its
        value (a large blob, weights, goes to the hasher from the file's memory)."""
        yield encode_varint(len(self.bc.resources))
        for res in self.bc.resources:
            yield _framed(res.group) + _framed(res.key) + bytes([res.kind])
            yield from self._resource_value(res.kind, res.start, res.end)

    def _resource_value(self, kind: int, start: int, end: int) -> list[bytes | memoryview]:
        """A resource's value as meant: a blob's alignment and bytes (the padding
        between them depends on where it sits), a bool's byte, a string's text; a
        declaration without data is empty."""
        if start == end:
            return [b""]
        cur = Cursor(self.bc.data, start, end, "resource")
        value: list[bytes | memoryview]
        if kind == BLOB:
            alignment = cur.varint()
            size = cur.varint()
            cur.align(alignment)
            begin, stop = cur.skip(size)
            value = [encode_varint(alignment), memoryview(self.bc.data)[begin:stop]]
        elif kind == BOOL:
            value = [bytes([cur.byte()])]
        else:
            number = cur.varint()
            if number >= len(self.bc.strings):
                raise malformed(f"string {number} of {len(self.bc.strings)}")
            value = [self.bc.strings[number]]
        cur.expect_end()
        return value

    def _pin(self) -> bytes:
        if not self.entries.pinned:
            return b""
        attrs = b"".join(
            LOCATION if flag else self.entries.digest(node)
            for node, flag in enumerate(self.entries.is_location)
        )
        return b"\x01" + attrs + b"".join(map(_framed, self.bc.strings))


def _framed(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def _digest(label: bytes, content: bytes) -> bytes:
    digest: bytes = blake3.blake3(_framed(label) + content).digest()
    return digest
