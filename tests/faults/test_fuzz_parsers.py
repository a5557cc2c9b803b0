"""The parser half of the fuzzing: hypothesis throws random and mutated
bytes at the parsers that read what clients send.

Nothing lost: every parser answers only with its documented clean error, never another
exception and never a hang, so a hostile or broken input costs one refused request (or
one local compile), never a server error or a stuck client:

* ``fingerprint_hlo`` and ``graph_summary`` (keying): a fingerprint, or ``KeyingError``;
* the manifest, failure-report, telemetry-batch and explain-request parsers (server): a
  parsed value, or ``BadRequest`` (``TooLarge`` for a failure record over its cap);

and whatever a server parser accepts is stored and answered in the shape the OpenAPI
schema declares (api/answers.py), so that no accepted input turns into a malformed
answer later.

Inputs: fixture HLO modules (tests/fixtures/hlo) and valid documents, mutated at the
byte level (bit flips, truncation, insertions, splices of another input), at the
protobuf wire level (fields dropped, duplicated, renumbered, retyped, given extreme
values or garbage payloads, at any depth), at the HLO level (ids, operands, called
computations, roots and the entry pointed anywhere: other ids, sentinels, negatives,
cycles), and at the JSON level (fields removed, replaced by any JSON value, added,
nested deeply); plus random bytes. Derandomized, bounded example counts; a deadline of
10 s per example catches a hang (each takes milliseconds).

tests/keying/test_robustness.py already covers byte-level mutations of the fixtures
with 300 random examples; this file adds the structural mutations and the server side.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from hlo_edit import parse as parse_module
from hlo_edit import varint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neffcache.keying import KeyingError, fingerprint_hlo, graph_summary
from neffcache.server.api.answers import ENTRY, FAILURE
from neffcache.server.errors import BadRequest, ServerError, TooLarge
from neffcache.server.explain.request import parse_request
from neffcache.server.failure import failure_record, parse_failure
from neffcache.server.manifest import parse_manifest
from neffcache.server.telemetry.schema import parse_events

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hlo"
SEEDS = [path.read_bytes() for path in sorted(FIXTURES.glob("*.pb"))]

FUZZ = settings(
    max_examples=400,
    deadline=timedelta(seconds=10),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- keying ------------------------------------------------------------------------------


def keyed(data: bytes) -> str | None:
    """The fingerprint, or None for a KeyingError; any other exception fails the test.
    ``graph_summary`` reads the same bytes: a summary or a KeyingError too (it reads
    other fields, so either may refuse a module the other reads: found by this test,
    and harmless, as every caller of either takes a KeyingError as "no answer")."""
    with contextlib.suppress(KeyingError):
        summary = graph_summary(data)
        assert summary.instructions >= 1
    try:
        digest = fingerprint_hlo(data)
    except KeyingError as exc:
        message = str(exc)
        digest = None
    if digest is None:
        assert message.startswith(("not an HLO module", "expected the bytes")), message
        return None
    assert len(digest) == 64
    assert fingerprint_hlo(data) == digest  # the same bytes, the same answer
    return digest


@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes_give_a_fingerprint_or_a_keying_error(data: bytes) -> None:
    keyed(data)


@st.composite
def byte_mutated(draw: st.DrawFn) -> bytes:
    """A fixture with a bit flipped, cut short, or spliced with another fixture."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    kind = draw(st.sampled_from(["bit", "truncate", "splice", "duplicate", "zero"]))
    at = draw(st.integers(0, len(data) - 1))
    if kind == "bit":
        data[at] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        del data[at:]
    elif kind == "splice":  # this one's head, another's tail
        other = draw(st.sampled_from(SEEDS))
        data[at:] = other[draw(st.integers(0, len(other) - 1)) :]
    elif kind == "duplicate":
        end = draw(st.integers(at, min(len(data), at + 64)))
        data[at:at] = data[at:end]
    else:
        data[at : at + draw(st.integers(1, 16))] = bytes(16)
    return bytes(data)


@FUZZ
@given(data=byte_mutated())
def test_byte_mutated_modules_give_a_fingerprint_or_a_keying_error(data: bytes) -> None:
    keyed(data)


# A minimal protobuf wire codec: mutations that keep the framing valid reach deeper
# than byte noise, which the framing check refuses at once.

