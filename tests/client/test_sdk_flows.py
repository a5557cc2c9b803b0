"""Unit tests: what real sessions do to libneuronxla's cache
(docs/neuron-sdk.md#the-libneuronxla-path-in-practice) and what the hook makes of it.

The URL comparison of the ``NEFFCACHE_URL`` override runs in-process on explicit
environments. Everything that imports ``libneuronxla`` runs in a ``python -S`` child
that executes the repository's ``neffcache_hook.pth`` line first, as ``site`` does at
start-up (so the installed copy is not what arms the hook), with the stand-in
``libneuronxla`` on its path and a private ``NEFFCACHE_LOCAL_DIR``; the child prints
one JSON report.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from neffcache.client.config import DEFAULT_LOCAL_DIR, location, overridden, sdk_urls

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins"
PTH = REPO / "client" / "neffcache_hook.pth"
URL = "neffcache+http://127.0.0.1:9/team-a"  # port 9: nothing answers

# --- the override's comparison ---------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("/fsx/cache", "/fsx/cache/"),
        ("/fsx/cache", "file:///fsx/cache"),
        ("file:///fsx/cache/", "/fsx/cache"),
        ("/fsx//cache/./", "/fsx/cache"),
        ("s3://bucket/prefix/", "s3://bucket/prefix"),
    ],
)
def test_spellings_of_one_location_compare_equal(a: str, b: str) -> None:
    assert location(a) == location(b)


def test_home_and_relative_paths_are_resolved(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert location("~/cache") == location(str(tmp_path / "cache")) == location("cache/")


def test_sdk_urls_name_every_location_the_sdk_settings_give() -> None:
    env = {
        "NEFFCACHE_URL": URL,
        "NEURON_CC_FLAGS": "--cache_dir=/from/flags -O1",
        "NEURON_COMPILE_CACHE_URL": "/from/variable",
    }
    assert sdk_urls(env) == ["/from/flags", "/from/variable", DEFAULT_LOCAL_DIR]
    assert sdk_urls({}) == [DEFAULT_LOCAL_DIR]


@pytest.mark.parametrize(
    ("sdk", "caller"),
    [
        ({"NEURON_COMPILE_CACHE_URL": "file:///fsx/cache/"}, "/fsx/cache"),
        ({"NEURON_CC_FLAGS": "--cache_dir=/fsx/cache"}, "file:///fsx/cache/"),
        # optimum-neuron passes its own default while the variable names another place.
        ({"NEURON_COMPILE_CACHE_URL": "/fsx/cache"}, f"{DEFAULT_LOCAL_DIR}/"),
        ({}, DEFAULT_LOCAL_DIR),
    ],
)
def test_neffcache_url_overrides_the_sdk_locations_however_spelled(
    sdk: dict[str, str], caller: str
) -> None:
    assert overridden(caller, {"NEFFCACHE_URL": URL, **sdk})
    assert not overridden(caller, sdk)  # only when the user asked for it


def test_a_directory_named_for_itself_is_not_overridden() -> None:
    env = {"NEFFCACHE_URL": URL, "NEURON_COMPILE_CACHE_URL": "/fsx/cache"}
    assert not overridden("/fsx/other", env)
    assert not overridden("", env)


# --- the hook, in child interpreters ---------------------------------------------------

_PRELUDE = """
import json, os, sys
exec(open(sys.argv[1]).read())  # the .pth line, as site runs it at start-up
report = {"at_start": sorted(m for m in sys.modules if m.startswith("neffcache"))}
"""

_SCENARIOS = {
    # A URL set after start-up, after the import (the SDK's caching page).
    "late_url": """
import libneuronxla
from libneuronxla import neuron_cc_cache as ncc
os.environ["NEURON_COMPILE_CACHE_URL"] = URL
cache = libneuronxla.create_compile_cache(ncc.CacheUrl.get_cache_url())
report.update(type=type(cache).__name__, cache_path=cache.cache_path)
""",
    # Stock constructors called directly with a neffcache URL (optimum's sessions).
    "constructors": """
