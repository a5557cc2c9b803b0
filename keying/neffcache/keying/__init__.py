"""Cache keys for Neuron compilations: pure functions, no I/O but ``compiler_version``.

>>> from neffcache.keying import CompileContext, KeyInputs, compute_key, fingerprint_hlo
>>> module = open("model.hlo_module.pb", "rb").read()               # doctest: +SKIP
>>> ctx = CompileContext.create(compiler_version="2.20.9961.0+0acef03a",
...                             target="trn2", flags="--model-type=transformer")
>>> compute_key(KeyInputs(fingerprint_hlo(module), ctx)).key         # doctest: +SKIP

``graph_summary(module)`` describes a graph for explanations, never for keys: its
structure digest (shapes and literals erased), instruction count and shapes.

``fingerprint_mlir(data)`` is the canonical fingerprint of StableHLO MLIR bytecode (the
``module.mlir`` TorchNeuron hands neuronx-cc), read in pure Python: locations and the
module's name never split it. ``is_mlir_bytecode`` and ``is_mlir_text`` recognize inputs.

Depends only on the standard library, ``blake3`` and ``protobuf`` (imported on first
use of the HLO fingerprint and summary functions).
"""

from __future__ import annotations

import typing as _typing

from ._compiler import ask_compiler_version, check_compiler_version, compiler_version
from ._env import ENV_ALLOWLIST, FRAMEWORK_ALLOWLIST, compile_env
from ._errors import KeyingError
from ._flags import (
    OUTPUT_NEUTRAL_FLAGS,
    WRAPPER_ONLY_FLAGS,
    abbreviates,
    flags_target,
    neuron_cache_flags,
    neuron_flags_hash,
    normalize_flags,
    option_arity,
    option_name,
)
from ._hasher import PARALLEL_HASH_FROM, hash_threads
from ._inputs import TARGETS, CompileContext, KeyInputs
from ._key import CacheKey, compute_key, digest_key, direct_key
from ._layout import (
    STOCK_DONE,
    STOCK_FLAGS,
    STOCK_FLAGS_NAMES,
    STOCK_FLAGS_TXT,
    STOCK_HLO_NAMES,
    STOCK_LOCK_SUFFIX,
    STOCK_LOG,
    STOCK_NEFF,
    StockEra,
    StockFlags,
    is_stock_artifact,
    read_stock_flags,
    stock_era_of,
)
from ._neuron import NeuronAddress, neuron_address, parse_neuron_address
from ._tree import tree_digest
from ._version import KEY_VERSION

if _typing.TYPE_CHECKING:
    from ._canonical import DEBUG_FRONTEND_ATTRIBUTES, canonical_hlo, fingerprint_hlo
    from ._mlir import fingerprint_mlir, is_mlir_bytecode, is_mlir_text
    from ._summary import GraphSummary, graph_summary

# The fingerprint and the graph summary need protobuf, whose import costs more than a
# cache hit through the compiler wrapper may spend in all; it loads on first use
# (PEP 562), so a caller that only needs a direct key never pays for it. The MLIR
# reader (its tables) loads on first use too.
_LAZY = {
    **{
        name: "._canonical"
        for name in ("DEBUG_FRONTEND_ATTRIBUTES", "canonical_hlo", "fingerprint_hlo")
    },
    **{name: "._summary" for name in ("GraphSummary", "graph_summary")},
    **{name: "._mlir" for name in ("fingerprint_mlir", "is_mlir_bytecode", "is_mlir_text")},
}


def __getattr__(name: str) -> _typing.Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DEBUG_FRONTEND_ATTRIBUTES",
    "ENV_ALLOWLIST",
    "FRAMEWORK_ALLOWLIST",
    "KEY_VERSION",
    "OUTPUT_NEUTRAL_FLAGS",
    "PARALLEL_HASH_FROM",
    "STOCK_DONE",
    "STOCK_FLAGS",
    "STOCK_FLAGS_NAMES",
    "STOCK_FLAGS_TXT",
    "STOCK_HLO_NAMES",
    "STOCK_LOCK_SUFFIX",
    "STOCK_LOG",
    "STOCK_NEFF",
    "TARGETS",
    "WRAPPER_ONLY_FLAGS",
    "CacheKey",
    "CompileContext",
    "GraphSummary",
    "KeyInputs",
    "KeyingError",
    "NeuronAddress",
    "StockEra",
    "StockFlags",
    "abbreviates",
    "ask_compiler_version",
    "canonical_hlo",
    "check_compiler_version",
    "compile_env",
    "compiler_version",
    "compute_key",
    "digest_key",
    "direct_key",
    "fingerprint_hlo",
    "fingerprint_mlir",
    "flags_target",
    "graph_summary",
    "hash_threads",
    "is_mlir_bytecode",
    "is_mlir_text",
    "is_stock_artifact",
    "neuron_address",
    "neuron_cache_flags",
    "neuron_flags_hash",
    "normalize_flags",
    "option_arity",
    "option_name",
    "parse_neuron_address",
    "read_stock_flags",
    "stock_era_of",
    "tree_digest",
]
