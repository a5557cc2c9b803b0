"""neffcache.protocol on its own: the manifest validator, the patterns, the paths, the
lease words, and what importing it costs a process."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from neffcache import protocol
from neffcache.keying import KeyingError, parse_neuron_address
from neffcache.protocol import FileRef, Manifest, ManifestError, inline, parse, routes

KEY = "a" * 64
DIGEST = "b" * 64
ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb"


def manifest(**fields: Any) -> dict[str, Any]:
    return {"key": KEY, "files": {"model.neff": {"digest": DIGEST, "size": 10}}, **fields}


# --- the manifest ---------------------------------------------------------------------


def test_parse_reads_every_field() -> None:
    raw = manifest(
        direct_key="c" * 64,
        neuron_address=ADDRESS,
        components={"compiler_version": "2.20.9961.0+0acef03a"},
        compile_seconds=3,
        model="llama",
        host="node-1",
    )
    parsed = parse(raw)
    assert parsed.key == KEY
    assert parsed.files == {"model.neff": FileRef(DIGEST, 10)}
    assert parsed.direct_key == "c" * 64
    assert parsed.neuron_address == ADDRESS
    assert parsed.components == {"compiler_version": "2.20.9961.0+0acef03a"}
    assert parsed.compile_seconds == 3
    assert parsed.model == "llama"
    assert parsed.extra == {"host": "node-1"}
    assert parsed.aliases() == ("c" * 64, ADDRESS)


def test_optional_fields_default_to_none_and_empty() -> None:
    parsed = parse(manifest())
    assert (parsed.direct_key, parsed.neuron_address, parsed.compile_seconds, parsed.model) == (
        None,
        None,
        None,
        None,
    )
    assert parsed.components == {}
    assert parsed.extra == {}
    assert parsed.aliases() == ()


def test_to_dict_and_to_json_give_back_what_was_sent() -> None:
    raw = manifest(components={"b": [1, 2]}, compile_seconds=5, writer="tok", model="m")
    parsed = parse(raw)
    assert parsed.to_dict() == raw
    assert json.loads(parsed.to_json()) == raw
    text = parsed.to_json()
    assert text == json.dumps(raw, sort_keys=True, separators=(",", ":"))
    assert parse(json.loads(text)) == parsed
    assert '"compile_seconds":5,' in text  # an int stays an int


def test_nulls_are_left_out_of_to_dict() -> None:
    parsed = parse(manifest(direct_key=None, model=None))
    assert "direct_key" not in parsed.to_dict()
    assert "model" not in parsed.to_dict()


def test_a_manifest_is_frozen() -> None:
    parsed = parse(manifest())
    with pytest.raises(AttributeError, match="frozen"):
        parsed.key = "c" * 64  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen"):
        del parsed.model
    with pytest.raises(TypeError):
        parsed.files["other"] = FileRef(DIGEST, 1)  # type: ignore[index]
    ref = FileRef(DIGEST, 1)
    with pytest.raises(AttributeError):
        ref.size = 2  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(ref)) == ref
    assert hash(ref) == hash(FileRef(DIGEST, 1))
    assert ref != FileRef(DIGEST, 2)
    assert repr(ref) == f"FileRef(digest={DIGEST!r}, size=1)"


def test_a_manifest_is_matched_by_fields() -> None:
    match parse(manifest()):
        case Manifest(key, files):
            assert (key, list(files)) == (KEY, ["model.neff"])
        case _:
            pytest.fail("a Manifest did not match its own pattern")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([], "not a JSON object but list"),
        ({"files": {}}, "key missing"),
        (manifest(key="A" * 64), "key is not 64"),
        (manifest(direct_key="z"), "direct_key is not 64"),
        (manifest(neuron_address="neuronxcc-x/y"), "neuron_address is not a Neuron"),
        (manifest(components=None), "components is not a JSON object"),
        (manifest(compile_seconds=-1), "compile_seconds is not a number"),
        (manifest(model="a\nb"), "model is not 1 to 200"),
        ({"key": KEY, "files": []}, "files is not a non-empty object"),
        ({"key": KEY, "files": {"../x": {"digest": DIGEST, "size": 1}}}, "file name '../x'"),
        ({"key": KEY, "files": {"x": DIGEST}}, "file 'x' is not an object"),
        (
            {"key": KEY, "files": {"x": {"digest": "B" * 64, "size": 1}}},
            "file 'x': the digest is not 64",
        ),
        (
            {"key": KEY, "files": {"x": {"digest": DIGEST, "size": "1"}}},
            "file 'x': the size is not",
        ),
        ({"key": KEY, "files": {"x": {"digest": DIGEST, "size": 1, "z": 0}}}, "field(s) z"),
    ],
)
def test_a_bad_manifest_is_one_line_naming_the_field(raw: object, field: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse(raw)
    message = str(caught.value)
    assert field in message
    assert "\n" not in message
    assert isinstance(caught.value, ValueError)  # callers that caught ValueError still do


def test_a_hostile_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(ManifestError) as caught:
        parse(manifest(key="x\n" * 10_000))
    assert len(str(caught.value)) < 200
    assert "\n" not in str(caught.value)
    with pytest.raises(
        ManifestError, match="compile_seconds is not a number of seconds >= 0: a int"
    ):
        parse(manifest(compile_seconds=10**5000))


# --- patterns -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "good", "bad"),
    [
        (protocol.is_hex64, ["0" * 64, "f" * 64], ["F" * 64, "0" * 65, "0" * 64 + "\n", 64]),
        (
            protocol.is_namespace,
            ["team-a", "a", "a.b_c", "0" * 63],
            ["", "-a", "A", "a/b", "a" * 64],
        ),
        (protocol.is_file_name, ["model.neff", "a+b", "A" * 128], ["", ".lock", "..", "a/b"]),
        (protocol.is_neuron_address, [ADDRESS], ["neuronxcc-2/MODULE_1+0123abcd", ADDRESS + "x"]),
        (protocol.is_counter_name, ["hits_l1"], ["hits-l1", "", "x" * 65]),
        (
            protocol.is_alias,
            ["0" * 64, ADDRESS, "neuronxcc-2/MODULE_1+0123abcd"],
            ["0" * 63, "neuronxcc-2/graph", ADDRESS + "\n", "x/" + "0" * 64, None],
        ),
    ],
)
def test_patterns(check: Any, good: list[str], bad: list[object]) -> None:
    assert all(check(value) for value in good)
    assert not any(check(value) for value in bad)


def test_patterns_are_compiled_once() -> None:
    assert protocol.compiled(protocol.HEX64) is protocol.compiled(protocol.HEX64)
    assert protocol.matches(protocol.LEASE_ID, "0" * 32)
    assert not protocol.matches(protocol.LEASE_ID, None)


# --- paths and lease words ------------------------------------------------------------


def test_paths() -> None:
    assert routes.entry_path("team", KEY) == f"/v1/ns/team/entries/{KEY}"
    assert routes.blob_path(DIGEST) == f"/v1/blobs/{DIGEST}"
    assert routes.blob_mismatch_path(DIGEST) == f"/v1/blobs/{DIGEST}/mismatch"
    assert routes.failure_path("team", KEY) == f"/v1/ns/team/failures/{KEY}"
    assert routes.explain_path("team") == "/v1/ns/team/explain"


def test_an_address_is_quoted_in_a_path_with_its_slash_kept() -> None:
    quoted = "neuronxcc-2.20.9961.0%2B0acef03a/MODULE_16518787498567201059%2B3cc9a3cb"
    assert routes.alias_path("t", ADDRESS) == f"/v1/ns/t/aliases/{quoted}"
    assert routes.lease_path("t", ADDRESS) == f"/v1/ns/t/leases/{quoted}"


def test_lease_paths_cannot_gain_a_parameter_from_the_lease_id() -> None:
    lease = "0" * 32
    assert routes.lease_renew_path("t", KEY, lease) == f"/v1/ns/t/leases/{KEY}?lease={lease}"
    assert routes.lease_release_path("t", KEY, lease, "failed") == (
        f"/v1/ns/t/leases/{KEY}?lease={lease}&outcome=failed"
    )
    assert routes.lease_renew_path("t", KEY, "x&outcome=done").endswith("?lease=x%26outcome%3Ddone")


def test_lease_words() -> None:
    assert {"done", "granted", "held", "failed", "free"} == protocol.ANSWER_STATES
    assert {"done", "failed"} == protocol.LEASE_OUTCOMES
    assert protocol.is_answer_state("held")
    assert not protocol.is_answer_state("HELD")
    assert not protocol.is_answer_state(["held"])  # unhashable: no, not TypeError


# --- a file inline in a lookup's answer ----------------------------------------------


def test_an_inline_ask_reads_back_and_is_capped() -> None:
    assert inline.parse_asked(inline.asked("model.neff", 8 << 20)) == ("model.neff", 8 << 20)
    assert inline.parse_asked(" model.neff=10 ") == ("model.neff", 10)
    # However much is asked, a server inlines at most MAX_BYTES.
    assert inline.parse_asked("model.neff=999999999999") == ("model.neff", inline.MAX_BYTES)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "model.neff",
        "model.neff=",
        "=10",
        "../x=10",
        "model.neff=-1",
        "model.neff=1e3",
        "model.neff=1234567890123",
        "a/b=10",
        "model.neff=10;x",
    ],
)
def test_an_inline_ask_that_is_not_one_is_none(value: str) -> None:
    assert inline.parse_asked(value) is None


def test_an_inline_answer_splits_at_its_length() -> None:
    body = inline.prefix(b'{"a": 1}') + b'{"a": 1}NEFF'
    assert body.startswith(b"8\n")
    json_part, data = inline.split(body) or (b"", memoryview(b""))
    assert (json_part, bytes(data)) == (b'{"a": 1}', b"NEFF")
    json_part, data = inline.split(b"2\n{}") or (b"", memoryview(b"x"))
    assert (json_part, bytes(data)) == (b"{}", b"")


@pytest.mark.parametrize(
    "body",
    [b"", b"{}", b"9\n{}", b"-1\n{}", b"\n{}", b"x\n{}", b"1" * 13 + b"\n{}", b" 2\n{}"],
)
def test_an_inline_answer_without_a_length_that_fits_is_none(body: bytes) -> None:
    assert inline.split(body) is None


# --- the package ----------------------------------------------------------------------


def test_all_is_sorted_and_complete() -> None:
    exported = protocol.__all__
    order = sorted(exported, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    assert exported == order
    assert [name for name in exported if not hasattr(protocol, name)] == []
    public = {n for n, v in vars(protocol).items() if not n.startswith("_") and n != "annotations"}
    public -= {"counters", "inline", "manifest", "patterns", "routes", "states"}  # submodules
    assert sorted(public - set(exported)) == []


def test_typed() -> None:
    assert (Path(protocol.__file__).parent / "py.typed").is_file()


def test_import_loads_no_heavy_module() -> None:
    # The shim imports the protocol in every compiler process: it must not bring in
    # json, dataclasses (and inspect), urllib.parse or the counters' enum.
    script = (
        "import sys; before = set(sys.modules); import neffcache.protocol; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(done.stdout.split())
    assert "neffcache.protocol.manifest" in loaded
    heavy = {"json", "dataclasses", "inspect", "urllib.parse", "neffcache.protocol.counters"}
    assert loaded & heavy == set()


def _keying_takes(address: str) -> bool:
    try:
        parse_neuron_address(address)
    except KeyingError:
        return False
    return True


@pytest.mark.parametrize(
    "address",
    [
        ADDRESS,
        "neuronxcc-2.21.1.0.0+abc/MODULE_x+0123abcd",
        "neuronxcc-2.20/MODULE_1+0123abcd",  # no build
        "neuronxcc-2.20.1+ab/MODULE_1+0123ABCD",  # upper-case flags hash
        "neuronxcc-2.20.1+ab/MODULE_" + "1" * 129 + "+0123abcd",
        "neuronxcc-2.20.1+a/b/MODULE_1+0123abcd",
        "neuronxcc-2.20.1+ab/MODULE_1+0123abcd\n",
    ],
)
def test_the_address_pattern_is_keyings_parser(address: str) -> None:
    # keying parses addresses with its own pattern and version check; the protocol's
    # one pattern must agree with both.
    assert protocol.is_neuron_address(address) == _keying_takes(address)
