"""How the shim reads a compile command line (wrapper.parse, keying's
normalize_flags, wrapper.without_wrapper_options).

Each test states a boundary the shim must keep (no false hit; never fail or hang a
job) and checks it end to end or at the unit that decides it.

How a false hit is shown end to end: host 1 runs a *prime* command through the shim
(a miss: the compiler runs, the NEFF is published under the command's key), host 2
(its own L1 and working directory, same server) runs a *probe* command through the
shim, and the probe's outcome (exit code, the files it names) is compared with what the
compiler alone makes of the probe in a working directory laid out the same way. Two
oracles stand in for the real compiler:

* tests/standins/neuronx-cc, the repository's stand-in: its NEFF is a function of the
  input bytes, the target and every flag token in order (``--x=v`` and ``--x v`` the
  same); it accepts options it does not know.
* tests/shim_boundaries/argparse_cc.py: the documented ``compile`` options declared with
  ``argparse`` and its defaults (unknown options, ``--opt -x``, a missing
  ``--framework`` are usage errors; ``--out`` abbreviates ``--output``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from shim_boundaries.support import (
    ARGPARSE_CC,
    COMPILER,
    Host,
    argparse_compiler,
    hosts,
    put_hlo,
    reference,
    same_outcome,
)
from support.e2e import BLOCK_A, Sandbox, Server

# What every command below starts with: the vLLM/trace shape, options as separate words.
BASE = [
    "compile",
    "in.pb",
    "--framework",
    "XLA",
    "--target",
    "trn1",
    "--output",
    "out.neff",
    "--model-type=transformer",
]


def _prime_then_probe(
    server: Server,
    sandbox: Sandbox,
    prime: Sequence[str],
    probe: Sequence[str],
    *,
    names: Sequence[str] = ("out.neff",),
    argparse: bool = False,
) -> tuple[bool, str, Host]:
    """Prime host 1 with ``prime``; run ``probe`` on host 2 and by the compiler alone.
    (whether the probe's outcome is the compiler's, a description, host 2)."""
    extra = {}
    oracle = COMPILER
    if argparse:
        extra["NEFFCACHE_REAL_COMPILER"] = str(argparse_compiler(sandbox))
        oracle = ARGPARSE_CC
    h1, h2 = hosts(server, sandbox, 2, **extra)
    layout = put_hlo(BLOCK_A)
    first = h1.shim(prime, h1.cwd(layout))
    assert first.returncode == 0, first.describe()
    cwd = h2.cwd(layout)
    probed = h2.shim(probe, cwd)
    ref_cwd = sandbox.new_dir("reference-cwd")
    layout(ref_cwd)
    alone = reference(sandbox, probe, ref_cwd, compiler=oracle)
    ok, text = same_outcome((probed, cwd), (alone, ref_cwd), names)
    record = h2.last() or {}
    text += (
        f"\nprime: {list(prime)}\nprobe: {list(probe)}\n"
        f"host 2's record: result={record.get('result')} source={record.get('source')} "
        f"fallback={record.get('fallback')}"
    )
    return ok, text, h2


# --- tokens the compiler sees that the key does not hold ----------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("odd", "plain"),
    [
        pytest.param(["--", "extra"], [], id="separator-then-word"),
        pytest.param(
            ["--", "--enable-saturate-infinity"],
            ["--enable-saturate-infinity"],
            id="separator-then-option",
        ),
        pytest.param(
            ["--enable-saturate-infinity", "--", "--enable-saturate-infinity"],
            ["--enable-saturate-infinity"],
            id="identical-repeat-collapsed-across-a-separator",
        ),
    ],
)
def test_double_dash_and_what_follows_it_are_not_in_the_key(
    server: Server, sandbox: Sandbox, odd: list[str], plain: list[str]
) -> None:
    """``--`` is read by parse() as an unknown option that takes the next word,
    but normalize_flags() skips ``--`` and drops the bare word after it, so
    ``... -- extra`` has the key of ``...``. The compiler does see them (argparse: a
    second positional after ``--``, a usage error; the stand-in: a flag with a value,
    another NEFF). Primed with the odd command (the stand-in compiles it), the key of
    the plain command is poisoned: every host asking for the plain command gets the
    odd command's NEFF."""
    ok, text, _ = _prime_then_probe(server, sandbox, [*BASE, *odd], [*BASE, *plain])
    assert ok, "false hit: the plain command got the NEFF of another command line\n" + text


