"""Environment variables and framework versions that can change a compiled NEFF.

Only allowlisted names ever enter a key (sccache CACHED_ENV_VARS): reading the whole
environment would miss on every unrelated variable, and reading none would hit across
settings that change the compiler's output. Each entry says why it is there. A variable
that is set to the empty string counts as unset.

Deliberately left out, with the reason:

* ``NEURON_CC_FLAGS``: parsed into the flags field; hashing it again would make the
  key depend on where a flag was spelled.
* ``NEURON_PLATFORM_TARGET_OVERRIDE``: resolved into the target field.
* ``XLA_HLO_DEBUG``, ``XLA_IR_DEBUG``, ``ENABLE_PYHLO_FILE_METADATA``: they only add
  metadata to the HLO, which the fingerprint ignores (docs/neuron-sdk.md#debug-metadata).
* ``NEURON_COMPILE_CACHE_URL``, ``NEURON_RT_*``: where the cache is, and run-time
  settings that the compiler never reads.
* ``NEURON_EXTRACT_GRAPHS_ONLY``, ``NEURON_FALL_BACK_TO_NULL_NEFF``: libneuronxla's
  (not the compiler's) switches to return placeholder outputs instead of compiling.
  ``neuron_parallel_compile`` sets the first in its own process for the trial run and
  its compile pool inherits it while it compiles for real (Ray's worker does the same
  with both): keyed, every graph the pool compiled would be published under keys the
  training run never has. A placeholder is kept out of the cache where it could enter
  instead: the shim publishes only what the real compiler it ran wrote, and the hook,
  while either variable is set, only an entry the shim resolved (docs/keying.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from ._errors import KeyingError

ENV_ALLOWLIST: Mapping[str, str] = {
    "NEURON_LOGICAL_NC_CONFIG": "logical NeuronCore size; the compiler's --lnc default "
    "follows it on trn2 [guess: keyed so a guess costs a miss, never a wrong NEFF]",
    "XLA_FLAGS": "neuronx-cc runs XLA's HLO passes, which read XLA_FLAGS; the dump "
    "options (--xla_dump_*) are removed first because they only write files",
}

FRAMEWORK_ALLOWLIST: Mapping[str, str] = {
    "nki": "the standalone NKI package lowers NKI kernels referenced by custom calls "
    "at compile time, so its version can change the NEFF for an unchanged HLO",
}


def compile_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Pick the allowlisted, compile-affecting variables out of an environment.

    >>> compile_env({"XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_cpu_fast_math", "HOME": "/root"})
    {'XLA_FLAGS': '--xla_cpu_fast_math'}
    """
    return check_env({name: environ[name] for name in ENV_ALLOWLIST if name in environ})


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """Validate and normalize picked variables; return them sorted, empty ones dropped."""
    checked = _check_mapping(env, ENV_ALLOWLIST, "environment variable", "ENV_ALLOWLIST")
    if "XLA_FLAGS" in checked:
        checked["XLA_FLAGS"] = _without_dump_flags(checked["XLA_FLAGS"])
    return {name: value for name, value in checked.items() if value}


def check_frameworks(frameworks: Mapping[str, str]) -> dict[str, str]:
    """Validate framework name -> version pairs; return them sorted."""
    return _check_mapping(frameworks, FRAMEWORK_ALLOWLIST, "framework", "FRAMEWORK_ALLOWLIST")


def _check_mapping(
    values: Mapping[str, str], allowlist: Mapping[str, str], what: str, table: str
) -> dict[str, str]:
    checked: dict[str, str] = {}
    for name in sorted(values):
        value = values[name]
        if name not in allowlist:
            raise KeyingError(
                f"{what} {name!r} is not one that changes compiled output; "
                f"known: {', '.join(sorted(allowlist))} (add it to {table} with a reason)"
            )
        if not isinstance(value, str):
            raise KeyingError(f"{what} {name!r} must have a string value, got {value!r}")
        if value:
            checked[name] = value
    return checked


def _without_dump_flags(xla_flags: str) -> str:
    try:
        tokens = shlex.split(xla_flags)
    except ValueError as exc:
        raise KeyingError(f"cannot split XLA_FLAGS {xla_flags!r}: {exc}") from exc
    # shlex.join quotes what needs it: '--a="b --c"' must not become '--a=b --c'.
    return shlex.join(token for token in tokens if not token.startswith("--xla_dump"))
