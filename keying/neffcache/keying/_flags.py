"""Compiler flags: the normalized list that goes into neffcache's key, and the stock
Neuron flags hash (the 8 hex digits after ``+`` in ``MODULE_<key>+<hash>``).

Normalization (``normalize_flags``) answers "would the compiler produce the same NEFF?":

* wrapper-only flags are removed: libneuronxla parses them out of NEURON_CC_FLAGS and
  never passes them to neuronx-cc (docs/neuron-sdk.md#cache-location and #open-questions);
* output-neutral flags are removed: they name files or set log verbosity
  (docs/neuron-sdk.md#flags-hash item 7 and #flags-hashed-verbatim), each listed below
  with its reason;
* the ``compile`` command word and positional arguments (the input path) are removed;
* spellings are unified: ``--k v`` becomes ``--k=v``, and documented aliases
  (``-O2``, ``-O 2``, ``--optlevel 2``; ``-lnc``, ``--lnc``) take one name;
* order is kept. The compiler's argument parser lets the last of competing options
  win, and flags with different names compete too: ``--enable-x`` and
  ``--disable-x``, or an abbreviation and its full name. neffcache cannot tell which
  flags compete, so ``--a --b`` and ``--b --a`` are different keys (a miss, never a
  wrong NEFF);
* an identical repeat of a documented single-valued option collapses into its last
  occurrence (NxD and libneuronxla each append the same options): ``--a --b --a`` is
  ``--b --a``, since the last ``--a`` wins either way. Options that may accumulate
  (``--...-options``, undocumented ones) keep every repeat.

The stock hash (``neuron_flags_hash``) is the opposite: it reproduces the SDK's
formula byte for byte, spelling and order included, so addresses interoperate.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence

from ._errors import KeyingError

# Flags libneuronxla's wrapper consumes itself (docs/neuron-sdk.md#cache-location): they
# never reach the compiler.
WRAPPER_ONLY_FLAGS: Mapping[str, str] = {
    "--cache_dir": "where the persistent cache lives; parsed by the wrapper",
    "--no_cache": "turns the persistent cache off; parsed by the wrapper",
    "--retry_failed_compilation": "whether to replay a cached failure; parsed by the wrapper",
    "--log_level": "the wrapper's own log level",
    "--dump": "where the wrapper dumps inputs for debugging",
    "--compile_workdir": "the wrapper's scratch directory",
}

# Compiler flags that cannot change the NEFF's contents.
OUTPUT_NEUTRAL_FLAGS: Mapping[str, str] = {
    "--logfile": "a log path; NxD puts its per-run work dir here "
    "(docs/neuron-sdk.md#flags-hashed-verbatim), so keeping it would miss whenever the "
    "work dir moves",
    "--verbose": "log verbosity only; the wrapper adds --verbose=35 itself "
    "(docs/neuron-sdk.md#flags-hash)",
    "--output": "where to write the NEFF, not what it contains",
    "--framework": "the input format; neffcache only keys HloModuleProto input, which is "
    "always --framework=XLA",
}

# Wrapper-only flags that take no value.
_BOOLEAN_WRAPPER_FLAGS = frozenset({"--no_cache", "--retry_failed_compilation"})

# Compiler flags documented as switches (neuronx-cc CLI reference): a word after one
# of these is a positional argument, never its value.
_BOOLEAN_FLAGS = frozenset(
    {
        "--enable-mixed-precision-accumulation",
        "--enable-saturate-infinity",
        "--enable-fast-context-switch",
        "--enable-fast-loading-neuron-binaries",
        "--enable-internal-neff-wrapper",
        *_BOOLEAN_WRAPPER_FLAGS,
    }
)

# Compiler flags documented as taking a value: the next word is their value even when
# it starts with "-" (``--tensorizer-options '--foo'``).
_VALUE_FLAGS = frozenset(
    {
        "--target",
        "--model-type",
        "--auto-cast",
        "--auto-cast-type",
        "--native-int64",
        "--implicit-integer-downcast",
        "--distribution-strategy",
        "--logical-nc-config",
        "--optlevel",
        "--execute-repetition",
        "--tensorizer-options",
        "--logfile",
        "--output",
        "--verbose",
        "--framework",
        "--cache_dir",
        "--log_level",
        "--dump",
        "--compile_workdir",
    }
)

# Flags that take several words (``--pipeline compile SaveTemps``).
_MULTI_VALUE_FLAGS = frozenset({"--pipeline"})

# Alias -> the name the compiler documents.
_ALIASES: Mapping[str, str] = {
    "-O": "--optlevel",
    "-lnc": "--logical-nc-config",
    "--lnc": "--logical-nc-config",
}

_NUMBER = re.compile(r"-[0-9]+(\.[0-9]+)?")

_DROPPED = frozenset(WRAPPER_ONLY_FLAGS) | frozenset(OUTPUT_NEUTRAL_FLAGS)
# Documented options that hold one value or one state, so that a repeat replaces
# (last wins) and an identical repeat adds nothing. An option that may accumulate
# (``--internal-backend-options`` given twice, an undocumented one) keeps every repeat.
_SINGLE_VALUED = (_VALUE_FLAGS | _BOOLEAN_FLAGS | set(_ALIASES.values())) - {"--tensorizer-options"}
_KNOWN_FLAGS = (
    _DROPPED | _VALUE_FLAGS | _BOOLEAN_FLAGS | _MULTI_VALUE_FLAGS | set(_ALIASES.values())
)


def split_flags(flags: str | Sequence[str]) -> list[str]:
    """Split a flags string the way a shell would; a sequence is taken as tokens."""
    if isinstance(flags, str):
        try:
            return shlex.split(flags)
        except ValueError as exc:
            raise KeyingError(f"cannot split compiler flags {flags!r}: {exc}") from exc
    if not isinstance(flags, Sequence):
        raise KeyingError(
            f"compiler flags must be a string or a sequence of strings, got {flags!r}"
        )
    tokens = list(flags)
    for token in tokens:
        if not isinstance(token, str):
            raise KeyingError(f"compiler flags must be strings, got {token!r}")
    return tokens


def normalize_flags(flags: str | Sequence[str]) -> list[str]:
    """Return the flags that can change the compiled NEFF, in one canonical spelling.

    >>> normalize_flags("--model-type transformer -O1 --cache_dir=/c --logfile=/w/log")
    ['--model-type=transformer', '--optlevel=1']

    Idempotent: normalizing a normalized list returns it unchanged.
    """
    options = _parse_options(split_flags(flags))
    kept = [(name, value) for name, value in options if name not in _DROPPED]
    last = {option: i for i, option in enumerate(kept)}
    kept = [
        option
        for i, option in enumerate(kept)
        if last[option] == i or option[0] not in _SINGLE_VALUED
    ]
    return [name if value is None else f"{name}={value}" for name, value in kept]


def option_name(token: str) -> tuple[str, str | None]:
    """A command-line option's documented name and its inline value, if any:
    ``-O2`` is (``--optlevel``, ``2``), ``--lnc`` is (``--logical-nc-config``, None),
    ``--target=trn2`` is (``--target``, ``trn2``)."""
    return _split_token(token)


def abbreviates(name: str) -> str | None:
    """The documented option ``name`` abbreviates, if any: a parser that takes unique
    prefixes (argparse's default) reads ``--out`` as ``--output``."""
    if not name.startswith("--") or name in _KNOWN_FLAGS:
        return None
    found = sorted(known for known in _KNOWN_FLAGS if known.startswith(name))
    return found[0] if found else None


def option_arity(name: str) -> str:
    """How option ``name`` (as ``option_name`` gives it) takes its value when none is
    inline: ``"value"`` (the next word, documented), ``"words"`` (the words up to the
    next option: ``--pipeline compile SaveTemps``), ``"none"`` (a documented switch) or
    ``"unknown"`` (an option neffcache has no documentation for)."""
    if name in _BOOLEAN_FLAGS:
        return "none"
    if name in _MULTI_VALUE_FLAGS:
        return "words"
    if name in _VALUE_FLAGS or name in _ALIASES.values() or name.endswith("-options"):
        return "value"
    return "unknown"


def _parse_options(tokens: list[str]) -> list[tuple[str, str | None]]:
    """Pair each flag with its value; drop the command word and positional arguments."""
    options: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-") or token in ("-", "--"):
            continue  # "compile", the input path, or a bare separator
        name, value = _split_token(token)
        if value is None and name not in _BOOLEAN_FLAGS:
            if name in _MULTI_VALUE_FLAGS:
                words = []
                while i < len(tokens) and not tokens[i].startswith("-"):
                    words.append(tokens[i])
                    i += 1
                value = " ".join(words) if words else None
            elif i < len(tokens) and _is_value(name, tokens[i]):
                value = tokens[i]
                i += 1
            if value is None and (name in _VALUE_FLAGS or name.endswith("-options")):
                raise KeyingError(f"compiler flag {name} needs a value")
        options.append((name, value))
    return options


def _is_value(name: str, word: str) -> bool:
    """Whether ``word`` is the value of flag ``name`` rather than a flag of its own.

    A word not starting with "-" is a value, and so is a negative number. A flag that
    takes a value (documented, or named ``--...-options`` like
    ``--internal-backend-options``) takes the next word even when it starts with "-"
    (``--tensorizer-options '--foo'``), unless that word is itself a flag we know.
    """
    if not word.startswith("-") or _NUMBER.fullmatch(word):
        return True
    takes_value = name in _VALUE_FLAGS or name.endswith("-options")
    return takes_value and _split_token(word)[0] not in _KNOWN_FLAGS


def _split_token(token: str) -> tuple[str, str | None]:
    if token.startswith("-O") and not token.startswith("--") and len(token) > 2:
        return "--optlevel", token[2:].removeprefix("=")  # -O2, -O=2
    name, sep, value = token.partition("=")
    name = _ALIASES.get(name, name)
    return name, (value if sep else None)


def neuron_cache_flags(flags: str | Sequence[str], target: str | None) -> list[str]:
    """The flag list libneuronxla hashes for a stock cache address
    (docs/neuron-sdk.md#flags-hash and #stock-address).

    Wrapper-only flags are removed; everything else keeps its spelling and order;
    ``--target=<target>`` is prepended, as the torch-xla/PJRT path does, unless the
    flags already carry a ``--target``.
    """
    tokens = split_flags(flags)
    kept: list[str] = []
    skip_value = False
    for token in tokens:
        if skip_value:
            skip_value = False
            if not token.startswith("-"):
                continue
        name = token.partition("=")[0]
        if name in WRAPPER_ONLY_FLAGS:
            skip_value = "=" not in token and name not in _BOOLEAN_WRAPPER_FLAGS
            continue
        kept.append(token)
    has_target = any(token.partition("=")[0] == "--target" for token in kept)
    if target is not None and not has_target:
        kept.insert(0, f"--target={target}")
    return kept


def flags_target(flags: Sequence[str]) -> str | None:
    """The value of the last ``--target`` among flag tokens, as ``--target=trn2`` or as
    the two words ``--target trn2`` (NxDI writes its compile_flags.json so); None
    when there is none."""
    found: str | None = None
    for i, token in enumerate(flags):
        name, sep, value = token.partition("=")
        if name != "--target":
            continue
        if sep:
            found = value or None
        elif i + 1 < len(flags) and not flags[i + 1].startswith("-"):
            found = flags[i + 1]
    return found


def neuron_flags_hash(flags: Sequence[str], *, legacy: bool = False) -> str:
    """The 8-hex flags suffix of a stock Neuron cache directory (docs/neuron-sdk.md#flags-hash).

    Current libneuronxla: ``md5(json.dumps(flags))[:8]`` over the token list.
    ``legacy=True`` (neuronxcc up to about 2.13): ``md5(" ".join(flags))[:8]``; a string
    is then hashed exactly as given, so its spacing is preserved.

    >>> neuron_flags_hash(["--target=trn1", "--model-type=transformer"])
    '3cc9a3cb'
    """
    if isinstance(flags, str):
        if not legacy:
            raise KeyingError(
                "neuron_flags_hash needs the flag tokens as a list for the current "
                "(JSON) formula; pass legacy=True to hash a raw flags string"
            )
        preimage = flags
    else:
        tokens = split_flags(flags)
        preimage = " ".join(tokens) if legacy else json.dumps(tokens)
    return _md5_hex(preimage.encode("utf-8"))[:8]


def _md5_hex(data: bytes) -> str:
    """MD5 from CPython's own module when it has one: ``hashlib`` loads OpenSSL and
    blake2 first, milliseconds that every hit through the wrapper would pay for eight
    hex digits of a directory name."""
    try:
        from _md5 import md5  # type: ignore[import-not-found]  # CPython's; some builds lack it
    except ImportError:
        from hashlib import md5
    digest: str = md5(data, usedforsecurity=False).hexdigest()
    return digest
