"""Unit tests for ``neffcache.client.wrapper``: parsing compile command lines, the stock
address of SDK-named inputs, ``compile_flags.json``, and ``main``'s pass-through paths,
run in-process against a fake compiler that records each invocation."""

from __future__ import annotations

import gc
import json
import logging
import os
import stat
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from loopback import free_port
from support.client_units import CLEARED_ENV as _CLEARED
from support.client_units import TokenServer, closing_remotes, no_server_down

from neffcache.client import remote as remote_module
from neffcache.client.compile_call import flags_json, neuron_address_of, run_teeing
from neffcache.client.keys import context
from neffcache.client.wrapper import main, parse
from neffcache.keying import neuron_cache_flags

VERSION = "2.20.9961.0+0acef03a"
HLO_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hlo" / "block_a.pb"

# --- parse ----------------------------------------------------------------------------

MODERN = [
    "compile",
    "--target=trn1",
    "--framework=XLA",
    "/w/model.MODULE_1+abcdef01.hlo_module.pb",
    "--output",
    "/w/model.MODULE_1+abcdef01.neff",
    "--model-type=transformer",
    "-O1",
    "--verbose=35",
]
LEGACY = [
    "--target=trn1",
    "compile",
    "--framework",
    "XLA",
    "/w/model.MODULE_1+abcdef01.hlo.pb",
    "--output",
    "/w/model.MODULE_1+abcdef01.neff",
    "--model-type=transformer",
    "-O1",
    "--verbose=35",
]


def test_parse_the_modern_form() -> None:
    call = parse(MODERN)
    assert call is not None
    assert call.input == Path("/w/model.MODULE_1+abcdef01.hlo_module.pb")
    assert call.output == Path("/w/model.MODULE_1+abcdef01.neff")
    assert call.target == "trn1"
    assert call.argv == MODERN
    assert "/w/model.MODULE_1+abcdef01.hlo_module.pb" not in call.flags
    assert "--model-type=transformer" in call.flags


def test_parse_the_legacy_form() -> None:
    call = parse(LEGACY)
    assert call is not None
    assert call.input == Path("/w/model.MODULE_1+abcdef01.hlo.pb")
    assert call.output == Path("/w/model.MODULE_1+abcdef01.neff")
    assert call.target == "trn1"


def test_both_forms_key_alike() -> None:
    modern, legacy = parse(MODERN), parse(LEGACY)
    assert modern is not None
    assert legacy is not None
    a = context(VERSION, modern.target, modern.flags, {})
    b = context(VERSION, legacy.target, legacy.flags, {})
    assert a == b
    assert list(a.flags) == ["--model-type=transformer", "--optlevel=1"]


@pytest.mark.parametrize(
    "output", [["--output", "o.neff"], ["--output=o.neff"]], ids=["space", "equals"]
)
@pytest.mark.parametrize(
    "target", [["--target", "trn2"], ["--target=trn2"]], ids=["space", "equals"]
)
def test_parse_option_spellings(output: list[str], target: list[str]) -> None:
    call = parse(["compile", "--framework=XLA", "in.pb", *output, *target])
    assert call is not None
    assert call.output == Path("o.neff")
    assert call.target == "trn2"
    assert call.input == Path("in.pb")


