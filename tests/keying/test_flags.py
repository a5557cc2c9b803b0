"""Flag normalization (neffcache's key) and the stock Neuron flags hash
(docs/neuron-sdk.md#cache-location and #flags-hash)."""

from __future__ import annotations

import pytest

from neffcache.keying import (
    OUTPUT_NEUTRAL_FLAGS,
    STOCK_FLAGS,
    STOCK_FLAGS_TXT,
    WRAPPER_ONLY_FLAGS,
    KeyingError,
    StockEra,
    abbreviates,
    flags_target,
    neuron_cache_flags,
    neuron_flags_hash,
    normalize_flags,
    option_arity,
    option_name,
    read_stock_flags,
    stock_era_of,
)

# Wrapper-only flags that take no value (docs/neuron-sdk.md#cache-location: --no_cache,
# --retry_failed_compilation).
BOOLEAN_WRAPPER_FLAGS = ("--no_cache", "--retry_failed_compilation")
VALUE_WRAPPER_FLAGS = tuple(sorted(set(WRAPPER_ONLY_FLAGS) - set(BOOLEAN_WRAPPER_FLAGS)))

BASE = ["--model-type=transformer"]


# --- normalize_flags: what is removed -------------------------------------------------


def test_wrapper_flag_sets_are_the_documented_ones() -> None:
    # docs/neuron-sdk.md#cache-location and #open-questions list these as parsed by
    # libneuronxla and never passed on.
    assert set(WRAPPER_ONLY_FLAGS) >= {
        "--cache_dir",
        "--no_cache",
        "--retry_failed_compilation",
        "--log_level",
    }
    assert set(BOOLEAN_WRAPPER_FLAGS) <= set(WRAPPER_ONLY_FLAGS)


@pytest.mark.parametrize("flag", VALUE_WRAPPER_FLAGS)
def test_value_wrapper_flag_removed_with_equals(flag: str) -> None:
    assert normalize_flags([f"{flag}=/some/where", *BASE]) == BASE


@pytest.mark.parametrize("flag", VALUE_WRAPPER_FLAGS)
def test_value_wrapper_flag_removed_with_space(flag: str) -> None:
    # The value must go too: a leftover "/some/where" would be a positional (dropped)
    # but a leftover "s3://b" right before a flag must not become anything either.
    assert normalize_flags([flag, "/some/where", *BASE]) == BASE
    assert normalize_flags(f"{flag} /some/where --model-type transformer") == BASE


@pytest.mark.parametrize("flag", BOOLEAN_WRAPPER_FLAGS)
def test_boolean_wrapper_flag_removed(flag: str) -> None:
    assert normalize_flags([flag, *BASE]) == BASE
    assert normalize_flags([*BASE, flag]) == BASE


@pytest.mark.parametrize("flag", BOOLEAN_WRAPPER_FLAGS)
def test_boolean_wrapper_flag_does_not_swallow_next_word(flag: str) -> None:
    # "compile" after a switch is the command word, not the switch's value; the
    # following --model-type must survive.
    assert normalize_flags(f"{flag} compile --model-type transformer") == BASE


@pytest.mark.parametrize("flag", sorted(OUTPUT_NEUTRAL_FLAGS))
def test_output_neutral_flag_removed_both_spellings(flag: str) -> None:
    assert normalize_flags([f"{flag}=x", *BASE]) == BASE
    assert normalize_flags([flag, "x", *BASE]) == BASE


def test_every_listed_flag_has_a_reason() -> None:
    for table in (WRAPPER_ONLY_FLAGS, OUTPUT_NEUTRAL_FLAGS):
        for name, reason in table.items():
            assert name.startswith("--")
            assert isinstance(reason, str)
            assert reason.strip()


def test_command_word_and_input_path_removed() -> None:
    command = (
        "compile /tmp/work/model.hlo_module.pb --framework=XLA --target=trn1 "
        "--output /tmp/work/model.neff --verbose=35 --model-type=transformer"
    )
    assert normalize_flags(command) == ["--target=trn1", "--model-type=transformer"]