from neffcache.client import hook
from libneuronxla import neuron_cc_cache as ncc
os.environ["NEURON_COMPILE_CACHE_URL"] = URL
fs = ncc.CompileCacheFs(ncc.CacheUrl.get_cache_url())
base = ncc.CompileCache(ncc.CacheUrl(URL))
plain = ncc.CompileCacheFs(ncc.CacheUrl(os.path.abspath("plain")))
report.update(fs=[type(fs).__name__, fs.cache_path], base=base.cache_path,
              plain=plain.cache_path, again=hook.guard_constructors())
""",
    # optimum's patch_everywhere, then a compile through the SDK.
    "optimum_session": """
import libneuronxla
from libneuronxla import neuron_cc_cache as ncc
os.environ["NEURON_COMPILE_CACHE_URL"] = URL
def create_compile_cache(cache_url):
    return ncc.CompileCacheFs(cache_url)
for name, module in list(sys.modules.items()):
    if name.startswith("libneuronxla") and hasattr(module, "create_compile_cache"):
        module.create_compile_cache = create_compile_cache
neff = libneuronxla.neuron_xla_compile(b"module", ["--model-type=transformer"])
l1 = os.environ["NEFFCACHE_LOCAL_DIR"]
report.update(neff=len(neff), entries=sorted(
    os.path.relpath(d, l1) for d, _, files in os.walk(l1) if "model.done" in files))
""",
    # neuron_parallel_compile's hand-off of L1's path, the URL in the environment.
    "l1_handed": """
from libneuronxla import neuron_cc_cache as ncc
os.environ["NEURON_COMPILE_CACHE_URL"] = URL
l1 = os.environ["NEFFCACHE_LOCAL_DIR"] + "/"
cache = ncc.create_compile_cache(ncc.CacheUrl.get_cache_url(l1))
report.update(type=type(cache).__name__)
""",
    # The same path with no neffcache URL anywhere: a directory like any other.
    "l1_without_url": """
from libneuronxla import neuron_cc_cache as ncc
cache = ncc.create_compile_cache(ncc.CacheUrl.get_cache_url(os.environ["NEFFCACHE_LOCAL_DIR"]))
report.update(type=type(cache).__name__)
""",
    # The URL handed over by a trial run that alone set it (NxD under the tool).
    "url_handed": """
from libneuronxla import neuron_cc_cache as ncc
cache = ncc.create_compile_cache(ncc.CacheUrl.get_cache_url(URL))
report.update(type=type(cache).__name__, cache_path=cache.cache_path,
              exported=os.environ.get("NEFFCACHE_URL"))
""",
    "url_handed_disabled": """
from libneuronxla import neuron_cc_cache as ncc
os.environ["NEFFCACHE_DISABLE"] = "1"
cache = ncc.create_compile_cache(ncc.CacheUrl.get_cache_url(URL))
report.update(type=type(cache).__name__, cache_path=cache.cache_path,
              exported=os.environ.get("NEFFCACHE_URL"))
""",
    # A pool worker's exit waits for its background publishes (its atexit never runs).
    "pool_worker": """
from concurrent.futures import ProcessPoolExecutor
from libneuronxla import neuron_cc_cache as ncc

class Publisher:  # stands in for the proxy's: records that the exit flushed it
    def flush(self):
        with open(os.path.join(os.environ["TMPDIR"], f"flushed-{os.getpid()}"), "w"):
            pass

def work(url):
    cache = ncc.create_compile_cache(url)
    from neffcache.client import proxy
    proxy._the_publisher[:] = [Publisher()]
    return type(cache).__name__, os.getpid()

with ProcessPoolExecutor(1) as pool:
    kind, pid = pool.submit(work, ncc.CacheUrl(URL)).result()
flushed = os.path.exists(os.path.join(os.environ["TMPDIR"], f"flushed-{pid}"))
report.update(type=kind, flushed=flushed)
""",
    # optimum's default path while NEFFCACHE_URL overrides a variable naming elsewhere.
    "override_default": """