@pytest.mark.e2e
def test_value_after_a_valueless_wrapper_option_is_dropped_from_the_key_only(
    server: Server, sandbox: Sandbox
) -> None:
    """``--log_level --disable-mixed-precision-accumulation`` (a libneuronxla
    option without its value, as TorchNeuron copies NEURON_CC_FLAGS tokens): for the
    key, normalize_flags() takes the next token as ``--log_level``'s value and drops
    both; without_wrapper_options() keeps any token starting with ``-``, so the
    compiler is run WITH ``--disable-mixed-precision-accumulation``. The NEFF compiled
    with mixed-precision accumulation disabled is published under the key of the plain
    command (and a plain command primed first is served to this one)."""
    odd = [*BASE, "--log_level", "--disable-mixed-precision-accumulation"]
    ok, text, _ = _prime_then_probe(server, sandbox, odd, BASE)
    assert ok, "false hit: the key does not hold an option the compiler was given\n" + text


@pytest.mark.e2e
def test_options_suffix_takes_a_dash_value_in_the_key_but_not_in_parse(
    server: Server, sandbox: Sandbox
) -> None:
    """``--internal-backend-options --enable-foo``: parse() reads two switches
    (``--internal-backend-options`` is not documented to it), normalize_flags() reads
    one option with the value ``--enable-foo`` (its ``...-options`` rule), the key of
    ``--internal-backend-options=--enable-foo``. The stand-in compiles the first as two
    flags: its NEFF is served for the ``=`` form."""
    odd = [*BASE, "--internal-backend-options", "--enable-foo"]
    plain = [*BASE, "--internal-backend-options=--enable-foo"]
    ok, text, _ = _prime_then_probe(server, sandbox, odd, plain)
    assert ok, "false hit: two command lines the compiler reads apart share a key\n" + text


@pytest.mark.e2e
@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(["--pipeline", "compile SaveTemps"], id="one-word-with-a-space"),
        pytest.param(["--pipeline=compile SaveTemps"], id="equals-form"),
    ],
)
def test_pipeline_words_and_one_spaced_word_share_a_key(
    server: Server, sandbox: Sandbox, odd: list[str]
) -> None:
    """``--pipeline compile SaveTemps`` (two words) and ``--pipeline "compile
    SaveTemps"`` (one word holding a space, or the ``=`` form) both normalize to
    ``--pipeline=compile SaveTemps``. argparse (``nargs="+"``) gets ``['compile',
    'SaveTemps']`` against ``['compile SaveTemps']``; so does the stand-in, whose NEFFs
    differ. Primed with the one-word form, the two-word command gets its NEFF."""
    ok, text, _ = _prime_then_probe(
        server, sandbox, [*BASE, *odd], [*BASE, "--pipeline", "compile", "SaveTemps"]
    )
    assert ok, "false hit: --pipeline's words are joined with spaces in the key\n" + text


@pytest.mark.e2e
def test_identical_repeat_collapses_where_the_compiler_counts_it(
    server: Server, sandbox: Sandbox
) -> None:
    """normalize_flags()
    collapses identical repeats (``--a --a`` is ``--a``), which is right for argparse's
    ``store`` actions and wrong for ``append``/``count`` actions (a pass-through
    ``--internal-*-options`` string appended twice is the backend's input twice). The
    repository's own stand-in counts every occurrence, so by its reading the key is
    wrong: the doubled command's NEFF is served for the single one."""
    flag = "--internal-backend-options=--enable-verifier"
    ok, text, _ = _prime_then_probe(server, sandbox, [*BASE, flag, flag], [*BASE, flag])
    assert ok, "false hit: a repeated option and a single one share a key\n" + text


# --- a hit where an argparse compiler rejects the command ---------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(["--verbose", "--disable-mixed-precision-accumulation"], id="verbose"),
        pytest.param(["--logfile", "--disable-mixed-precision-accumulation"], id="logfile"),
    ],
)
def test_output_neutral_option_swallows_a_following_option(
    server: Server, sandbox: Sandbox, odd: list[str]
) -> None:
    """``--verbose`` and ``--logfile`` take the next token as their value even
    when it is an option neffcache does not list (``--disable-mixed-precision-
    accumulation`` is documented but missing from keying's tables), and the pair is
    dropped as output-neutral: the key is the plain command's. argparse refuses
    ``--verbose --disable-...`` ("expected one argument"); a compiler whose
    ``--verbose`` value is optional would disable mixed-precision accumulation. Either
    way the plain command's NEFF is not what the compiler makes of this one."""
    ok, text, _ = _prime_then_probe(server, sandbox, BASE, [*BASE, *odd], argparse=True)
    assert ok, "the shim served a NEFF for a command the compiler rejects\n" + text


