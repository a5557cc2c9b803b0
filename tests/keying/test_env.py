"""The environment and framework allowlists (STYLE.md rule 5: read env only from a list)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from neffcache.keying import ENV_ALLOWLIST, FRAMEWORK_ALLOWLIST, KeyingError, compile_env
from neffcache.keying._env import check_env, check_frameworks


def test_compile_env_picks_only_allowlisted_names() -> None:
    environ = {
        "HOME": "/root",
        "PATH": "/usr/bin",
        "NEURON_CC_FLAGS": "--model-type=transformer",
        "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2",
        "NEURON_COMPILE_CACHE_URL": "s3://bucket/prefix",
        "XLA_HLO_DEBUG": "1",
        "NEURON_RT_VISIBLE_CORES": "0-31",
        "NEURON_LOGICAL_NC_CONFIG": "2",
        "NEURON_FALL_BACK_TO_NULL_NEFF": "1",
        "NEURON_EXTRACT_GRAPHS_ONLY": "1",
    }
    assert compile_env(environ) == {"NEURON_LOGICAL_NC_CONFIG": "2"}


def test_placeholder_switches_are_not_in_the_key() -> None:
    """neuron_parallel_compile's pool inherits NEURON_EXTRACT_GRAPHS_ONLY=1 and compiles
    for real: keyed, the training run (without it) would never hit what it published."""
    pool = {"NEURON_EXTRACT_GRAPHS_ONLY": "1", "NEURON_FALL_BACK_TO_NULL_NEFF": "1"}
    assert compile_env(pool) == compile_env({}) == {}
    assert not set(pool) & set(ENV_ALLOWLIST)


def test_compile_env_takes_every_allowlisted_name() -> None:
    environ = {name: "1" for name in ENV_ALLOWLIST}
    assert compile_env(environ) == environ


def test_compile_env_result_is_sorted() -> None:
    environ = {"XLA_FLAGS": "--xla_cpu_fast_math", "NEURON_LOGICAL_NC_CONFIG": "2"}
    assert list(compile_env(environ)) == sorted(environ)


def test_compile_env_of_empty_environment() -> None:
    assert compile_env({}) == {}
    assert compile_env({"HOME": "/root"}) == {}


def test_compile_env_drops_empty_values() -> None:
    environ = {"NEURON_LOGICAL_NC_CONFIG": "", "XLA_FLAGS": "--xla_cpu_fast_math"}
    assert compile_env(environ) == {"XLA_FLAGS": "--xla_cpu_fast_math"}


def test_xla_dump_flags_removed() -> None:
    environ = {
        "XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_cpu_fast_math --xla_dump_hlo_as_text "
        "--xla_dump_hlo_pass_re=.*",
    }
    assert compile_env(environ) == {"XLA_FLAGS": "--xla_cpu_fast_math"}


def test_xla_dump_location_does_not_change_env() -> None:
    a = compile_env({"XLA_FLAGS": "--xla_dump_to=/tmp/run1 --xla_cpu_fast_math"})
    b = compile_env({"XLA_FLAGS": "--xla_cpu_fast_math --xla_dump_to=/scratch/run2"})
    assert a == b


def test_xla_flags_dropped_when_only_dump_flags_remain() -> None:
    environ = {
        "XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_dump_hlo_as_proto",
        "NEURON_LOGICAL_NC_CONFIG": "1",
    }
    assert compile_env(environ) == {"NEURON_LOGICAL_NC_CONFIG": "1"}


def test_xla_flags_with_unbalanced_quote_is_keying_error() -> None:
    with pytest.raises(KeyingError, match="XLA_FLAGS"):
        compile_env({"XLA_FLAGS": "--xla_foo='bar"})


@pytest.mark.parametrize(
    ("check", "name", "allowlist", "table"),
    [
        (check_env, "HOME", ENV_ALLOWLIST, "ENV_ALLOWLIST"),
        (check_frameworks, "torch", FRAMEWORK_ALLOWLIST, "FRAMEWORK_ALLOWLIST"),
    ],
)
def test_unknown_names_are_rejected_naming_the_allowlist(
    check: Any, name: str, allowlist: Mapping[str, str], table: str
) -> None:
    with pytest.raises(KeyingError) as excinfo:
        check({name: "x"})
    message = str(excinfo.value)
    assert f"'{name}'" in message
    assert table in message
    for known in allowlist:
        assert known in message


def test_check_env_rejects_non_string_value() -> None:
    with pytest.raises(KeyingError, match="string"):
        check_env({"NEURON_LOGICAL_NC_CONFIG": 2})  # type: ignore[dict-item]


def test_check_frameworks_accepts_allowlisted_and_sorts() -> None:
    assert check_frameworks({"nki": "0.1.0"}) == {"nki": "0.1.0"}
    assert check_frameworks({"nki": ""}) == {}


@pytest.mark.parametrize(
    ("table", "entries"),
    [("ENV_ALLOWLIST", ENV_ALLOWLIST), ("FRAMEWORK_ALLOWLIST", FRAMEWORK_ALLOWLIST)],
)
def test_every_allowlist_entry_has_a_reason(table: str, entries: dict[str, str]) -> None:
    assert entries, f"{table} is empty"
    for name, reason in entries.items():
        assert isinstance(name, str)
        assert name
        assert isinstance(reason, str), f"{table}[{name!r}]"
        assert reason.strip(), f"{table}[{name!r}] has no reason"


def test_deliberately_excluded_names_stay_out() -> None:
    # _env's docstring explains why each of these is left out of the key.
    for name in (
        "NEURON_CC_FLAGS",
        "NEURON_PLATFORM_TARGET_OVERRIDE",
        "XLA_HLO_DEBUG",
        "XLA_IR_DEBUG",
        "ENABLE_PYHLO_FILE_METADATA",
        "NEURON_COMPILE_CACHE_URL",
    ):
        assert name not in ENV_ALLOWLIST


def test_xla_flags_quoting_survives_dump_removal() -> None:
    # XLA reads --flag="a --b" as one value: the quotes must still be there after the
    # dump options are removed, or it would read as two flags.
    quoted = compile_env({"XLA_FLAGS": '--xla_disable_hlo_passes="foo --xla_cpu_fast_math"'})
    split = compile_env({"XLA_FLAGS": "--xla_disable_hlo_passes=foo --xla_cpu_fast_math"})
    assert quoted != split
    assert split == {"XLA_FLAGS": "--xla_disable_hlo_passes=foo --xla_cpu_fast_math"}
