"""``neffcache key HLO_FILE [--compiler-version V] [--target T] [-- FLAG ...]``

Prints the keys of one HLO module as a JSON object: ``key`` (canonical),
``direct_key``, ``fingerprint``, ``neuron_flags_hash`` and ``components``. The
compile-affecting environment variables (``neffcache.keying.ENV_ALLOWLIST``) are read
from this process's environment, as a compile would see them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NamedTuple

from neffcache.keying import (
    TARGETS,
    CacheKey,
    CompileContext,
    KeyInputs,
    check_compiler_version,
    compile_env,
    compiler_version,
    compute_key,
    direct_key,
    fingerprint_hlo,
    neuron_cache_flags,
    neuron_flags_hash,
)

from ._common import CommandError, help_text


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "key",
        help="print the cache keys of an HLO module",
        description=help_text(__doc__),
        usage="neffcache key HLO_FILE [--compiler-version V] [--target T] [-- FLAG ...]",
    )
    parser.add_argument("hlo_file", metavar="HLO_FILE", help="a serialized HloModuleProto")
    add_compile_options(parser)
    parser.set_defaults(run=run)


def add_compile_options(parser: argparse.ArgumentParser) -> None:
    """``--compiler-version`` and ``--target``, shared with ``neffcache explain``."""
    parser.add_argument(
        "--compiler-version",
        metavar="V",
        help="full neuronx-cc build string; default: ask the neuronx-cc on PATH",
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        help="accelerator family; default: a --target flag, else NEURON_PLATFORM_TARGET_OVERRIDE",
    )


class ModuleKey(NamedTuple):
    """The keys of one module in the context the command line and environment give."""

    canonical: CacheKey
    context: CompileContext


def module_key(module: bytes, args: argparse.Namespace, flags: list[str]) -> ModuleKey:
    """The canonical key of ``module`` under ``add_compile_options``' options, the
    compiler flags after ``--`` and this process's allowlisted environment."""
    version = (
        check_compiler_version(args.compiler_version)
        if args.compiler_version
        else compiler_version()
    )
    context = CompileContext.create(
        compiler_version=version,
        target=_target(args.target, flags),
        flags=flags,
        env=compile_env(os.environ),
    )
    return ModuleKey(compute_key(KeyInputs(fingerprint_hlo(module), context)), context)


def run(args: argparse.Namespace, flags: list[str]) -> int:
    module = read_module(args.hlo_file)
    canonical, context = module_key(module, args, flags)
    result = {
        "key": canonical.key,
        "direct_key": direct_key(module, context).key,
        "fingerprint": canonical.components["fingerprint"],
        "neuron_flags_hash": neuron_flags_hash(neuron_cache_flags(flags, context.target)),
        "components": canonical.as_json(),
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def read_module(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from exc


def _target(explicit: str | None, flags: list[str]) -> str:
    if explicit:
        return explicit
    for i, flag in enumerate(flags):
        name, sep, value = flag.partition("=")
        if name == "--target":
            if sep:
                return value
            if i + 1 < len(flags):
                return flags[i + 1]
    override = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "")
    if override:
        return override
    raise CommandError(
        f"no target: pass --target ({', '.join(TARGETS)}) or set NEURON_PLATFORM_TARGET_OVERRIDE"
    )