@pytest.mark.e2e
def test_documented_value_option_with_a_dash_word_hits_the_equals_form(
    server: Server, sandbox: Sandbox
) -> None:
    """``--tensorizer-options --foo`` and ``--tensorizer-options=--foo`` share a
    key (keying reads the next word as the value even when it starts with ``-``).
    argparse accepts only the ``=`` form (or a value holding a space); the space form
    is a usage error, yet after the ``=`` form was compiled anywhere the shim serves
    it a NEFF and exit 0."""
    ok, text, _ = _prime_then_probe(
        server,
        sandbox,
        [*BASE, "--tensorizer-options=--disable-x"],
        [*BASE, "--tensorizer-options", "--disable-x"],
        argparse=True,
    )
    assert ok, "the shim served a NEFF for a command the compiler rejects\n" + text


@pytest.mark.e2e
def test_missing_framework_is_served(server: Server, sandbox: Sandbox) -> None:
    """The CLI reference lists ``--framework`` and ``--target`` as required (no
    square brackets). parse() requires ``--target`` but takes a missing ``--framework``
    for ``XLA``; ``--framework`` is not in the key. A command without it, which the
    compiler rejects, is served the NEFF of the command with it, with exit 0."""
    probe = [t for t in BASE if t not in ("--framework", "XLA")]
    ok, text, _ = _prime_then_probe(server, sandbox, BASE, probe, argparse=True)
    assert ok, "the shim served a NEFF for a command the compiler rejects\n" + text


@pytest.mark.e2e
def test_abbreviated_output_after_output_publishes_a_stale_file(
    server: Server, sandbox: Sandbox
) -> None:
    """``--output out.neff --out real.neff``: argparse (allow_abbrev) writes the
    NEFF to real.neff, the last of two spellings of ``--output``. The shim takes
    ``--out`` for an unknown option and out.neff for the output: on host 1, where an
    old out.neff lies in the working directory, the compile succeeds and the shim
    publishes the OLD out.neff as this command's NEFF; on host 2 a hit writes that
    stale file to out.neff and never writes real.neff."""
    h1, h2 = hosts(server, sandbox, 2, NEFFCACHE_REAL_COMPILER=str(argparse_compiler(sandbox)))
    argv = [*BASE, "--out", "real.neff"]

    def layout(cwd: Path) -> None:
        put_hlo(BLOCK_A)(cwd)
        (cwd / "out.neff").write_bytes(b"STALE NEFF OF ANOTHER GRAPH")

    assert h1.shim(argv, h1.cwd(layout)).returncode == 0
    cwd = h2.cwd(put_hlo(BLOCK_A))
    probed = h2.shim(argv, cwd)
    ref_cwd = sandbox.new_dir("reference-cwd")
    put_hlo(BLOCK_A)(ref_cwd)
    alone = reference(sandbox, argv, ref_cwd, compiler=ARGPARSE_CC)
    ok, text = same_outcome((probed, cwd), (alone, ref_cwd), ["out.neff", "real.neff"])
    assert ok, "the shim wrote other files than the compiler would\n" + text


