"""Unit tests for ``neffcache.client.hook`` with the stand-in ``libneuronxla``.

The hook changes ``sys.meta_path`` and patches modules, so every scenario runs in a
child interpreter (with tests/standins on its path) that prints what it saw as JSON;
each child runs once per module and the tests read its report.
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
from loopback import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins"
VERSION = "2.20.9961.0+0acef03a"

_COMMON = """
import json, os, sys

def bindings():
    found = {}
    for name, module in sorted(sys.modules.items()):
        if module is None or not name.startswith("libneuronxla"):
            continue
        if hasattr(module, "create_compile_cache"):
            value = module.create_compile_cache
            found[name] = bool(getattr(value, "__neffcache_patched__", False))
    return found
"""

_INSTALL_FIRST = (
    _COMMON
    + """
from neffcache.client import hook
hook.install()
hook.install()
import libneuronxla
from libneuronxla import neuron_cc_cache as ncc, neuron_cc_wrapper
report = {"bindings": bindings()}
report["finders"] = sum(1 for f in sys.meta_path if f is hook._FINDER)
original = neuron_cc_wrapper.create_compile_cache.__wrapped__
report["wrapped_is_stock"] = not hasattr(original, "__neffcache_patched__")
report["one_replacement"] = len({id(libneuronxla.create_compile_cache),
                                 id(ncc.create_compile_cache),
                                 id(neuron_cc_wrapper.create_compile_cache)}) == 1
plain_dir = sys.argv[1]
cache = neuron_cc_wrapper.create_compile_cache(ncc.CacheUrl(plain_dir))
report["plain"] = {"type": type(cache).__name__, "exact": type(cache) is ncc.CompileCacheFs,
                   "cache_path": cache.cache_path}

os.environ["NEURON_COMPILE_CACHE_URL"] = sys.argv[2]
url = ncc.CacheUrl.get_cache_url()
cache = neuron_cc_wrapper.create_compile_cache(url)
entry, key = cache.get_cache_dir("123", ["--target=trn1"])
probe = os.path.join(entry, "model.done")
report["neffcache"] = {
    "type": type(cache).__name__,
    "is_compile_cache": isinstance(cache, ncc.CompileCache),
    "is_fs": isinstance(cache, ncc.CompileCacheFs),
    "cache_path": cache.cache_path,
    "entry": entry,
    "exists": cache.exists(probe),
    "hlos": [list(x) for x in cache.get_hlos()],
}
del os.environ["NEURON_COMPILE_CACHE_URL"]

os.environ["NEFFCACHE_URL"] = "neffcache+ftp://nowhere/team-a"
cache = ncc.create_compile_cache(ncc.CacheUrl.get_cache_url())
report["malformed"] = {"type": type(cache).__name__,
                       "exact": type(cache) is ncc.CompileCacheFs,
                       "cache_path": cache.cache_path}
report["cwd"] = sorted(os.listdir("."))
print(json.dumps(report))
"""
)

_IMPORT_FIRST = (
    _COMMON
    + """
import libneuronxla
import libneuronxla.neuron_cc_wrapper
from neffcache.client import hook
report = {"before": bindings()}
hook.install()
report["after"] = bindings()
report["again"] = hook.patch_loaded()
print(json.dumps(report))
"""
)


def run_child(script: str, cwd: Path, *args: str) -> dict[str, Any]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NEFFCACHE_", "NEURON_")) and k != "PYTHONPATH"
    }
    roots = [str(STANDINS)] + [str(REPO / d) for d in ("keying", "client", "server")]
    # -S below: the installed neffcache_hook.pth arms every interpreter now, and these
    # tests arm the hook themselves; the site directories come back through PYTHONPATH.
    env["PYTHONPATH"] = os.pathsep.join([*roots, *site.getsitepackages()])
    env["PATH"] = os.pathsep.join([str(STANDINS), env.get("PATH", "")])  # the stand-in compiler
    env["NEFFCACHE_LOCAL_DIR"] = str(cwd.parent / "l1")
    env["NEFFCACHE_BACKOFF"] = "60"
    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-S", "-c", script, *args],
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
    report["_local_dir"] = env["NEFFCACHE_LOCAL_DIR"]
    return report


@pytest.fixture(scope="module")
def install_first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("hook-install-first")
    url = f"neffcache+http://127.0.0.1:{free_port()}/team-a"
    return run_child(_INSTALL_FIRST, base / "cwd", str(base / "plain"), url)


@pytest.fixture(scope="module")
def import_first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_child(_IMPORT_FIRST, tmp_path_factory.mktemp("hook-import-first") / "cwd")


def test_every_binding_is_patched_on_import(install_first: dict[str, Any]) -> None:
    bindings = install_first["bindings"]
    assert {"libneuronxla", "libneuronxla.neuron_cc_cache", "libneuronxla.neuron_cc_wrapper"} <= (
        set(bindings)
    )
    assert all(bindings.values()), bindings
    assert install_first["one_replacement"]
    assert install_first["wrapped_is_stock"]
    assert install_first["finders"] == 1  # install() is idempotent


def test_install_after_import_patches_too(import_first: dict[str, Any]) -> None:
    assert import_first["before"]
    assert not any(import_first["before"].values())
    assert set(import_first["after"]) == set(import_first["before"])
    assert all(import_first["after"].values()), import_first["after"]
    assert import_first["again"] == 0


def test_a_plain_directory_gets_the_stock_cache(
    install_first: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    plain = install_first["plain"]
    assert plain["exact"], plain
    assert plain["cache_path"].endswith("/plain")


def test_a_neffcache_url_gets_the_server_backed_cache_on_l1(
    install_first: dict[str, Any],
) -> None:
    cache = install_first["neffcache"]
    assert cache["type"] == "NeffcacheCompileCache"
    assert cache["is_compile_cache"]
    assert cache["cache_path"] == install_first["_local_dir"]
    # The SDK's own path building lands in L1, under the stock layout.
    assert cache["entry"] == os.path.join(
        install_first["_local_dir"], f"neuronxcc-{VERSION}", "MODULE_123+e30acd3a"
    )
    assert cache["exists"] is False  # nothing there, and the server does not answer
    assert cache["hlos"] == [[], [], [], []]
    assert not any(name.startswith("neffcache+") for name in install_first["cwd"])
    assert install_first["cwd"] == []


def test_a_malformed_url_falls_back_to_the_stock_cache(install_first: dict[str, Any]) -> None:
    malformed = install_first["malformed"]
    assert malformed["exact"], malformed
    assert not malformed["cache_path"].startswith("neffcache+")
    assert "neffcache+ftp" in install_first["_stderr"]  # the reason is reported


def test_a_malformed_url_falls_back_to_the_configured_l1(install_first: dict[str, Any]) -> None:
    assert install_first["malformed"]["cache_path"] == install_first["_local_dir"]