def test_nxd_logfile_in_workdir_does_not_matter() -> None:
    # docs/neuron-sdk.md#flags-hashed-verbatim: NxD appends --logfile=<workdir>/...; moving
    # the workdir must not miss.
    a = normalize_flags("--model-type=transformer --logfile=/tmp/nxd_model/a/log-neuron-cc.txt")
    b = normalize_flags("--model-type=transformer --logfile=/scratch/run7/log-neuron-cc.txt")
    assert a == b == BASE


# --- normalize_flags: spelling --------------------------------------------------------


def test_space_spelling_becomes_equals() -> None:
    assert normalize_flags("--model-type transformer --auto-cast none") == [
        "--model-type=transformer",
        "--auto-cast=none",
    ]
    assert normalize_flags(["--model-type", "transformer"]) == BASE


@pytest.mark.parametrize(
    "spelling",
    ["-O2", "-O 2", "--optlevel 2", "--optlevel=2", ["-O", "2"], ["--optlevel", "2"]],
)
def test_optlevel_aliases(spelling: str | list[str]) -> None:
    assert normalize_flags(spelling) == ["--optlevel=2"]


@pytest.mark.parametrize(
    "spelling",
    ["-lnc 2", "-lnc=2", "--lnc 2", "--lnc=2", "--logical-nc-config 2", "--logical-nc-config=2"],
)
def test_logical_nc_config_aliases(spelling: str) -> None:
    assert normalize_flags(spelling) == ["--logical-nc-config=2"]


def test_same_name_order_preserved() -> None:
    # The compiler's parser lets the last one win, so their order is significant.
    assert normalize_flags("--optlevel=1 --model-type=transformer -O3") == [
        "--optlevel=1",
        "--model-type=transformer",
        "--optlevel=3",
    ]
    assert normalize_flags("-O3 --optlevel=1") == ["--optlevel=3", "--optlevel=1"]
    assert normalize_flags("-O3 --optlevel=1") != normalize_flags("--optlevel=1 -O3")


def test_order_of_different_flags_is_kept() -> None:
    # Differently named flags can compete too (the last one wins), and neffcache
    # cannot tell which do: reordering them must never be taken as the same compile.
    enable, disable = (
        "--enable-mixed-precision-accumulation",
        "--disable-mixed-precision-accumulation",
    )
    assert normalize_flags([enable, disable]) == [enable, disable]
    assert normalize_flags([enable, disable]) != normalize_flags([disable, enable])
    assert normalize_flags("--model-t=transformer --model-type=generic") != normalize_flags(
        "--model-type=generic --model-t=transformer"
    )


@pytest.mark.parametrize(
    "flags",
    [
        "--model-type transformer -O1 --cache_dir=/c --logfile=/w/log",
        "compile in.pb --lnc 2 --tensorizer-options '--foo --bar=1' --pipeline compile SaveTemps",
        "-O3 --optlevel=1 --enable-saturate-infinity --auto-cast=none",
        "",
    ],
)
def test_idempotent(flags: str) -> None:
    once = normalize_flags(flags)
    assert normalize_flags(once) == once


@pytest.mark.parametrize(
    "flags", [["--optlevel=1", "--model-type"], ["--model-type", "--optlevel=1"]]
)
def test_value_flag_missing_its_value_is_rejected(flags: list[str]) -> None:
    # Taking the next flag as its value would make normalization non-idempotent
    # (a second pass would read "--model-type --optlevel=1" differently).
    with pytest.raises(KeyingError, match="--model-type needs a value"):
        normalize_flags(flags)


def test_dash_o_equals_spelling() -> None:
    assert normalize_flags("-O=2") == normalize_flags("-O2") == ["--optlevel=2"]


def test_known_value_flag_takes_dash_leading_value() -> None:
    assert normalize_flags("--tensorizer-options '--foo'") == ["--tensorizer-options=--foo"]
    assert normalize_flags(["--tensorizer-options", "--foo --bar=2", *BASE]) == [
        "--tensorizer-options=--foo --bar=2",
        "--model-type=transformer",
    ]