@pytest.mark.e2e
def test_empty_input_argument_keys_the_working_directory(server: Server, sandbox: Sandbox) -> None:
    """``compile "" ...`` (an unset variable in a launcher): parse() takes
    ``Path("")``, which is ``.``, so the shim keys the working directory as a trace
    folder. Where the working directory is a traced model folder compiled before (as
    ``compile .`` or by its absolute path, anywhere in the fleet), the shim serves that
    NEFF with exit 0; the compiler cannot open ``""`` and fails."""
    h1, h2 = hosts(server, sandbox, 2)

    def model(cwd: Path) -> None:
        put_hlo(BLOCK_A, "graph.hlo")(cwd)
        (cwd / "metadata.json").write_text('{"model_files": "graph.hlo"}')

    def argv(input_arg: str, out: Path) -> list[str]:
        return [
            "compile",
            input_arg,
            "--framework",
            "XLA",
            "--target",
            "trn1",
            "--output",
            str(out),
        ]

    first = h1.shim(argv(".", sandbox.new_dir("out1") / "x.neff"), h1.cwd(model))
    assert first.returncode == 0, first.describe()
    out2 = sandbox.new_dir("out2") / "x.neff"
    probed = h2.shim(argv("", out2), h2.cwd(model))
    ref_cwd = sandbox.new_dir("reference-cwd")
    model(ref_cwd)
    out3 = sandbox.new_dir("out3") / "x.neff"
    alone = reference(sandbox, argv("", out3), ref_cwd)
    got = (probed.returncode, out2.exists())
    want = (alone.returncode, out3.exists())
    assert got == want, (
        f"shim (exit, NEFF written) {got} vs compiler alone {want}; "
        f"record {h2.last()}\n{alone.stderr[-500:]}"
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("extra", "what"),
    [
        pytest.param(["--logfile", "no-such-dir/log.txt"], "log", id="logfile-dir-missing"),
        pytest.param([], "output", id="output-dir-missing"),
    ],
)
def test_hit_succeeds_where_the_compiler_fails_on_a_missing_directory(
    server: Server, sandbox: Sandbox, extra: list[str], what: str
) -> None:
    """On a hit the shim creates the missing parent directories of
    ``--output`` (copy_atomic) and ``--logfile`` (atomic_write) and exits 0; the
    compiler (the stand-in: a usage error) fails on a directory that does not exist.
    ``--output`` and ``--logfile`` are not in the key, so any earlier compile of the
    graph turns this failing command into a success."""
    probe = list(BASE) + extra
    if what == "output":
        probe[probe.index("out.neff")] = "no-such-dir/out.neff"
    ok, text, _ = _prime_then_probe(
        server, sandbox, BASE, probe, names=["out.neff", "no-such-dir/out.neff"]
    )
    assert ok, "a hit turned a failing command into a success\n" + text


# --- what the parser refuses or keys apart --------------------------------------


def _key_of(argv: list[str], exists: bool = False) -> tuple[str, ...] | None:
    from neffcache.client.keys import context
    from neffcache.client.wrapper import parse

    call = parse(argv, lambda _p: exists)
    if call is None:
        return None
    return (*context("2.20.9961.0+0acef03a", call.target, call.flags, {}).flags, call.target)


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(["--lnc", "1", "--logical-nc-config", "2"], id="lnc-alias-other-value"),
        pytest.param(["-lnc", "1", "--lnc=2"], id="lnc-short-alias"),
        pytest.param(["-O1", "--optlevel", "2"], id="O-and-optlevel"),
        pytest.param(["-O", "1", "-O2"], id="O-separate-and-joined"),
        pytest.param(["--target=trn2"], id="target-twice"),
        pytest.param(["--output", "other.neff"], id="output-twice"),
        pytest.param(["--model-type", "unet-inference"], id="model-type-twice"),
        pytest.param(["--framework=HLO"], id="framework-other"),
        pytest.param(["--enable-internal-neff-wrapper"], id="neff-wrapper"),
        pytest.param(["--help"], id="help"),
        pytest.param(["-"], id="dash-input"),
        pytest.param(["second.pb"], id="two-inputs"),
        pytest.param(["@more-flags.txt"], id="argparse-fromfile-word"),
        pytest.param(["-O"], id="O-without-value"),
    ],
)
def test_conflicting_or_strange_commands_are_not_keyed(tail: list[str]) -> None:
    """An option given twice with another value (in any spelling), a second
    output or target, another framework, help, ``-`` or a second bare word: parse()
    returns None and the compiler runs uncached."""
    assert _key_of([*BASE, *tail]) is None


def test_pipeline_words_never_take_the_input() -> None:
    """``--pipeline`` before the input takes it as a word: then there is no input,
    and the call is not keyed."""
    assert _key_of(["compile", "--pipeline", "in.pb", "--output", "o", "--target", "trn1"]) is None


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["compile", "--enable-foo", "in.pb", "--output", "o", "--target", "trn1"]),
        pytest.param(
            ["compile", "in.pb", "--tuning", "t.json", "--output", "o", "--target", "trn1"]
        ),
        pytest.param(["compile", "in.pb", "--tuning=t.json", "--output", "o", "--target", "trn1"]),
        pytest.param(["--enable-foo", "compile", "in.pb", "--output", "o", "--target", "trn1"]),
        pytest.param(["compile", "--output", "o", "--target", "trn1", "--", "in.pb"]),
    ],
)
def test_a_word_after_an_unknown_option_that_exists_is_not_keyed(argv: list[str]) -> None:
    """The input after an unknown switch, a file named by an unknown option
    (either spelling), a word after an option before ``compile``, and the input after
    ``--``: the shim cannot tell the input from a file the compiler reads, and does not
    key the call."""
    assert _key_of(argv, exists=True) is None