def test_a_command_without_framework_is_not_keyed() -> None:
    """Every caller passes --framework; a compiler that requires it would refuse the
    command a hit would have served."""
    assert parse(["compile", "in.pb", "--output=o.neff", "--target=trn1"]) is None


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["compile", "--framework=XLA", "in.pb", "--output=o.neff"], id="no-target"),
        pytest.param(["compile", "--framework=XLA", "in.pb", "--target=trn1"], id="no-output"),
        pytest.param(["compile", "in.pb", "--target=trn1", "--output"], id="output-no-value"),
        pytest.param(
            ["compile", "a.pb", "b.pb", "--output=o.neff", "--target=trn1"], id="two-inputs"
        ),
        pytest.param(["compile", "--output=o.neff", "--target=trn1"], id="no-input"),
        pytest.param(["--version"], id="version"),
        pytest.param(["-V"], id="V"),
        pytest.param(["compile", "--help"], id="help"),
        pytest.param(
            ["compile", "--version", "in.pb", "--output=o.neff", "--target=trn1"],
            id="version-inside",
        ),
        pytest.param(
            ["compile", "--framework=TENSORFLOW", "in.pb", "--output=o", "--target=trn1"],
            id="tensorflow",
        ),
        pytest.param(
            ["compile", "--framework", "PYTORCH", "in.pb", "--output=o", "--target=trn1"],
            id="pytorch",
        ),
        pytest.param(["list-targets"], id="other-subcommand"),
        pytest.param([], id="empty"),
        pytest.param(
            ["compile", "in.pb", "--output=o.neff", "--output=p.neff", "--target=trn1"],
            id="two-outputs",
        ),
        pytest.param(
            ["compile", "compile", "in.pb", "--output=o.neff", "--target=trn1"], id="two-compile"
        ),
    ],
)
def test_parse_refuses(argv: list[str]) -> None:
    assert parse(argv) is None


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(
            ["compile", "--target=trn1", "--target=trn2", "in.pb", "--output=o.neff"],
            id="two-targets",
        ),
        pytest.param(
            ["compile", "in.pb", "--output=o.neff", "--target=trn2", "-O1", "-O2"],
            id="two-optlevels",
        ),
        pytest.param(
            ["compile", "in.pb", "--output=o", "--target=trn2", "--lnc", "1", "--lnc=2"],
            id="two-lnc-spellings",
        ),
        pytest.param(
            ["compile", "in.pb", "--output=o", "--target=trn2", "--enable-internal-neff-wrapper"],
            id="extra-outputs",
        ),
    ],
)
def test_parse_refuses_what_it_cannot_key(argv: list[str]) -> None:
    assert parse(argv, exists=lambda _: False) is None


TORCHNEURON = [
    "compile",
    "/tmp/neuron_compile_ab12cd/module.mlir",
    "--framework",
    "XLA",
    "--target",
    "trn2",
    "--lnc",
    "2",
    "-O2",
    "--model-type",
    "transformer",
    "--auto-cast=none",
    "--output",
    "/tmp/neuron_compile_ab12cd/module.neff",
]


def test_parse_a_torchneuron_call() -> None:
    call = parse(TORCHNEURON)
    assert call is not None
    assert call.input == Path("/tmp/neuron_compile_ab12cd/module.mlir")
    assert call.output == Path("/tmp/neuron_compile_ab12cd/module.neff")
    assert call.target == "trn2"
    assert call.logfile is None
    assert call.compiler_argv == TORCHNEURON
    ctx = context(VERSION, call.target, call.flags, {})
    assert list(ctx.flags) == [
        "--logical-nc-config=2",
        "--optlevel=2",
        "--model-type=transformer",
        "--auto-cast=none",
    ]


def test_parse_a_vllm_neuron_call() -> None:
    argv = [
        "compile",
        "/wd/graph.hlo",
        "--framework",
        "XLA",
        "--target",
        "trn2",
        "--output",
        "/wd/graph_0123.neff",
        "--logfile",
        "/wd/log-neuron-cc.txt",
    ]
    call = parse(argv)
    assert call is not None
    assert call.input == Path("/wd/graph.hlo")
    assert call.logfile == Path("/wd/log-neuron-cc.txt")
    assert list(context(VERSION, call.target, call.flags, {}).flags) == []


def test_parse_a_trace_call_with_a_folder_and_no_suffix() -> None:
    argv = ["compile", "/w/model", "--framework", "XLA", "--target", "trn1", "--output", "/w/g"]
    call = parse(argv)
    assert call is not None
    assert call.input == Path("/w/model")


def test_identical_repeats_and_verbose_repeats_are_one_call() -> None:
    argv = [*MODERN, "--verbose=35", "--verbose", "INFO", "--target", "trn1"]
    call = parse(argv)
    assert call is not None
    assert call.target == "trn1"
    one = context(VERSION, call.target, call.flags, {})
    assert one == context(VERSION, "trn1", parse(MODERN).flags, {})  # type: ignore[union-attr]


def test_libneuronxla_options_never_reach_the_compiler() -> None:
    url = "--cache_dir=neffcache+http://h:8787/ns"
    argv = [*TORCHNEURON, url, "--log_level", "INFO", "--no_cache", "--retry_failed_compilation"]
    call = parse(argv)
    assert call is not None
    assert call.compiler_argv == TORCHNEURON
    bare = parse(TORCHNEURON)
    assert bare is not None
    assert context(VERSION, "trn2", call.flags, {}) == context(VERSION, "trn2", bare.flags, {})


