"""fingerprint_mlir on hostile input: only KeyingError, in bounded time and memory."""

from __future__ import annotations

import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neffcache.keying import KeyingError, fingerprint_mlir
from neffcache.keying._mlir_reader import MAGIC, encode_varint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mlir"
NAMES = ("block_a", "calls_a", "zoo", "dense_constant", "block_a_full_tracebacks", "vhlo_block")
SEEDS = [(FIXTURES / f"{name}.mlirbc").read_bytes() for name in NAMES]
MESSAGES = ("malformed MLIR bytecode", "not MLIR bytecode", "unsupported MLIR bytecode")
# Each example reads a few KiB in milliseconds; the deadline bounds it generously so
# that a loaded machine does not make the test flaky, while a blow-up still fails.
DEADLINE = timedelta(seconds=5)


def keying_error_or_digest(data: bytes) -> str | None:
    """The fingerprint, or None for a KeyingError; anything else fails the test."""
    message = ""
    try:
        digest = fingerprint_mlir(data)
    except KeyingError as exc:
        message = str(exc)
    if message:
        assert message.startswith(MESSAGES), message
        return None
    assert len(digest) == 64
    return digest


@pytest.mark.parametrize("name", ["block_a", "calls_a", "block_a_stripped"])
def test_every_truncation_is_a_keying_error(name: str) -> None:
    data = (FIXTURES / f"{name}.mlirbc").read_bytes()
    for cut in range(len(data)):
        with pytest.raises(KeyingError):
            fingerprint_mlir(data[:cut])


@settings(
    max_examples=200,
    deadline=DEADLINE,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.sampled_from(SEEDS), data=st.data())
def test_truncations_of_larger_fixtures(seed: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(seed) - 1))
    with pytest.raises(KeyingError):
        fingerprint_mlir(seed[:cut])


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "splice"]))
        if kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[at:]
        else:  # a run of another fixture's bytes: well-formed pieces in the wrong place
            other = draw(st.sampled_from(SEEDS))
            start = draw(st.integers(0, len(other) - 1))
            data[at:at] = other[start : start + draw(st.integers(1, 32))]
        if not data:
            break
    return bytes(data)


@settings(
    max_examples=400,
    deadline=DEADLINE,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=mutated())
def test_mutated_bytecode_gives_a_fingerprint_or_a_keying_error(data: bytes) -> None:
    digest = keying_error_or_digest(data)
    if digest is not None:
        assert fingerprint_mlir(data) == digest


@settings(max_examples=200, deadline=DEADLINE)
@given(tail=st.binary(max_size=64))
def test_random_bytes_after_the_magic(tail: bytes) -> None:
    keying_error_or_digest(MAGIC + tail)


# --- synthetic files ------------------------------------------------------------------