def test_options_flags_keep_their_dash_leading_values() -> None:
    # Two *-options flags with swapped values are different compiles.
    a = "--internal-hlo2tensorizer-options '--fuse=false' --internal-backend-options '--dma-x'"
    b = "--internal-hlo2tensorizer-options '--dma-x' --internal-backend-options '--fuse=false'"
    assert normalize_flags(a) == [
        "--internal-hlo2tensorizer-options=--fuse=false",
        "--internal-backend-options=--dma-x",
    ]
    assert normalize_flags(a) != normalize_flags(b)


def test_negative_numbers_are_values() -> None:
    assert normalize_flags("--a -1 --b -2") == ["--a=-1", "--b=-2"]
    assert normalize_flags("--a -1 --b -2") != normalize_flags("--a -2 --b -1")


@pytest.mark.parametrize("bad", [None, 3, b"--x"])
def test_flags_of_the_wrong_type_are_keying_errors(bad: object) -> None:
    with pytest.raises(KeyingError, match="string"):
        normalize_flags(bad)  # type: ignore[arg-type]


def test_unknown_flag_does_not_take_dash_leading_word() -> None:
    assert normalize_flags("--some-switch --model-type=transformer") == [
        "--some-switch",
        "--model-type=transformer",
    ]


def test_unbalanced_quote_is_keying_error() -> None:
    with pytest.raises(KeyingError, match="cannot split"):
        normalize_flags("--tensorizer-options '--foo")


def test_non_string_token_is_keying_error() -> None:
    with pytest.raises(KeyingError):
        normalize_flags(["--model-type", 3])  # type: ignore[list-item]


# --- neuron_flags_hash: every observed value of docs/neuron-sdk.md#flags-hash ---------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # Raw-string era (neuronxcc up to about 2.13): md5 of the string as given.
        ("", "d41d8cd9"),
        ("--model-type=transformer", "abb26765"),
        ("--model-type=transformer --auto-cast=none", "2c2d707e"),
        ("--model-type transformer --distribution-strategy=llm-training", "5d2d81ce"),
    ],
)
def test_neuron_flags_hash_legacy_golden(flags: str, expected: str) -> None:
    assert neuron_flags_hash(flags, legacy=True) == expected


def test_neuron_flags_hash_legacy_token_list_joins_with_spaces() -> None:
    tokens = ["--model-type", "transformer", "--distribution-strategy=llm-training"]
    assert neuron_flags_hash(tokens, legacy=True) == "5d2d81ce"
    assert neuron_flags_hash([], legacy=True) == "d41d8cd9"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # JSON era (neuronxcc >= 2.15): md5(json.dumps(tokens)).
        (["--model-type=transformer", "--auto-cast=none", "--execute-repetition=1"], "39f12043"),
        (["--target=trn1", "--model-type=transformer"], "3cc9a3cb"),
        (["--target=trn1"], "e30acd3a"),
        (["--target=trn3"], "70e3f644"),
        (
            [
                "--target=trn2",
                "--model-type=transformer",
                "--optlevel=1",
                "--enable-saturate-infinity",
                "--lnc=2",
            ],
            "839ddec0",
        ),
    ],
)
def test_neuron_flags_hash_json_golden(flags: list[str], expected: str) -> None:
    assert neuron_flags_hash(flags) == expected
    assert neuron_flags_hash(tuple(flags)) == expected


def test_neuron_flags_hash_is_spelling_and_order_sensitive() -> None:
    # docs/neuron-sdk.md#flags-hash item 8: the stock hash is token-exact, unlike neffcache's key.
    assert neuron_flags_hash(["--model-type=transformer"]) != neuron_flags_hash(
        ["--model-type", "transformer"]
    )
    assert neuron_flags_hash(["--target=trn1", "--model-type=transformer"]) != neuron_flags_hash(
        ["--model-type=transformer", "--target=trn1"]
    )


def test_neuron_flags_hash_string_without_legacy_is_keying_error() -> None:
    with pytest.raises(KeyingError, match="legacy"):
        neuron_flags_hash("--target=trn1")


