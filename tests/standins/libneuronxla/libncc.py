"""STAND-IN for ``libneuronxla.libncc``; this is NOT AWS's code (whose source is not public).

Written only from docs/neuron-sdk.md#cache-location (``NEURON_CC_FLAGS`` and the flags the
wrapper keeps for itself) and #open-questions (the list of wrapper-only flags is open).

``setup_args()`` parses ``NEURON_CC_FLAGS`` with ``shlex`` into a :class:`NeuronCCArgs`:
the wrapper-only flags become attributes and everything else stays in
``compiler_flags``, in order, exactly as written (#flags-hash item 8: tokens are hashed
as they are). It returns a 3-tuple (#setup_args), whose first item is that object
(``ncc_args, _, _ = setup_args()`` in ``neuron_parallel_compile``).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

# docs/neuron-sdk.md#cache-location names --cache_dir, --no_cache,
# --retry_failed_compilation and --log_level as "will not be passed into Neuron Compiler
# CLI"; #open-questions adds --dump and --compile_workdir (seen as setup_args()
# attributes in neuron_parallel_compile.py). [GUESS] These six are the whole list, and
# only the underscore spellings count.
VALUE_FLAGS = ("--cache_dir", "--log_level", "--dump", "--compile_workdir")
BOOL_FLAGS = ("--no_cache", "--retry_failed_compilation")
WRAPPER_ONLY_FLAGS = VALUE_FLAGS + BOOL_FLAGS


@dataclass
class NeuronCCArgs:
    cache_dir: str | None = None
    no_cache: bool = False
    retry_failed_compilation: bool = False
    log_level: str | None = None
    dump: str | None = None
    compile_workdir: str | None = None
    compiler_flags: list[str] = field(default_factory=list)


def split_wrapper_flags(tokens: list[str]) -> NeuronCCArgs:
    """Separate wrapper-only flags (``--x=v`` or ``--x v``) from compiler flags."""
    args = NeuronCCArgs()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        name, eq, value = token.partition("=")
        if name in VALUE_FLAGS:
            if not eq:
                if i >= len(tokens):
                    raise ValueError(f"NEURON_CC_FLAGS: {name} needs a value")
                value = tokens[i]
                i += 1
            setattr(args, name[2:], value)  # the last one wins
        elif token in BOOL_FLAGS:
            setattr(args, token[2:], True)
        else:
            args.compiler_flags.append(token)
    return args


def setup_args(flags: str | None = None) -> tuple[NeuronCCArgs, list[str], str]:
    """Parse ``flags``, by default the ``NEURON_CC_FLAGS`` environment variable.

    [GUESS] Only the first item's role is known (docs/neuron-sdk.md#setup_args); this
    stand-in returns the compiler flags (a copy of ``compiler_flags``) and the string
    parsed as the other two, so a caller that unpacks three items works and one that
    uses the tuple as the object fails, as it would with the real SDK."""
    if flags is None:
        flags = os.environ.get("NEURON_CC_FLAGS", "")
    args = split_wrapper_flags(shlex.split(flags))
    return args, list(args.compiler_flags), flags