def test_an_unknown_option_naming_a_file_passes_the_call_through(tmp_path: Path) -> None:
    """The compiler may read a file an option it documents nowhere names: not keyable."""
    config = tmp_path / "tuning.json"
    config.write_text("{}")
    argv = ["compile", "in.pb", "--framework=XLA", "--output=o", "--target=trn2"]
    assert parse([*argv, "--internal-tuning", str(config)]) is None
    assert parse([*argv, f"--internal-tuning={config}"]) is None
    assert parse([*argv, "--internal-tuning", "fast"]) is not None
    # A switch before the input: the word after it could be either.
    switch = ["compile", "--unknown-switch", str(config), "--framework=XLA", "--output=o"]
    assert parse([*switch, "--target=t"]) is None


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(["--", "more"], id="double-dash"),
        pytest.param(["--out", "real.neff"], id="abbreviated-output"),
        pytest.param(["--verbose", "--disable-x"], id="option-as-value"),
        pytest.param(["--log_level", "--disable-x"], id="option-as-wrapper-value"),
        pytest.param(["--tensorizer-options", "--disable-x"], id="option-as-options-value"),
        pytest.param(["--internal-backend-options", "--enable-foo"], id="undocumented-options"),
        pytest.param(["--pipeline", "compile SaveTemps"], id="pipeline-spaced-word"),
        pytest.param(["--pipeline=compile SaveTemps"], id="pipeline-spaced-value"),
    ],
)
def test_commands_the_compiler_may_read_otherwise_are_not_keyed(extra: list[str]) -> None:
    base = ["compile", "in.pb", "--framework=XLA", "--output=o", "--target=trn2"]
    assert parse(base, exists=lambda _: False) is not None
    assert parse([*base, *extra], exists=lambda _: False) is None


def test_an_empty_input_word_is_not_the_working_directory() -> None:
    assert parse(["compile", "", "--framework=XLA", "--output=o", "--target=trn2"]) is None


def test_parse_a_space_separated_compiler_flag() -> None:
    argv = ["compile", "--framework=XLA", "in.pb", "--output", "o.neff", "--target=trn1"]
    call = parse([*argv, "--model-type", "transformer"])
    assert call is not None
    assert call.input == Path("in.pb")


# --- the stock address and compile_flags.json -----------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # md5(json.dumps(["--target=trn1", "--model-type=transformer"]))[:8],
        # docs/neuron-sdk.md#flags-hash
        ("model.MODULE_123+3cc9a3cb.hlo_module.pb", "MODULE_123+3cc9a3cb"),
        ("model.MODULE_123+3cc9a3cb.hlo.pb", "MODULE_123+3cc9a3cb"),
        (
            "model.MODULE_16518787498567201059+3cc9a3cb.hlo_module.pb",
            "MODULE_16518787498567201059+3cc9a3cb",
        ),
        ("model.MODULE_ab12CD+3cc9a3cb.hlo_module.pb", "MODULE_ab12CD+3cc9a3cb"),
        # The name's flags hash is not this call's flags': never claim the address.
        ("model.MODULE_123+abcdef01.hlo_module.pb", None),
        ("model.hlo_module.pb", None),
        ("in.pb", None),
        ("model.MODULE_123+3CC9A3CB.hlo_module.pb", None),  # the hash is lowercase hex
        ("model.MODULE_123+3cc9a3c.hlo_module.pb", None),
        ("model.MODULE_123.hlo_module.pb", None),
        ("xmodel.MODULE_123+3cc9a3cb.hlo_module.pb", None),
        ("model.MODULE_1-2+3cc9a3cb.hlo_module.pb", None),
    ],
)
def test_neuron_address_of(name: str, expected: str | None) -> None:
    argv = ["compile", "--framework=XLA", f"/tmp/workdir/uuid/{name}", "--output", "o.neff"]
    call = parse([*argv, "--target=trn1", "--model-type=transformer", "--verbose=35"])
    assert call is not None
    found = neuron_address_of(call, VERSION)
    assert found == (None if expected is None else f"neuronxcc-{VERSION}/{expected}")