# --- neuron_cache_flags ---------------------------------------------------------------


@pytest.mark.parametrize("flag", VALUE_WRAPPER_FLAGS)
def test_neuron_cache_flags_strips_value_wrapper_flags(flag: str) -> None:
    expected = ["--target=trn1", "--model-type=transformer", "-O1"]
    assert neuron_cache_flags([f"{flag}=/x", "--model-type=transformer", "-O1"], "trn1") == expected
    assert neuron_cache_flags(["--model-type=transformer", flag, "/x", "-O1"], "trn1") == expected


@pytest.mark.parametrize("flag", BOOLEAN_WRAPPER_FLAGS)
def test_neuron_cache_flags_strips_boolean_wrapper_flags(flag: str) -> None:
    assert neuron_cache_flags([flag, "--model-type=transformer"], "trn2") == [
        "--target=trn2",
        "--model-type=transformer",
    ]


def test_neuron_cache_flags_strips_s3_cache_dir_value() -> None:
    assert neuron_cache_flags("--cache_dir s3://x --model-type=transformer", "trn1") == [
        "--target=trn1",
        "--model-type=transformer",
    ]
    assert neuron_cache_flags("--cache_dir=s3://x/prefix --model-type=transformer", "trn1") == [
        "--target=trn1",
        "--model-type=transformer",
    ]


def test_neuron_cache_flags_keeps_order_and_spelling() -> None:
    flags = ["--optlevel", "1", "--model-type=transformer", "--logfile=/w/log", "-O2"]
    assert neuron_cache_flags(flags, "trn2") == ["--target=trn2", *flags]


def test_neuron_cache_flags_keeps_existing_target() -> None:
    assert neuron_cache_flags(["--model-type=transformer", "--target=trn2"], "trn2") == [
        "--model-type=transformer",
        "--target=trn2",
    ]
    assert neuron_cache_flags(["--target", "trn1"], "trn1") == ["--target", "trn1"]


def test_neuron_cache_flags_without_target() -> None:
    # transformers-neuronx passes the target separately and does not hash it
    # (docs/neuron-sdk.md#flags-hash item 6).
    assert neuron_cache_flags("--model-type=transformer --auto-cast=none", None) == [
        "--model-type=transformer",
        "--auto-cast=none",
    ]


def test_nxd_llama_on_trn1_end_to_end() -> None:
    # docs/neuron-sdk.md#flags-hash: NEURON_CC_FLAGS="--model-type=transformer
    # --cache_dir=..." on trn1 was stored under +3cc9a3cb.
    neuron_cc_flags = "--model-type=transformer --cache_dir=/fsx/neuron-compile-cache"
    assert neuron_flags_hash(neuron_cache_flags(neuron_cc_flags, "trn1")) == "3cc9a3cb"


def test_no_user_flags_end_to_end() -> None:
    assert neuron_flags_hash(neuron_cache_flags("", "trn1")) == "e30acd3a"
    assert neuron_flags_hash(neuron_cache_flags("", "trn3")) == "70e3f644"


def test_trn2_lnc_end_to_end() -> None:
    neuron_cc_flags = "--model-type=transformer --optlevel=1 --enable-saturate-infinity --lnc=2"
    assert neuron_flags_hash(neuron_cache_flags(neuron_cc_flags, "trn2")) == "839ddec0"


# --- repeats, option names and arities -------------------------------------------------


def test_identical_repeats_collapse_into_the_last() -> None:
    assert normalize_flags("--model-type=transformer --lnc 2 --model-type transformer") == [
        "--logical-nc-config=2",
        "--model-type=transformer",
    ]
    # --a --b --a: the compiler sees --a last either way.
    assert normalize_flags("-O1 --enable-saturate-infinity -O1") == [
        "--enable-saturate-infinity",
        "--optlevel=1",
    ]
    # Not identical: kept, in order (which wins is the compiler's business).
    assert normalize_flags("-O1 -O2") == ["--optlevel=1", "--optlevel=2"]