def test_competing_switches_keep_last_wins_after_collapse() -> None:
    """``--enable-x --disable-x --enable-x`` collapses to ``--disable-x
    --enable-x``: what an argparse ``store`` compiler ends with either way; and it
    stays apart from ``--enable-x --disable-x`` (the other outcome)."""
    from neffcache.keying import normalize_flags

    a = normalize_flags(["-O1", "--enable-saturate-infinity", "-O1"])
    assert a == ["--enable-saturate-infinity", "--optlevel=1"]
    assert a != normalize_flags(["-O1", "--enable-saturate-infinity"])
    # Undocumented switches may count or accumulate: every repeat stays in the key.
    b = normalize_flags(["--enable-x", "--disable-x", "--enable-x"])
    assert b == ["--enable-x", "--disable-x", "--enable-x"]


def test_abbreviated_target_is_kept_apart() -> None:
    """``--target trn1 --targ trn2`` (argparse compiles for trn2): an abbreviation
    of a documented option is not keyed at all; the compiler runs uncached."""
    assert _key_of([*BASE, "--targ", "trn2"]) is None
    assert _key_of(BASE) is not None


def test_spellings_of_documented_options_share_a_key() -> None:
    """``--target trn1`` / ``--target=trn1`` / before ``compile``,
    ``-O2`` / ``-O 2`` / ``--optlevel=2``, ``--lnc 2`` / ``-lnc=2``: one key."""
    forms = [
        [
            *("compile", "in.pb", "--target", "trn2", "--output", "o", "-O2", "--lnc", "2"),
            *("--framework", "XLA"),
        ],
        ["compile", "in.pb", "--target=trn2", "--output=o", "-O", "2", "-lnc=2", "--framework=XLA"],
        [
            *("--target=trn2", "compile", "in.pb", "--output", "o", "--optlevel=2", "--lnc=2"),
            "--framework=XLA",
        ],
    ]
    keys = {_key_of(f) for f in forms}
    assert None not in keys, keys
    assert len(keys) == 1, keys


def test_environment_allowlist_splits_keys() -> None:
    """XLA_FLAGS and NEURON_LOGICAL_NC_CONFIG are in the context; XLA's dump
    options are not."""
    from neffcache.client.keys import context

    v = "2.20.9961.0+0acef03a"
    plain = context(v, "trn1", [], {})
    assert context(v, "trn1", [], {"XLA_FLAGS": "--xla_foo=1"}) != plain
    assert context(v, "trn1", [], {"NEURON_LOGICAL_NC_CONFIG": "1"}) != plain
    assert context(v, "trn1", [], {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}) == plain


@pytest.mark.e2e
def test_same_option_twice_same_value_compiles_alike(server: Server, sandbox: Sandbox) -> None:
    """``--model-type transformer`` beside ``--model-type=transformer`` (TorchNeuron
    plus NEURON_CC_FLAGS) hits the single form's entry, and the stand-in, which counts
    occurrences, is asked nothing different: both runs' NEFFs come from the same
    command."""
    argv = [*BASE, "--model-type", "transformer"]
    ok, text, _ = _prime_then_probe(server, sandbox, argv, argv)
    assert ok, text


@pytest.mark.e2e
def test_output_equal_to_input(server: Server, sandbox: Sandbox) -> None:
    """``--output`` naming the input: a hit overwrites the input with the NEFF, as
    the compiler does after reading it."""
    argv = ["compile", "in.pb", "--framework", "XLA", "--target", "trn1", "--output", "in.pb"]
    ok, text, _ = _prime_then_probe(server, sandbox, argv, argv, names=["in.pb"])
    assert ok, text


@pytest.mark.e2e
def test_relative_paths_resolve_in_the_callers_directory(server: Server, sandbox: Sandbox) -> None:
    """Relative input and output in a subdirectory of the working directory."""
    argv = [
        "compile",
        "sub/in.pb",
        "--framework=XLA",
        "--target=trn1",
        "--output=sub/out.neff",
    ]
    h1, h2 = hosts(server, sandbox, 2)
    layout = put_hlo(BLOCK_A, "sub/in.pb")
    assert h1.shim(argv, h1.cwd(layout)).returncode == 0
    cwd = h2.cwd(layout)
    probed = h2.shim(argv, cwd)
    ref_cwd = sandbox.new_dir("ref")
    layout(ref_cwd)
    alone = reference(sandbox, argv, ref_cwd)
    ok, text = same_outcome((probed, cwd), (alone, ref_cwd), ["sub/out.neff"])
    assert ok, text
    assert (h2.last() or {}).get("result") == "hit"
