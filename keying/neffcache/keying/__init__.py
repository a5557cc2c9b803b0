"""Cache keys for Neuron compilations: pure functions, no I/O but ``compiler_version``.

>>> from neffcache.keying import CompileContext, KeyInputs, compute_key, fingerprint_hlo
>>> module = open("model.hlo_module.pb", "rb").read()               # doctest: +SKIP
>>> ctx = CompileContext.create(compiler_version="2.20.9961.0+0acef03a",
...                             target="trn2", flags="--model-type=transformer")
>>> compute_key(KeyInputs(fingerprint_hlo(module), ctx)).key         # doctest: +SKIP

Depends only on the standard library, ``blake3`` and ``protobuf``.
"""

from __future__ import annotations

from ._canonical import DEBUG_FRONTEND_ATTRIBUTES, canonical_hlo, fingerprint_hlo
from ._compiler import check_compiler_version, compiler_version
from ._env import ENV_ALLOWLIST, FRAMEWORK_ALLOWLIST, compile_env
from ._errors import KeyingError
from ._flags import (
    OUTPUT_NEUTRAL_FLAGS,
    WRAPPER_ONLY_FLAGS,
    neuron_cache_flags,
    neuron_flags_hash,
    normalize_flags,
)
from ._inputs import TARGETS, CompileContext, KeyInputs
from ._key import CacheKey, compute_key, direct_key
from ._neuron import NeuronAddress, neuron_address, parse_neuron_address
from ._version import KEY_VERSION

__all__ = [
    "DEBUG_FRONTEND_ATTRIBUTES",
    "ENV_ALLOWLIST",
    "FRAMEWORK_ALLOWLIST",
    "KEY_VERSION",
    "OUTPUT_NEUTRAL_FLAGS",
    "TARGETS",
    "WRAPPER_ONLY_FLAGS",
    "CacheKey",
    "CompileContext",
    "KeyInputs",
    "KeyingError",
    "NeuronAddress",
    "canonical_hlo",
    "check_compiler_version",
    "compile_env",
    "compiler_version",
    "compute_key",
    "direct_key",
    "fingerprint_hlo",
    "neuron_address",
    "neuron_cache_flags",
    "neuron_flags_hash",
    "normalize_flags",
    "parse_neuron_address",
]
