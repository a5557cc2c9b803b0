"""Unit tests for ``neffcache.client.config`` and the ``neffcache_hook.pth`` line.

Everything but the ``.pth`` tests runs in-process on explicit environment mappings;
the ``.pth`` line runs in ``python -S`` children so that the installed copy of the same
line (site-packages) cannot be what imported the hook.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.client._log import CHECKED, typos_suspected, warn_typos_once
from neffcache.client.config import (
    DEFAULT_LOCAL_DIR,
    ClientConfig,
    ConfigError,
    cache_url,
    parse_url,
    wants_neffcache,
)

REPO = Path(__file__).resolve().parents[2]
PTH = REPO / "client" / "neffcache_hook.pth"
URL = "neffcache+http://cache.internal:8787/team-a"
OTHER = "neffcache+http://other.internal:9000/team-b"


# --- the URL's precedence -------------------------------------------------------------


def test_no_url_anywhere() -> None:
    assert cache_url({}) is None
    assert ClientConfig.from_env({}) is None
    assert not wants_neffcache({})


def test_neffcache_url_overrides_flags_and_sdk_url() -> None:
    env = {
        "NEFFCACHE_URL": URL,
        "NEURON_CC_FLAGS": f"--cache_dir={OTHER}",
        "NEURON_COMPILE_CACHE_URL": "s3://bucket/prefix",
    }
    assert cache_url(env) == URL
    config = ClientConfig.from_env(env)
    assert config is not None
    assert (config.server, config.namespace) == ("http://cache.internal:8787", "team-a")


@pytest.mark.parametrize(
    "flags",
    [
        f"--model-type=transformer --cache_dir={URL} -O1",
        f"--model-type=transformer --cache_dir {URL} -O1",
        f'--model-type=transformer --cache_dir="{URL}" -O1',
        f"--cache_dir '{URL}'",
        f"--cache_dir={URL}",
    ],
)
def test_cache_dir_in_flags_beats_the_sdk_variable(flags: str) -> None:
    env = {"NEURON_CC_FLAGS": flags, "NEURON_COMPILE_CACHE_URL": OTHER}
    assert cache_url(env) == URL
    config = ClientConfig.from_env(env)
    assert config is not None
    assert config.url == URL


def test_sdk_variable_when_flags_have_no_cache_dir() -> None:
    env = {"NEURON_CC_FLAGS": "--model-type=transformer", "NEURON_COMPILE_CACHE_URL": URL}
    assert cache_url(env) == URL
    assert wants_neffcache(env)


def test_empty_neffcache_url_falls_through() -> None:
    assert cache_url({"NEFFCACHE_URL": "", "NEURON_COMPILE_CACHE_URL": URL}) == URL


def test_a_directory_in_flags_hides_a_neffcache_sdk_variable() -> None:
    # The SDK's precedence: --cache_dir wins even when it names a plain directory.
    env = {"NEURON_CC_FLAGS": "--cache_dir=/fsx/cache", "NEURON_COMPILE_CACHE_URL": URL}
    assert cache_url(env) == "/fsx/cache"
    assert ClientConfig.from_env(env) is None
    assert not wants_neffcache(env)


def test_unbalanced_quotes_in_flags_do_not_raise() -> None:
    env = {"NEURON_CC_FLAGS": f"--cache_dir={URL} --tensorizer-options='--foo"}
    assert cache_url(env) == URL


@pytest.mark.parametrize(
    "url",
    ["/var/tmp/neuron-compile-cache", "s3://bucket/prefix", "file:///tmp/x", "http://h:1/ns"],
)
def test_other_urls_leave_the_stock_cache_alone(url: str) -> None:
    for env in ({"NEFFCACHE_URL": url}, {"NEURON_COMPILE_CACHE_URL": url}):
        assert ClientConfig.from_env(env) is None
        assert not wants_neffcache(env)


# --- malformed neffcache URLs ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("neffcache+ftp://host:1/ns", "neffcache+http://HOST:PORT/NAMESPACE"),
        ("neffcache+host:1/ns", "neffcache+http://HOST:PORT/NAMESPACE"),
        ("neffcache+http://host:8787", "namespace"),
        ("neffcache+http://host:8787/", "namespace"),
        ("neffcache+http:///ns", "namespace"),
        ("neffcache+http://host:8787/Team_A", "lowercase"),
        ("neffcache+http://host:8787/team a", "lowercase"),
        ("neffcache+http://host:8787/a/b", "one namespace"),
        ("neffcache+http://host:8787/-team", "namespace"),
    ],
)
def test_malformed_url_is_a_config_error_naming_the_fix(url: str, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ClientConfig.from_env({"NEFFCACHE_URL": url})
    message = str(caught.value)
    assert repr(url) in message
    assert needle in message
    assert "neffcache+http" in message  # an example of the right form
    assert wants_neffcache({"NEFFCACHE_URL": url})  # still "wants" it: the hook reports


def test_parse_url_keeps_https_and_strips_a_trailing_slash() -> None:
    assert parse_url("neffcache+https://c.example:443/ns-1.x_y/") == (
        "https://c.example:443",
        "ns-1.x_y",
    )


# --- numbers and flags ----------------------------------------------------------------


def test_defaults() -> None:
    config = ClientConfig.from_env({"NEFFCACHE_URL": URL})
    assert config is not None
    assert config.local_dir == DEFAULT_LOCAL_DIR
    assert (config.connect_timeout, config.timeout, config.backoff, config.publish_wait) == (
        2.0,
        10.0,
        60.0,
        30.0,
    )
    assert config.token is None
    assert config.real_compiler is None
    assert config.run_manifest is None
    assert config.stock_failures is False


def test_every_setting_is_read(tmp_path: Path) -> None:
    env = {
        "NEFFCACHE_URL": URL,
        "NEFFCACHE_TOKEN": "secret",
        "NEFFCACHE_LOCAL_DIR": str(tmp_path),
        "NEFFCACHE_CONNECT_TIMEOUT": "0.5",
        "NEFFCACHE_TIMEOUT": "3",
        "NEFFCACHE_BACKOFF": "0",
        "NEFFCACHE_PUBLISH_WAIT": "1e1",
        "NEFFCACHE_REAL_COMPILER": "/opt/neuronx-cc",
        "NEFFCACHE_RUN_MANIFEST": str(tmp_path / "run.jsonl"),
        "NEFFCACHE_STOCK_FAILURES": "yes",
    }
    config = ClientConfig.from_env(env)
    assert config is not None
    assert config.token == "secret"
    assert config.local_dir == str(tmp_path)
    assert (config.connect_timeout, config.timeout, config.backoff, config.publish_wait) == (
        0.5,
        3.0,
        0.0,
        10.0,
    )
    assert config.real_compiler == "/opt/neuronx-cc"
    assert config.run_manifest == str(tmp_path / "run.jsonl")
    assert config.stock_failures is True


@pytest.mark.parametrize(
    "name",
    [
        "NEFFCACHE_CONNECT_TIMEOUT",
        "NEFFCACHE_TIMEOUT",
        "NEFFCACHE_BACKOFF",
        "NEFFCACHE_PUBLISH_WAIT",
    ],
)
@pytest.mark.parametrize("raw", ["-1", "nan", "NaN", "inf", "-inf", "1e400", "ten", "1s"])
def test_bad_seconds_are_config_errors(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ClientConfig.from_env({"NEFFCACHE_URL": URL, name: raw})
    assert name in str(caught.value)
    assert repr(raw) in str(caught.value)


def test_a_bad_number_without_a_neffcache_url_is_ignored() -> None:
    # Nothing is read when neffcache is not on: a stock user's typo must not matter.
    assert ClientConfig.from_env({"NEFFCACHE_TIMEOUT": "ten"}) is None


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", " 1 "])
def test_disable(value: str) -> None:
    assert ClientConfig.from_env({"NEFFCACHE_URL": URL, "NEFFCACHE_DISABLE": value}) is None


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off", "OFF"])
def test_disable_off_values(value: str) -> None:
    assert ClientConfig.from_env({"NEFFCACHE_URL": URL, "NEFFCACHE_DISABLE": value}) is not None


def test_disable_wins_over_a_malformed_url() -> None:
    env = {"NEFFCACHE_URL": "neffcache+ftp://x", "NEFFCACHE_DISABLE": "1"}
    assert ClientConfig.from_env(env) is None


def test_from_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL", "NEFFCACHE_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NEFFCACHE_URL", URL)
    config = ClientConfig.from_env()
    assert config is not None
    assert config.namespace == "team-a"


# --- the .pth line --------------------------------------------------------------------

_PROBE = """
import json, sys
exec(open(sys.argv[1]).read())
hook = sys.modules.get("neffcache.client.hook")
print(json.dumps({
    "autohook": "neffcache.client._autohook" in sys.modules,
    "config": "neffcache.client.config" in sys.modules,
    "any_neffcache": sorted(m for m in sys.modules if m.startswith("neffcache")),
    "armed": hook is not None and hook._FINDER in sys.meta_path,
    "typos": "neffcache.client._typos" in sys.modules,
}))
"""

_URL_VARS = (
    "NEFFCACHE_URL",
    "NEURON_CC_FLAGS",
    "NEURON_COMPILE_CACHE_URL",
    "NEFFCACHE_DISABLE",
    CHECKED,
)


def _run_pth(env_extra: dict[str, str]) -> dict[str, object]:
    """Exec the repo's .pth line in ``python -S`` (no site: no installed .pth runs)."""
    env = {k: v for k, v in os.environ.items() if k not in _URL_VARS}
    roots = [str(REPO / "keying"), str(REPO / "client"), str(REPO / "server")]
    env["PYTHONPATH"] = os.pathsep.join([*roots, *site.getsitepackages()])
    env.update(env_extra)
    done = subprocess.run(
        [sys.executable, "-S", "-c", _PROBE, str(PTH)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_pth_is_one_import_line() -> None:
    lines = PTH.read_text().splitlines()
    assert len(lines) == 1
    # site.py executes only the lines that start with "import".
    assert lines[0].startswith("import ")


@pytest.mark.e2e
def test_pth_without_a_url_imports_nothing_of_neffcache() -> None:
    result = _run_pth({"NEURON_CC_FLAGS": "--model-type=transformer"})
    assert result["any_neffcache"] == []
    assert result["config"] is False
    assert result["autohook"] is False


@pytest.mark.e2e
@pytest.mark.parametrize(
    "env",
    [
        {"NEFFCACHE_URL": URL},
        {"NEURON_CC_FLAGS": f"--model-type=transformer --cache_dir={URL}"},
        {"NEURON_COMPILE_CACHE_URL": URL},
    ],
)
def test_pth_with_a_url_arms_the_hook(env: dict[str, str]) -> None:
    result = _run_pth(env)
    assert result["autohook"] is True
    assert result["armed"] is True
    assert result["typos"] is False  # right settings cost no check beyond string tests


@pytest.mark.e2e
def test_pth_with_a_directory_url_imports_nothing() -> None:
    result = _run_pth({"NEURON_COMPILE_CACHE_URL": "s3://bucket/prefix"})
    assert result["any_neffcache"] == []


@pytest.mark.e2e
@pytest.mark.parametrize("value", ["1", "yes", "TRUE"])
def test_pth_with_disable_still_arms(value: str) -> None:
    # Disabled means "the stock cache on L1", which needs the hook: unarmed, the SDK
    # would make a directory named after the neffcache+ URL (test_unit_hook checks
    # what the armed hook hands out then).
    result = _run_pth({"NEFFCACHE_URL": URL, "NEFFCACHE_DISABLE": value})
    assert result["armed"] is True


@pytest.mark.e2e
@pytest.mark.parametrize("value", ["0", "false", "off", ""])
def test_pth_with_disable_off_values_still_arms(value: str) -> None:
    # As ClientConfig reads NEFFCACHE_DISABLE: the hook and the wrapper agree.
    result = _run_pth({"NEFFCACHE_URL": URL, "NEFFCACHE_DISABLE": value})
    assert result["armed"] is True


@pytest.mark.e2e
def test_pth_with_a_malformed_url_does_not_break_start_up() -> None:
    result = _run_pth({"NEFFCACHE_URL": "neffcache+ftp://nowhere"})
    # The URL is checked when libneuronxla asks for a cache, not at start-up.
    assert result["autohook"] is True


# --- mistyped settings: one line per process ---------------------------------------------

TYPOS = [
    {"NEFFCACHE_URL": "neffcache://cache.internal:8787/team-a"},
    {"NEFFCACHE_URL": "NEFFCACHE+HTTP://cache.internal:8787/team-a"},
    {"NEFFCACHE_URL": f" {URL}"},
    {"NEFFCACHE_URL": f"'{URL}'"},
    {"NEURON_COMPILE_CACHE_URL": "http://cache.internal:8787/team-a"},
    {"NEURON_CC_FLAGS": f"--cache-dir={URL} -O1"},
    {"NEURON_CC_FLAGS": f"--cache_dir='{URL}'"},
    {"NEURON_CC_FLAGS": f"-O1 {URL}"},
]


@pytest.mark.parametrize("env", TYPOS)
def test_each_typo_is_one_line_for_a_process_and_its_children(
    env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    env = dict(env)  # this process's environment, marked as it is checked
    warn_typos_once(env)
    warn_typos_once(env)  # the hook, the graph after
    child = dict(env)  # the shim, the compiler it runs: the environment inherited
    warn_typos_once(child)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("neffcache: "), line
    assert "(fix: " in line
    assert "\n" not in line


def test_a_child_with_a_mistake_of_its_own_is_told(caplog: pytest.LogCaptureFixture) -> None:
    env = dict(TYPOS[0])
    warn_typos_once(env)
    child = {**env, "NEURON_COMPILE_CACHE_URL": "https://other.internal/team-b"}
    warn_typos_once(child)
    # Settings that changed but call for the same line (the hook exports NEFFCACHE_URL
    # when the SDK hands it one): nothing new to say.
    same = {**env, "NEFFCACHE_TOKEN": "x", "NEURON_CC_FLAGS": "-O1"}
    warn_typos_once(same)
    first, second = [r.getMessage() for r in caplog.records]
    assert "NEURON_COMPILE_CACHE_URL" not in first
    assert "NEURON_COMPILE_CACHE_URL=neffcache+https://other.internal/team-b" in second


@pytest.mark.parametrize(
    "env",
    [
        {"NEFFCACHE_URL": URL, "NEURON_COMPILE_CACHE_URL": "s3://bucket/prefix"},
        {"NEURON_COMPILE_CACHE_URL": "neffcache+https://neffcache.internal/team-a"},
        {"NEURON_CC_FLAGS": "--cache_dir=neffcache+http://neffcache.internal:8787/team-a -O1"},
        {"NEURON_CC_FLAGS": "--cache_dir neffcache+http://neffcache.internal:8787/team-a"},
        {"NEURON_CC_FLAGS": "--model-type=transformer", "NEURON_COMPILE_CACHE_URL": "/fsx/c"},
    ],
)
def test_right_settings_are_not_suspected(env: dict[str, str]) -> None:
    env = dict(env)
    assert not typos_suspected(env)
    warn_typos_once(env)
    assert CHECKED not in env  # nothing checked further, nothing imported


_PARENT = """
import os, subprocess, sys, types
exec(open(sys.argv[1]).read())  # the .pth line, as site runs it at start-up
from neffcache.client.hook import _replacement
create_compile_cache = _replacement(lambda url, *args, **kwargs: None)
create_compile_cache(types.SimpleNamespace(url="/var/tmp/cache"))  # the SDK asks
shim = [sys.executable, "-S", "-c", sys.argv[2], sys.argv[1]]
subprocess.run(shim, check=True)  # the shim the SDK runs: the environment inherited
alone = {k: v for k, v in os.environ.items() if k != "NEFFCACHE_TYPOS_CHECKED"}
subprocess.run([*shim, "alone"], env=alone, check=True)  # a shim of another parent
os.environ["NEURON_COMPILE_CACHE_URL"] = "http://cache.internal:8787/team-a"  # set late
create_compile_cache(types.SimpleNamespace(url="/var/tmp/cache"))
"""
_SHIM = """
import sys
if sys.argv[-1] != "alone":
    exec(open(sys.argv[1]).read())  # a shim is a Python script: the .pth line runs
from neffcache.client.wrapper import main
assert main(["/bin/true", "--version"]) == 0
"""


@pytest.mark.e2e
def test_the_pth_line_the_hook_and_the_shim_say_a_typo_once() -> None:
    env = {k: v for k, v in os.environ.items() if k not in _URL_VARS}
    roots = [str(REPO / "keying"), str(REPO / "client"), str(REPO / "server")]
    env["PYTHONPATH"] = os.pathsep.join([*roots, *site.getsitepackages()])
    env["NEFFCACHE_URL"] = "neffcache://cache.internal:8787/team-a"
    done = subprocess.run(
        [sys.executable, "-S", "-c", _PARENT, str(PTH), _SHIM],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    fix = "(fix: NEFFCACHE_URL=neffcache+http://cache.internal:8787/team-a)"
    # The parent at start-up; the shim of another parent; the hook for the late setting.
    assert len(lines) == 3, lines
    assert lines[0] == lines[1]
    assert lines[0].startswith("neffcache: NEFFCACHE_URL neffcache://")
    assert fix in lines[0]
    assert "NEURON_COMPILE_CACHE_URL=neffcache+http://" in lines[2]