@pytest.mark.parametrize(
    ("argv", "user"),
    [
        (MODERN, ["--model-type=transformer", "-O1"]),
        (LEGACY, ["--model-type=transformer", "-O1"]),
        (["compile", "--framework=XLA", "in.pb", "--output=o.neff", "--target=trn2"], []),
        (
            [
                *("compile", "in.pb", "--output", "o", "--target", "trn2", "--logfile", "/w/l"),
                *("--framework", "XLA"),
                *("--auto-cast=none", "--enable-saturate-infinity", "--verbose", "35"),
            ],
            # --logfile stays: the SDK hashes it as NxD passes it
            # (docs/neuron-sdk.md#flags-hashed-verbatim).
            ["--logfile", "/w/l", "--auto-cast=none", "--enable-saturate-infinity"],
        ),
    ],
)
def test_flags_json_is_the_stock_list(argv: list[str], user: list[str]) -> None:
    call = parse(argv)
    assert call is not None
    written = json.loads(flags_json(call))
    assert written == neuron_cache_flags(user, call.target)
    assert written == [f"--target={call.target}", *user]


# --- main: pass-through ---------------------------------------------------------------

_FAKE = """#!{python} -S
import json, os, sys
args = sys.argv[1:]
call = {{"argv": args, "in_wrapper": os.environ.get("NEFFCACHE_IN_WRAPPER")}}
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(call) + "\\n")
if args == ["--version"] and os.environ.get("FAKE_VERSION"):
    print("NeuronX Compiler version " + os.environ["FAKE_VERSION"])
else:
    print("fake stdout: " + " ".join(args))
print("fake stderr", file=sys.stderr)
if "--output" in args and os.environ.get("FAKE_WRITE"):
    with open(args[args.index("--output") + 1], "wb") as out:
        out.write(os.environ["FAKE_WRITE"].encode())
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


class Fake:
    def __init__(self, root: Path) -> None:
        self.dir = root / "fakebin"
        self.dir.mkdir()
        self.path = self.dir / "neuronx-cc"
        self.path.write_text(_FAKE.format(python=sys.executable))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)
        self.log = root / "fake.log"

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    compiler = Fake(tmp_path)
    monkeypatch.setenv("FAKE_LOG", str(compiler.log))
    monkeypatch.setenv("NEFFCACHE_LOCAL_DIR", str(tmp_path / "l1"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(remote_module, "_down_until", {})
    return compiler


def with_url(monkeypatch: pytest.MonkeyPatch, fake: Fake) -> None:
    """A neffcache URL (nothing listens there) and the fake as the real compiler."""
    monkeypatch.setenv("NEFFCACHE_URL", f"neffcache+http://127.0.0.1:{free_port()}/team-a")
    monkeypatch.setenv("NEFFCACHE_REAL_COMPILER", str(fake.path))
    monkeypatch.setenv("NEFFCACHE_CONNECT_TIMEOUT", "0.5")


@pytest.mark.parametrize("code", [0, 5])
def test_version_passes_through(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], code: int
) -> None:
    with_url(monkeypatch, fake)
    monkeypatch.setenv("FAKE_EXIT", str(code))
    assert main(["neuronx-cc", "--version"]) == code
    out, err = capfd.readouterr()
    assert out == "fake stdout: --version\n"
    assert "fake stderr" in err
    assert fake.calls() == [{"argv": ["--version"], "in_wrapper": "1"}]
    assert not (Path(os.environ["NEFFCACHE_LOCAL_DIR"])).exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["compile", "--framework=TENSORFLOW", "in.pb", "--output", "o", "--target=trn1"],
        ["compile", "a.pb", "b.pb", "--output", "o", "--target=trn1"],
        ["list-targets", "--json", "x y"],
        ["compile", "in.pb", "--output", "o.neff"],
    ],
)
def test_unparseable_argv_passes_through_untouched(
    fake: Fake,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    with_url(monkeypatch, fake)
    monkeypatch.setenv("FAKE_EXIT", "3")
    assert main(["neuronx-cc", *argv]) == 3
    out, _ = capfd.readouterr()
    assert out == "fake stdout: " + " ".join(argv) + "\n"
    assert [call["argv"] for call in fake.calls()] == [argv]  # never asked --version


def test_no_url_is_a_plain_pass_through(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(fake.dir))
    monkeypatch.setenv("FAKE_EXIT", "7")
    argv = ["compile", "--framework=XLA", str(tmp_path / "in.pb"), "--output", "o.neff"]
    argv += ["--target=trn1"]
    assert main(["neuronx-cc", *argv]) == 7
    assert [call["argv"] for call in fake.calls()] == [argv]
    assert capfd.readouterr().out == "fake stdout: " + " ".join(argv) + "\n"
    assert not (tmp_path / "l1").exists()


@pytest.mark.parametrize(
    "env",
    [{}, {"NEFFCACHE_URL": "neffcache+ftp://bad"}, {"NEFFCACHE_DISABLE": "1"}],
    ids=["no-url", "malformed-url", "disabled"],
)
def test_the_configured_compiler_is_used_without_a_cache(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    monkeypatch.setenv("NEFFCACHE_REAL_COMPILER", str(fake.path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["neuronx-cc", "--version"]) == 0
    assert len(fake.calls()) == 1


def test_in_wrapper_is_a_pass_through(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_url(monkeypatch, fake)
    monkeypatch.setenv("NEFFCACHE_IN_WRAPPER", "1")
    monkeypatch.setenv("FAKE_VERSION", VERSION)
    hlo = tmp_path / "in.pb"
    hlo.write_bytes(HLO_FIXTURE.read_bytes())
    argv = ["compile", "--framework=XLA", str(hlo), "--output", str(tmp_path / "o.neff")]
    argv += ["--target=trn1"]
    assert main(["neuronx-cc", *argv]) == 0
    assert [call["argv"] for call in fake.calls()] == [argv]  # no --version: no Session
    assert not (tmp_path / "l1").exists()


def test_no_command_is_a_usage_error(fake: Fake, capfd: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "neffcache wrap" in capfd.readouterr().err


def test_no_real_compiler_is_127(fake: Fake, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["neuronx-cc", "--version"]) == 127
    assert "NEFFCACHE_REAL_COMPILER" in capfd.readouterr().err
    assert fake.calls() == []


def test_server_down_compiles_once_and_records_a_miss(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_url(monkeypatch, fake)
    monkeypatch.setenv("FAKE_VERSION", VERSION)
    monkeypatch.setenv("FAKE_WRITE", "NEFF-BYTES")
    run_log = tmp_path / "run.jsonl"
    monkeypatch.setenv("NEFFCACHE_RUN_MANIFEST", str(run_log))
    hlo = tmp_path / "model.MODULE_42+e30acd3a.hlo_module.pb"
    hlo.write_bytes(HLO_FIXTURE.read_bytes())
    sdk_entry = (
        tmp_path / "l1" / f"neuronxcc-{VERSION}/MODULE_42+e30acd3a"
    )  # the SDK's entry vouches for the address
    sdk_entry.mkdir(parents=True)
    (sdk_entry / "model.hlo_module.pb").write_bytes(HLO_FIXTURE.read_bytes())
    output = tmp_path / "model.neff"
    argv = ["compile", "--framework=XLA", str(hlo), "--output", str(output), "--target=trn1"]
    assert main(["neuronx-cc", *argv]) == 0
    assert [call["argv"] for call in fake.calls()] == [["--version"], argv]
    assert output.read_bytes() == b"NEFF-BYTES"
    (line,) = [json.loads(x) for x in run_log.read_text().splitlines()]
    assert (line["via"], line["result"], line["source"]) == ("wrapper", "miss", "compiler")
    assert line["neuron_address"] == f"neuronxcc-{VERSION}/MODULE_42+e30acd3a"
    assert line["exit_code"] == 0
    assert line["bytes"] == len(b"NEFF-BYTES")
    # Kept in L1 for the next rank on this host, though the server was down.
    keys = list((tmp_path / "l1" / ".neffcache" / "keys").rglob("*.json"))
    assert len(keys) == 2  # by canonical and by direct key


def test_the_sdks_compiler_version_names_the_address_and_a_mismatch_warns_once(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """libneuronxla names entries with its interpreter's neuronxcc (the hook hands it
    down); the compiler on PATH may be another environment's."""
    with_url(monkeypatch, fake)
    sdk = "2.21.18209.0+043b1bf7"
    monkeypatch.setenv("FAKE_VERSION", VERSION)
    monkeypatch.setenv("FAKE_WRITE", "NEFF-BYTES")
    monkeypatch.setenv("NEFFCACHE_SDK_COMPILER_VERSION", sdk)
    run_log = tmp_path / "run.jsonl"
    monkeypatch.setenv("NEFFCACHE_RUN_MANIFEST", str(run_log))
    hlo = tmp_path / "model.MODULE_42+e30acd3a.hlo_module.pb"
    hlo.write_bytes(HLO_FIXTURE.read_bytes())
    sdk_entry = (
        tmp_path / "l1" / f"neuronxcc-{sdk}/MODULE_42+e30acd3a"
    )  # the SDK's entry vouches for the address
    sdk_entry.mkdir(parents=True)
    (sdk_entry / "model.hlo_module.pb").write_bytes(HLO_FIXTURE.read_bytes())
    argv = ["compile", "--framework=XLA", str(hlo), "--output", str(tmp_path / "o.neff")]
    argv += ["--target=trn1"]
    assert main(["neuronx-cc", *argv]) == 0
    assert main(["neuronx-cc", *argv]) == 0  # an L1 hit
    lines = [json.loads(x) for x in run_log.read_text().splitlines()]
    assert [line["neuron_address"] for line in lines] == [f"neuronxcc-{sdk}/MODULE_42+e30acd3a"] * 2
    assert {line["compiler_version"] for line in lines} == {VERSION}  # keys: what ran
    warnings = [r.message for r in caplog.records if "names its cache entries" in r.message]
    assert len(warnings) == 1, warnings  # once per host, not once per graph
    assert sdk in warnings[0]
    assert VERSION in warnings[0]


