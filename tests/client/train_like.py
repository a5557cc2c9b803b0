"""A training-like run for the client's end-to-end tests (not collected by pytest).

It does what a transformers-neuronx-style caller does (path B of
docs/neuron-sdk.md#where-the-cache-sits, and #neuronx-cc-invocation-and-outputs): import
``libneuronxla`` (the stand-in at tests/standins/libneuronxla when PYTHONPATH points
there) and, for each HLO file named on the command line, call

    libneuronxla.neuron_xla_compile(module_bytes, ["--model-type=transformer"],
                                    platform_target="trn1", cache_dir=None)

The cache location comes from the environment only (``NEURON_COMPILE_CACHE_URL``,
``NEURON_CC_FLAGS``, ``NEFFCACHE_URL``); nothing neffcache-specific is imported here:
the client's import hook has to find this process by itself.

Output: graph ``i`` of file ``NAME.pb`` goes to ``OUT/<i>-<NAME>.neff``, and one JSON line
per graph on stdout: ``{"index", "name", "seconds", "bytes"}``, where ``seconds`` is
the wall time of the ``neuron_xla_compile`` call.

``--pause-after N --ready FILE --resume FILE``: after graph N completes, create FILE
(ready) and wait (up to ``--pause-timeout`` s, then exit 3) until the resume file
exists; tests use this to change the world (kill the server) between graphs.

What real sessions do after start-up (docs/neuron-sdk.md#the-libneuronxla-path-in-practice):

* ``--set-env NAME=VALUE`` sets ``os.environ[NAME]`` in the script, and
  ``--append-env NAME=VALUE`` appends `` VALUE`` to it: NxD Training exports
  ``NEURON_COMPILE_CACHE_URL`` from its YAML and appends to ``NEURON_CC_FLAGS``
  inside each worker; the SDK's caching page sets ``os.environ`` in the script. Done
  before ``import libneuronxla``, or after it with ``--env-after-import``.
* ``--optimum-session``: optimum-neuron's training/export session: after the import,
  ``create_compile_cache`` is replaced in every ``libneuronxla`` module
  (``patch_everywhere``) by a function that builds ``CompileCacheFs(url)`` /
  ``CompileCacheS3(url)`` directly from the URL the SDK resolved, wrapped in a Hub-style
  proxy (``cache_type = "hf"``; the Hub itself is left out).
* ``--cache-dir DIR``: passed as ``cache_dir=`` to ``neuron_xla_compile``, as callers
  that resolve the cache location themselves do (optimum-neuron's default path).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

FLAGS = ["--model-type=transformer"]
EXIT_PAUSE_TIMEOUT = 3


def _pause(ready: Path, resume: Path, timeout: float) -> bool:
    ready.touch()
    deadline = time.monotonic() + timeout
    while not resume.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _set_environment(settings: list[str], appends: list[str]) -> None:
    for setting in settings:
        name, _, value = setting.partition("=")
        os.environ[name] = value
    for setting in appends:
        name, _, value = setting.partition("=")
        os.environ[name] = f"{os.environ.get(name, '')} {value}".strip()


# The CompileCache methods the stand-in SDK calls; the Hub-style proxy hands each to
# the stock cache it wraps (optimum's adds Hub fall-backs to the downloads).
_DELEGATED = (
    "get_cache_dir",
    "get_cache_dir_with_cache_key",
    "exists",
    "download_file",
    "download_file_to_string",
    "download_folder",
    "upload_file",
    "upload_folder",
    "upload_string_to_file",
    "remove",
    "get_hlos",
    "hlo_acquire_lock",
    "hlo_release_lock",
    "try_lookup_for_compile",
)


def _delegate(name: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.default_cache, name)(*args, **kwargs)

    return method


def _optimum_session() -> None:
    """optimum-neuron's ``patch_everywhere("create_compile_cache", ..., "libneuronxla")``
    with a function that never calls the SDK's own ``create_compile_cache``."""
    from libneuronxla.neuron_cc_cache import CompileCache, CompileCacheFs, CompileCacheS3

    def init(self: Any, default_cache: Any) -> None:
        CompileCache.__init__(self, default_cache.cache_url)
        self.cache_type = "hf"
        self.default_cache = default_cache

    methods = {name: _delegate(name) for name in _DELEGATED}
    hub_proxy = type("CompileCacheHubStyleProxy", (CompileCache,), {"__init__": init, **methods})

    def create_compile_cache(cache_url: Any) -> Any:
        stock = CompileCacheS3(cache_url) if cache_url.is_s3() else CompileCacheFs(cache_url)
        return hub_proxy(stock)

    for name, module in list(sys.modules.items()):
        if name.startswith("libneuronxla") and hasattr(module, "create_compile_cache"):
            module.create_compile_cache = create_compile_cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("hlo", nargs="+", type=Path, help="serialized HloModuleProto files")
    parser.add_argument("--out", type=Path, required=True, help="directory for the NEFFs")
    parser.add_argument("--pause-after", type=int, default=None)
    parser.add_argument("--ready", type=Path, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--pause-timeout", type=float, default=60.0)
    parser.add_argument("--set-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--append-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--env-after-import", action="store_true")
    parser.add_argument("--optimum-session", action="store_true")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    if args.pause_after is not None and (args.ready is None or args.resume is None):
        parser.error("--pause-after needs --ready and --resume")

    if not args.env_after_import:
        _set_environment(args.set_env, args.append_env)
    import libneuronxla  # the import the client's hook must notice

    if args.env_after_import:
        _set_environment(args.set_env, args.append_env)
    if args.optimum_session:
        _optimum_session()

    args.out.mkdir(parents=True, exist_ok=True)
    for index, path in enumerate(args.hlo):
        module = path.read_bytes()
        start = time.monotonic()
        neff = libneuronxla.neuron_xla_compile(
            module, list(FLAGS), platform_target="trn1", cache_dir=args.cache_dir
        )
        seconds = time.monotonic() - start
        (args.out / f"{index}-{path.stem}.neff").write_bytes(neff)
        record = {"index": index, "name": path.stem, "seconds": seconds, "bytes": len(neff)}
        print(json.dumps(record), flush=True)
        if (
            args.pause_after == index + 1
            and index + 1 < len(args.hlo)
            and not _pause(args.ready, args.resume, args.pause_timeout)
        ):
            print("train_like: nobody resumed the run", file=sys.stderr)
            return EXIT_PAUSE_TIMEOUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