@pytest.mark.parametrize(
    "repeated",
    ["--internal-backend-options=--enable-verifier", "--enable-x", "--tensorizer-options=-x"],
)
def test_options_that_may_accumulate_keep_every_repeat(repeated: str) -> None:
    assert normalize_flags([repeated, repeated]) != normalize_flags([repeated])


def test_abbreviations_of_documented_options() -> None:
    assert abbreviates("--out") == "--output"
    assert abbreviates("--targ") == "--target"
    assert abbreviates("--output") is None
    assert abbreviates("--no-such-option") is None
    assert abbreviates("-O") is None


def test_repeated_verbose_and_targets_of_the_same_value_key_alike() -> None:
    nxd = ["--target", "trn2", "--target=trn2", "--verbose=35", "--verbose=35", "-O1"]
    assert normalize_flags(nxd) == normalize_flags(["--target=trn2", "-O1"])


@pytest.mark.parametrize(
    ("token", "name", "value", "arity"),
    [
        ("-O2", "--optlevel", "2", "value"),
        ("--lnc", "--logical-nc-config", None, "value"),
        ("-lnc=1", "--logical-nc-config", "1", "value"),
        ("--target=trn2", "--target", "trn2", "value"),
        ("--logfile", "--logfile", None, "value"),
        ("--pipeline", "--pipeline", None, "words"),
        ("--enable-saturate-infinity", "--enable-saturate-infinity", None, "none"),
        ("--no_cache", "--no_cache", None, "none"),
        ("--cache_dir", "--cache_dir", None, "value"),
        ("--some-new-option", "--some-new-option", None, "unknown"),
        ("--internal-backend-options", "--internal-backend-options", None, "value"),
    ],
)
def test_option_names_and_arities(token: str, name: str, value: str | None, arity: str) -> None:
    assert option_name(token) == (name, value)
    assert option_arity(name) == arity


# --- the three eras of the stock layout (docs/neuron-sdk.md#layout-eras) --------------
# Each value was recomputed with hashlib.md5 before it was pinned here.

TNX = ["--model-type=transformer", "--auto-cast=none"]
TNX_REPEAT = [*TNX, "--execute-repetition=1"]

# (era, the flags file's content, its name, <flags8> in the public folder name)
ERA_GOLDEN = [
    # PJRT on 2.14.227 through an older libneuronxla: the raw string.
    (StockEra.RAW, b"--auto-cast none", STOCK_FLAGS_TXT, "00875417"),
    # PJRT on 2.15.128: no user flags, no --target.
    (StockEra.JSON, b"[]", STOCK_FLAGS, "d7517139"),
    # transformers-neuronx on 2.14.227.
    (StockEra.JSON, b'["--model-type=transformer", "--auto-cast=none"]', STOCK_FLAGS, "d7cde3b5"),
    # 2.16 on: --target first, on transformers-neuronx too.
    (
        StockEra.TARGET,
        b'["--target=trn1", "--model-type=transformer", "--auto-cast=none", '
        b'"--execute-repetition=1"]',
        STOCK_FLAGS,
        "613edded",
    ),
    (
        StockEra.TARGET,
        b'["--target=trn2", "--model-type=transformer", "--auto-cast=none", '
        b'"--execute-repetition=1"]',
        STOCK_FLAGS,
        "7ac4dbae",
    ),
]


@pytest.mark.parametrize(("era", "content", "name", "expected"), ERA_GOLDEN)
def test_era_golden_flags_files(era: StockEra, content: bytes, name: str, expected: str) -> None:
    read = read_stock_flags(name, content)
    assert read.era is era
    assert read.flags_hash == expected
    assert era.flags_hash(read.flags) == expected
    assert era.flags_file == name
    # Written back, the era's file is the very bytes the SDK wrote.
    assert era.flags_content(read.flags) == content