def test_a_failed_compile_keeps_its_exit_code(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_url(monkeypatch, fake)
    monkeypatch.setenv("FAKE_VERSION", VERSION)
    monkeypatch.setenv("FAKE_EXIT", "70")
    hlo = tmp_path / "in.pb"
    hlo.write_bytes(HLO_FIXTURE.read_bytes())
    argv = ["compile", "--framework=XLA", str(hlo), "--output", str(tmp_path / "o.neff")]
    argv += ["--target=trn1"]
    assert main(["neuronx-cc", *argv]) == 70
    assert [call["argv"] for call in fake.calls()] == [["--version"], argv]
    assert not (tmp_path / "l1" / ".neffcache" / "keys").exists()  # nothing to serve


@pytest.mark.parametrize(("token", "code"), [("other", "forbidden"), ("unknown", "unauthorized")])
def test_a_refused_token_is_each_misses_reason_and_asked_once_per_back_off(
    fake: Fake,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    token_server: TokenServer,
    token: str,
    code: str,
) -> None:
    monkeypatch.setenv("NEFFCACHE_URL", f"neffcache+{token_server.url}/team-a")
    monkeypatch.setenv("NEFFCACHE_TOKEN", token_server.tokens[token])
    monkeypatch.setenv("NEFFCACHE_REAL_COMPILER", str(fake.path))
    monkeypatch.setenv("NEFFCACHE_TELEMETRY", "0")
    monkeypatch.setenv("FAKE_VERSION", VERSION)
    monkeypatch.setenv("FAKE_WRITE", "NEFF-BYTES")
    run_log = tmp_path / "run.jsonl"
    monkeypatch.setenv("NEFFCACHE_RUN_MANIFEST", str(run_log))
    hlo = tmp_path / "in.pb"
    hlo.write_bytes(HLO_FIXTURE.read_bytes())
    start = len(token_server.requests)
    for target in ("trn1", "trn2"):  # two graphs, each a wrapper process of its own
        no_server_down(monkeypatch)  # a new process: what it knows is L1's mark
        argv = ["compile", "--framework=XLA", str(hlo), "--output", str(tmp_path / "o.neff")]
        with closing_remotes(monkeypatch):
            assert main(["neuronx-cc", *argv, f"--target={target}"]) == 0
    lines = [json.loads(x) for x in run_log.read_text().splitlines()]
    assert [(line["result"], line["reason"]) for line in lines] == [("miss", code)] * 2
    assert len(token_server.requests) == start + 1  # the first graph's first lookup
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1, said
    assert "team-a" in said[0]


def test_run_teeing_closes_the_stderr_pipe(fake: Fake, capfd: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, tail = run_teeing(str(fake.path), ["--version"])
        gc.collect()
    assert code == 0
    assert tail == "fake stderr\n"
    assert "fake stderr" in capfd.readouterr().err  # copied through as it came
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


@pytest.mark.e2e
def test_the_wrappers_modules_leave_argparse_unimported() -> None:
    # `neffcache wrap` runs once per graph and skips the parser (cli.main): argparse and
    # what it imports (gettext, locale) cost a hit several milliseconds.
    import subprocess
    import sys

    modules = [
        "neffcache.client.cli",
        "neffcache.client.wrapper",
        "neffcache.client.session",
        "neffcache.client.remote",
        "neffcache.client.telemetry",
        "neffcache.client.runlog",
    ]
    probe = f"import sys, {', '.join(modules)}; print('argparse' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