def section(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + encode_varint(len(body)) + body


def synthetic(
    attrs: list[bytes],
    ir: bytes,
    strings: tuple[bytes, ...] = (b"builtin", b"module", b"a"),
    string_section: bytes | None = None,
) -> bytes:
    """Version 6 bytecode with the builtin dialect, one operation name
    (builtin.module, number 0), these builtin attribute entries and this IR."""
    if string_section is None:
        sizes = b"".join(encode_varint(len(s) + 1) for s in reversed(strings))
        string_section = (
            encode_varint(len(strings)) + sizes + b"".join(s + b"\x00" for s in strings)
        )
    dialects = encode_varint(1) + encode_varint(0 << 1) + encode_varint(1)
    dialects += encode_varint(0) + encode_varint(1) + encode_varint(1 << 1 | 1)
    offsets = encode_varint(len(attrs)) + encode_varint(0) + encode_varint(0)
    offsets += encode_varint(len(attrs)) + b"".join(encode_varint(len(a) << 1 | 1) for a in attrs)
    return (
        MAGIC
        + encode_varint(6)
        + b"test\x00"
        + section(0, string_section)
        + section(1, dialects)
        + section(2, b"".join(attrs))
        + section(3, offsets)
        + section(4, ir)
        + section(8, b"")
    )


UNKNOWN_LOC = b"\x1f"  # builtin UnknownLoc, attribute 0 below
STRING_A = b"\x05" + encode_varint(2)  # builtin StringAttr "a", attribute 1
DICT_A = b"\x03" + encode_varint(1) + encode_varint(1) + encode_varint(3)  # {a = attr 3}
HEAD = [UNKNOWN_LOC, STRING_A, DICT_A]  # then attribute 3 and on


def array(*refs: int) -> bytes:
    """A builtin ArrayAttr of these attribute numbers."""
    return b"\x01" + encode_varint(len(refs)) + b"".join(map(encode_varint, refs))


def module_with_dict(dict_attr: int) -> bytes:
    """The IR: a top-level builtin.module with location 0 and a dictionary."""
    one_op, name, mask, location = encode_varint(1 << 1), encode_varint(0), b"\x01", b"\x01"
    return one_op + name + mask + location + encode_varint(dict_attr)


def test_the_synthetic_builder_makes_readable_bytecode() -> None:
    assert len(fingerprint_mlir(synthetic([*HEAD, array()], module_with_dict(2)))) == 64


def test_deeply_nested_attributes_need_no_recursion() -> None:
    depth = 30_000
    attrs = [*HEAD, *(array(4 + k) for k in range(depth)), array()]
    start = time.perf_counter()
    assert len(fingerprint_mlir(synthetic(attrs, module_with_dict(2)))) == 64
    assert time.perf_counter() - start < 30


def test_a_cycle_of_attributes_is_a_keying_error() -> None:
    attrs = [*HEAD, array(4), array(3)]
    with pytest.raises(KeyingError, match="refers to itself"):
        fingerprint_mlir(synthetic(attrs, module_with_dict(2)))


def test_deeply_nested_regions_need_no_recursion() -> None:
    depth = 100_000
    # Each level: builtin.module, mask "has regions", location 0, one region (not
    # isolated) of one block holding the next level.
    level = encode_varint(0) + b"\x10" + encode_varint(0) + encode_varint(1 << 1)
    level += encode_varint(1) + encode_varint(0) + encode_varint(1 << 1)
    ir = encode_varint(1 << 1) + level * depth
    ir = ir[: -len(encode_varint(1 << 1))] + encode_varint(0)  # the innermost block is empty
    start = time.perf_counter()
    assert len(fingerprint_mlir(synthetic([UNKNOWN_LOC], ir))) == 64
    assert time.perf_counter() - start < 30


HUGE = 2**55


@pytest.mark.parametrize(
    "data",
    [
        # A section claiming 2**55 bytes.
        MAGIC + encode_varint(6) + b"x\x00" + b"\x00" + encode_varint(HUGE),
        # A string table claiming 2**55 strings.
        synthetic([UNKNOWN_LOC], b"\x01", string_section=encode_varint(HUGE)),
        # A top-level block claiming 2**55 operations.
        synthetic([UNKNOWN_LOC], encode_varint(HUGE << 1)),
        # An operation claiming 2**55 operands.
        synthetic([UNKNOWN_LOC], encode_varint(1 << 1) + b"\x01\x04\x01" + encode_varint(HUGE)),
        # An array attribute claiming 2**55 elements.
        synthetic(
            [*HEAD, b"\x01" + encode_varint(HUGE)],
            module_with_dict(2),
        ),
        # A region claiming 2**55 blocks.
        synthetic(
            [UNKNOWN_LOC],
            encode_varint(1 << 1) + b"\x01\x10\x01" + encode_varint(1 << 1) + encode_varint(HUGE),
        ),
    ],
    ids=["section", "strings", "operations", "operands", "array", "blocks"],
)
def test_a_huge_claimed_length_allocates_nothing(data: bytes) -> None:
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(KeyingError):
            fingerprint_mlir(data)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 30  # only far from milliseconds: a loop over the claim never ends
    assert peak < 4 * 2**20