from libneuronxla import neuron_cc_cache as ncc
os.environ.update(NEFFCACHE_URL=URL, NEURON_COMPILE_CACHE_URL=os.path.abspath("sdk"))
default = ncc.create_compile_cache(ncc.CacheUrl.get_cache_url("/var/tmp/neuron-compile-cache/"))
other = ncc.create_compile_cache(ncc.CacheUrl.get_cache_url(os.path.abspath("other")))
report.update(default=type(default).__name__, other=type(other).__name__)
""",
}


def run_scenario(name: str, tmp_path: Path, *, importable: bool = True) -> dict[str, Any]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NEFFCACHE_", "NEURON_")) and k != "PYTHONPATH"
    }
    roots = [str(REPO / d) for d in ("keying", "client", "server")] if importable else []
    env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), *roots, *site.getsitepackages()])
    env["PATH"] = os.pathsep.join([str(STANDINS), env.get("PATH", "")])  # the compiler
    env["NEFFCACHE_LOCAL_DIR"] = str(tmp_path / "l1")
    env["TMPDIR"] = str(tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    script = f"URL = {URL!r}\n{_PRELUDE}{_SCENARIOS[name]}\nprint(json.dumps(report))\n"
    done = subprocess.run(
        [sys.executable, "-S", "-c", script, str(PTH)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    report["_stderr"] = done.stderr
    strays = [str(p) for p in tmp_path.rglob("*") if "neffcache+" in p.name]
    assert not strays, f"a neffcache+ URL was used as a directory: {strays}"
    return report


@pytest.mark.e2e
def test_a_url_set_after_the_import_is_served(tmp_path: Path) -> None:
    report = run_scenario("late_url", tmp_path)
    assert report["at_start"] == []  # no URL at start-up: nothing of neffcache imported
    assert report["type"] == "NeffcacheCompileCache"
    assert report["cache_path"] == str(tmp_path / "l1")


@pytest.mark.e2e
def test_stock_constructors_build_a_neffcache_url_on_l1(tmp_path: Path) -> None:
    report = run_scenario("constructors", tmp_path)
    assert report["fs"] == ["CompileCacheFs", str(tmp_path / "l1")]
    assert report["base"] == str(tmp_path / "l1")
    assert report["plain"] == str(tmp_path / "cwd" / "plain")
    assert report["again"] == 0  # guarded once


@pytest.mark.e2e
def test_an_optimum_session_compiles_into_l1(tmp_path: Path) -> None:
    report = run_scenario("optimum_session", tmp_path)
    assert report["neff"] > 0
    assert len(report["entries"]) == 1, report["entries"]
    assert report["entries"][0].startswith("neuronxcc-")


@pytest.mark.e2e
def test_l1s_path_handed_over_gets_neffcache_cache(tmp_path: Path) -> None:
    assert run_scenario("l1_handed", tmp_path)["type"] == "NeffcacheCompileCache"


@pytest.mark.e2e
def test_l1s_path_without_a_neffcache_url_is_a_plain_directory(tmp_path: Path) -> None:
    assert run_scenario("l1_without_url", tmp_path)["type"] == "CompileCacheFs"


@pytest.mark.e2e
def test_a_url_handed_over_is_served_and_exported(tmp_path: Path) -> None:
    report = run_scenario("url_handed", tmp_path)
    assert report["type"] == "NeffcacheCompileCache"
    assert report["cache_path"] == str(tmp_path / "l1")
    assert report["exported"] == URL  # for the pool and the shim under it


@pytest.mark.e2e
def test_a_url_handed_over_while_disabled_is_l1_and_not_exported(tmp_path: Path) -> None:
    report = run_scenario("url_handed_disabled", tmp_path)
    assert report["type"] == "CompileCacheFs"
    assert report["cache_path"] == str(tmp_path / "l1")
    assert report["exported"] is None


@pytest.mark.e2e
def test_neffcache_url_overrides_a_caller_supplied_default_path(tmp_path: Path) -> None:
    report = run_scenario("override_default", tmp_path)
    assert report["default"] == "NeffcacheCompileCache"
    assert report["other"] == "CompileCacheFs"


@pytest.mark.e2e
def test_libneuronxla_imports_when_neffcache_cannot(tmp_path: Path) -> None:
    report = run_scenario("l1_without_url", tmp_path, importable=False)
    assert report["type"] == "CompileCacheFs"
    assert "neffcache: the persistent-cache hook is off" in report["_stderr"]


@pytest.mark.e2e
def test_a_pool_worker_flushes_its_publishes_at_exit(tmp_path: Path) -> None:
    report = run_scenario("pool_worker", tmp_path)
    assert report["type"] == "NeffcacheCompileCache"
    assert report["flushed"] is True