Field = tuple[int, int, Any]  # (number, wire type, int or bytes)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("bad varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def decode(data: bytes) -> list[Field] | None:
    """The fields of a message, or None when the bytes are not one (groups included)."""
    out: list[Field] = []
    at = 0
    try:
        while at < len(data):
            tag, at = _varint(data, at)
            number, wire = tag >> 3, tag & 7
            if number == 0:
                return None
            if wire == 0:
                value, at = _varint(data, at)
                out.append((number, 0, value))
            elif wire in (1, 5):
                size = 8 if wire == 1 else 4
                if at + size > len(data):
                    return None
                out.append((number, wire, data[at : at + size]))
                at += size
            elif wire == 2:
                size, at = _varint(data, at)
                if at + size > len(data):
                    return None
                out.append((number, 2, data[at : at + size]))
                at += size
            else:
                return None
    except ValueError:
        return None
    return out


def encode(fields: list[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += varint(number << 3 | wire)
        if wire == 0:
            out += varint(value)
        elif wire == 2:
            out += varint(len(value)) + value
        else:
            out += value
    return bytes(out)


EXTREMES = [0, 1, 2, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64 - 2, 2**64 - 3]


@st.composite
def wire_mutated(draw: st.DrawFn, message: bytes | None = None, depth: int = 0) -> bytes:
    """A message with one field mutated, at this level or inside a nested message."""
    data = message if message is not None else draw(st.sampled_from(SEEDS))
    fields = decode(data)
    if not fields:
        return data + draw(st.binary(min_size=1, max_size=8))
    i = draw(st.integers(0, len(fields) - 1))
    number, wire, value = fields[i]
    nested = decode(value) if wire == 2 and depth < 6 else None
    if nested and draw(st.integers(0, 3)):  # mostly deeper: instructions live at depth 2
        fields[i] = (number, 2, draw(wire_mutated(value, depth + 1)))
        return encode(fields)
    kind = draw(
        st.sampled_from(["drop", "duplicate", "move", "renumber", "retype", "value", "garbage"])
    )
    if kind == "drop":
        del fields[i]
    elif kind == "duplicate":
        fields.insert(draw(st.integers(0, len(fields))), fields[i])
    elif kind == "move":
        fields.insert(draw(st.integers(0, len(fields))), fields.pop(i))
    elif kind == "renumber":
        fields[i] = (
            draw(st.sampled_from([1, 2, 3, 5, 6, 7, 35, 36, 38, 68, 2**29 - 1])),
            wire,
            value,
        )
    elif kind == "retype":
        fields[i] = (number, 0, draw(st.sampled_from(EXTREMES))) if wire == 2 else (number, 2, b"")
    elif kind == "value" and wire == 0:
        fields[i] = (number, 0, draw(st.sampled_from(EXTREMES)))
    else:
        fields[i] = (number, 2, draw(st.binary(max_size=24)))
    return encode(fields)


@FUZZ
@given(data=wire_mutated())
def test_wire_mutated_modules_give_a_fingerprint_or_a_keying_error(data: bytes) -> None:
    keyed(data)


# Ids an HLO-level mutation points things at: the sentinels the canonical form uses
# inside (-1, -2), negatives, zero (proto3's absent), extremes.
ODD_IDS = [0, -1, -2, -3, 2**62, 2**63 - 1, -(2**63)]


@st.composite
def hlo_mutated(draw: st.DrawFn) -> bytes:
    """A fixture module with its ids, operands, calls, roots or entry rewired."""
    module = parse_module(draw(st.sampled_from(SEEDS)))
    comps = list(module.computations)
    instructions = [inst for comp in comps for inst in comp.instructions]
    ids = [inst.id for inst in instructions] + [comp.id for comp in comps]
    target = st.one_of(st.sampled_from(ids), st.sampled_from(ODD_IDS))
    for _ in range(draw(st.integers(1, 3))):
        comp = draw(st.sampled_from(comps))
        kind = draw(
            st.sampled_from(
                ["id", "operand", "call", "pred", "root", "comp_id", "entry", "drop", "copy"]
            )
        )
        inst = draw(st.sampled_from(list(comp.instructions))) if comp.instructions else None
        if kind == "id" and inst is not None:
            inst.id = draw(target)
        elif kind == "operand" and inst is not None:
            inst.operand_ids.append(draw(target))
        elif kind == "call" and inst is not None:  # self-calls and cycles included
            inst.called_computation_ids.append(draw(target))
        elif kind == "pred" and inst is not None:
            inst.control_predecessor_ids.append(draw(target))
        elif kind == "root":
            comp.root_id = draw(target)
        elif kind == "comp_id":
            comp.id = draw(target)
        elif kind == "entry":
            module.entry_computation_id = draw(target)
        elif kind == "drop" and inst is not None:
            comp.instructions.remove(inst)
        elif kind == "copy":
            module.computations.add().CopyFrom(comp)
    result: bytes = module.SerializeToString()
    return result


@FUZZ
@given(data=hlo_mutated())
def test_rewired_modules_give_a_fingerprint_or_a_keying_error(data: bytes) -> None:
    keyed(data)


def test_the_fixtures_themselves_are_keyed() -> None:
    """The mutations start from modules that fingerprint (else they test nothing)."""
    assert all(keyed(seed) is not None for seed in SEEDS)


# --- server: JSON documents ------------------------------------------------------------

KEY = "a" * 64
DIGEST = "b" * 64
ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"
COMPILER = "2.20.9961.0+0acef03a"
MANIFEST: dict[str, Any] = {
    "key": KEY,
    "direct_key": "d" * 64,
    "neuron_address": ADDRESS,
    "components": {
        "fingerprint": "f" * 64,
        "compiler_version": COMPILER,
        "target": "trn2",
        "flags": ["--model-type=transformer"],
        "env": {},
    },
    "files": {
        "model.neff": {"digest": DIGEST, "size": 1572864},
        "model.hlo_module.pb": {"digest": "c" * 64, "size": 560128},
    },
    "compile_seconds": 812.4,
    "model": "llama-70b",
}
REPORT: dict[str, Any] = {
    "compiler_version": COMPILER,
    "neuron_address": ADDRESS,
    "direct_key": "d" * 64,
    "components": {"compiler_version": COMPILER, "target": "trn2"},
    "exit_code": 70,
    "compile_seconds": 3.5,
    "log": "ERROR: NCC_EVRF001 \x1b[31mred\x1b[0m",
    "host": "trn2-node-17",
    "job_id": "slurm-4411",
}
EVENTS: dict[str, Any] = {
    "events": [
        {
            "kind": "graph",
            "namespace": "team-a",
            "key": KEY,
            "result": "miss",
            "reason": "new-graph",
            "compile_seconds": 12.0,
            "components": {
                "compiler_version": COMPILER,
                "graph": {"structure": "e" * 64, "instructions": 2, "shapes": ["a f32[2]"] * 2},
            },
        },
        {"kind": "counters", "namespace": "team-a", "counts": {"lookups": 3}},
    ]
}
EXPLAIN: dict[str, Any] = {
    "key": KEY,
    "components": {"compiler_version": COMPILER, "target": "trn2", "flags": ["-O2"], "env": {}},
    "graph": {"structure": "e" * 64, "instructions": 1, "shapes": ["parameter f32[8]"]},
    "model": "llama",
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Numbers no JSON reader agrees on, spelled as they reach the server.
ODD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-0", "1" * 5000, "0.1e-400", "1E+2"]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def json_mutated(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    """``valid`` with a few of its values removed, replaced or joined by others, then
    written out, sometimes with an odd number or a deep nest spliced in as text."""
    doc = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            doc = draw(st.sampled_from([doc, [doc], "x", None]))
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        kind = draw(st.sampled_from(["remove", "replace", "add", "retype"]))
        if kind == "remove":
            del parent[last]
        elif kind == "replace":
            parent[last] = draw(json_values)
        elif kind == "add" and isinstance(parent, dict):
            name = draw(st.sampled_from(["created_at", "writer", "namespace", "key", "extra"]))
            parent[name] = draw(json_values)
        else:
            old = parent[last]
            parent[last] = str(old) if not isinstance(old, str) else draw(st.integers())
    text = json.dumps(doc, allow_nan=True)
    splice = draw(st.sampled_from(["", "odd", "deep", "surrogate"]))
    if splice == "odd" and "0" in text:
        text = text.replace("0", draw(st.sampled_from(ODD_NUMBERS)), 1)
    elif splice == "deep" and text.startswith("{") and len(text) > 2:
        depth = draw(st.integers(100, 3000))  # around the decoder's recursion limit
        text = '{"deep": ' + "[" * depth + "]" * depth + ", " + text[1:]
    elif splice == "surrogate" and ': "' in text:  # a lone surrogate: JSON, not text
        text = text.replace(': "', ': "\\ud800', 1)
    encoded = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-16", "utf-32"]))
    return text.encode(encoded, "surrogatepass")


@st.composite
def bytes_mutated(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    data = bytearray(json.dumps(valid).encode())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["bit", "truncate", "insert", "delete"]))
        if kind == "bit":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[at : at + draw(st.integers(1, 4))]
        if not data:
            break
    return bytes(data)


def documents(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    # Mostly JSON-level: byte noise is refused by the JSON decoder, which is not ours.
    kinds = [json_mutated(valid)] * 3 + [bytes_mutated(valid), st.binary(max_size=256)]
    return st.sampled_from(kinds).flatmap(lambda kind: kind)


def refused_cleanly(parse: Callable[[], Any], allowed: tuple[type[ServerError], ...]) -> Any:
    """What ``parse`` returns, or None when it refuses with one of ``allowed``."""
    try:
        return parse()
    except allowed as exc:
        message = str(exc)
    assert message, "an error says what is wrong"
    return None


def conforms(schema: dict[str, Any], value: Any) -> None:
    errors = [e.message for e in jsonschema_rs.validator_for(schema).iter_errors(value)]
    assert not errors, errors


@FUZZ
@given(body=documents(MANIFEST))
def test_mutated_manifests_parse_or_are_bad_requests(body: bytes) -> None:
    parsed = refused_cleanly(lambda: parse_manifest(body, KEY), (BadRequest,))
    if parsed is None:
        return
    manifest, canonical = parsed
    # What is stored is what GET answers (plus the stamps): it must fit the schema.
    stored = json.loads(canonical)
    conforms(ENTRY, {**stored, "created_at": 1.0, "namespace": "team-a", "writer": "w"})
    assert sum(ref.size for ref in manifest.files.values()) >= 0


@FUZZ
@given(body=documents(REPORT))
def test_mutated_failure_reports_parse_or_are_bad_requests(body: bytes) -> None:
    def record() -> str:
        report = parse_failure(body)
        return failure_record(report, namespace="team-a", key=KEY, created_at=1.0, writer="w")

    stored = refused_cleanly(record, (BadRequest, TooLarge))
    if stored is not None:
        conforms(FAILURE, json.loads(stored))


@FUZZ
@given(body=documents(EVENTS))
def test_mutated_event_batches_parse_or_are_bad_requests(body: bytes) -> None:
    events = refused_cleanly(lambda: parse_events(body), (BadRequest,))
    for event in events or ():
        assert event.namespace
        for value in event.model_dump().values():
            assert not (isinstance(value, float) and not math.isfinite(value))


@FUZZ
@given(body=documents(EXPLAIN))
def test_mutated_explain_requests_parse_or_are_bad_requests(body: bytes) -> None:
    refused_cleanly(lambda: parse_request("team-a", body), (BadRequest,))


VALID: dict[str, tuple[dict[str, Any], Callable[[bytes], Any]]] = {
    "manifest": (MANIFEST, lambda body: parse_manifest(body, KEY)),
    "report": (REPORT, parse_failure),
    "events": (EVENTS, parse_events),
    "explain": (EXPLAIN, lambda body: parse_request("team-a", body)),
}


@pytest.mark.parametrize("name", list(VALID))
def test_the_valid_documents_themselves_parse(name: str) -> None:
    """The mutations start from documents the parsers accept (else they test little)."""
    valid, parse = VALID[name]
    assert parse(json.dumps(valid).encode()) is not None


# Inputs at the edges, every time (the fuzzing above reaches them only by chance).
EDGES = [
    b"",
    b"null",
    b"[]",
    b"{}",
    b'"text"',
    b"NaN",
    b"1e400",
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
    "{}".encode("utf-16"),
    b"\x00" * 8,
    b"{" * 100_000,
    b"[" * 5000 + b"]" * 5000,
    b'{"a": ' + b"1" * 5000 + b"}",  # more digits than Python reads as an int
    b'{"\\ud800": "\\udfff"}',  # lone surrogates: JSON, not text
    b'{"key": 1, "key": 2}',
]


@pytest.mark.parametrize("edge", EDGES, ids=range(len(EDGES)))
@pytest.mark.parametrize("name", list(VALID))
def test_edge_inputs_parse_or_are_bad_requests(name: str, edge: bytes) -> None:
    _, parse = VALID[name]
    refused_cleanly(lambda: parse(edge), (BadRequest,))