@pytest.mark.parametrize(
    ("flags", "target", "era", "expected"),
    [
        ("--auto-cast none", "trn1", StockEra.RAW, "00875417"),
        ("", "trn1", StockEra.JSON, "d7517139"),
        (TNX, "trn1", StockEra.JSON, "d7cde3b5"),
        (TNX_REPEAT, "trn1", StockEra.TARGET, "613edded"),
        (TNX_REPEAT, "trn2", StockEra.TARGET, "7ac4dbae"),
        (["--target", "trn2", *TNX_REPEAT], "trn2", StockEra.TARGET, None),
    ],
)
def test_era_of_a_compile_from_its_flags8(
    flags: str | list[str], target: str, era: StockEra, expected: str | None
) -> None:
    tokens = flags.split() if isinstance(flags, str) else flags
    flags8 = expected or era.flags_hash(era.flags_list(tokens, target))
    assert era.flags_hash(era.flags_list(tokens, target)) == flags8
    assert stock_era_of(flags8, tokens, target) is era
    assert stock_era_of("0" * 8, tokens, target) is None


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # The nine of docs/neuron-sdk.md#flags-hash, each in the era its context names.
        ("", "d41d8cd9"),
        ("--model-type=transformer", "abb26765"),
        ("--model-type=transformer --auto-cast=none", "2c2d707e"),
        ("--model-type transformer --distribution-strategy=llm-training", "5d2d81ce"),
    ],
)
def test_raw_era_reads_the_section_4_3_raw_strings(flags: str, expected: str) -> None:
    read = read_stock_flags(STOCK_FLAGS_TXT, flags.encode())
    assert read.era is StockEra.RAW
    assert read.flags_hash == expected == StockEra.RAW.flags_hash(flags)
    assert StockEra.RAW.flags_hash(read.flags) == expected


def test_eras_tell_the_file_and_the_done_marker() -> None:
    assert [e.flags_file for e in StockEra] == [STOCK_FLAGS_TXT, STOCK_FLAGS, STOCK_FLAGS]
    assert [e.marks_done for e in StockEra] == [False, True, True]
    assert StockEra("raw") is StockEra.RAW  # the manifest's stock_era names it so


def test_era_flags_lists_add_target_only_in_the_newest_era() -> None:
    flags = "--model-type=transformer --cache_dir=/fsx/cache"
    assert StockEra.RAW.flags_list(flags, "trn1") == ["--model-type=transformer"]
    assert StockEra.JSON.flags_list(flags, "trn1") == ["--model-type=transformer"]
    assert StockEra.TARGET.flags_list(flags, "trn1") == [
        "--target=trn1",
        "--model-type=transformer",
    ]
    assert StockEra.TARGET.flags_hash(StockEra.TARGET.flags_list(flags, "trn1")) == "3cc9a3cb"


def test_nxdi_two_word_target_is_the_target_era() -> None:
    content = b'["--target", "trn2", "--model-type=transformer"]'
    read = read_stock_flags(STOCK_FLAGS, content)
    assert read.era is StockEra.TARGET
    assert read.target == "trn2"
    assert flags_target(["--target=trn1"]) == "trn1"
    assert flags_target(["--model-type=transformer"]) is None
    assert flags_target(["--target"]) is None


@pytest.mark.parametrize(
    ("name", "content"),
    [
        (STOCK_FLAGS, b"--model-type=transformer"),
        (STOCK_FLAGS, b'{"flags": []}'),
        (STOCK_FLAGS, b'["--a", 3]'),
        (STOCK_FLAGS_TXT, b"\xff"),
        ("compile_flags.yaml", b"[]"),
    ],
)
def test_unreadable_flags_files_are_keying_errors(name: str, content: bytes) -> None:
    with pytest.raises(KeyingError):
        read_stock_flags(name, content)


def test_the_flags_hash_loads_no_openssl() -> None:
    # The wrapper computes it on every hit: hashlib would load OpenSSL and blake2 for
    # eight hex digits of a directory name (the builtin _md5 gives the same digest).
    import subprocess
    import sys

    probe = (
        "import sys; from neffcache.keying import neuron_flags_hash; "
        "before = '_hashlib' in sys.modules; "
        "assert neuron_flags_hash(['--target=trn1', '--model-type=transformer']) == '3cc9a3cb'; "
        "print(before, '_hashlib' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert after == before
