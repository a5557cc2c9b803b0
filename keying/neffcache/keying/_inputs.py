"""What a cache key is made of: the graph's fingerprint and the compile context."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._compiler import check_compiler_version
from ._env import check_env, check_frameworks
from ._errors import KeyingError
from ._flags import normalize_flags

# Accelerator families neuronx-cc compiles for (--target). inf1 uses the older
# neuron-cc and is out of scope.
TARGETS = ("inf2", "trn1", "trn2", "trn3")

_HEX64 = re.compile(r"^[0-9a-f]{64}$")

Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class CompileContext:
    """Everything but the graph that decides the NEFF.

    >>> CompileContext.create(compiler_version="2.20.9961.0+0acef03a", target="trn2",
    ...                       flags="--model-type transformer -O1")
    CompileContext(compiler_version='2.20.9961.0+0acef03a', target='trn2', \
flags=('--model-type=transformer', '--optlevel=1'), env=(), frameworks=())

    Construction normalizes: flags go through ``normalize_flags`` (and a ``--target``
    flag must agree with ``target``, then lives only there), env and frameworks are
    checked against their allowlists and sorted. Two contexts that compile alike are
    therefore equal, however they were spelled.
    """

    compiler_version: str
    target: str
    flags: tuple[str, ...] = ()
    env: Pairs = ()
    frameworks: Pairs = ()

    @classmethod
    def create(
        cls,
        *,
        compiler_version: str,
        target: str,
        flags: str | Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        frameworks: Mapping[str, str] | None = None,
    ) -> CompileContext:
        """Build a context from the shapes callers have: a flags string, dicts."""
        return cls(
            compiler_version=compiler_version,
            target=target,
            flags=tuple(normalize_flags(flags)),
            env=tuple((env or {}).items()),
            frameworks=tuple((frameworks or {}).items()),
        )

    def __post_init__(self) -> None:
        check_compiler_version(self.compiler_version)
        if self.target not in TARGETS:
            raise KeyingError(f"target {self.target!r} is not one of {', '.join(TARGETS)}")
        flags = []
        for flag in normalize_flags(self.flags):
            name, _, value = flag.partition("=")
            if name == "--target":
                if value != self.target:
                    raise KeyingError(f"flag {flag} contradicts target {self.target!r}")
                continue
            flags.append(flag)
        object.__setattr__(self, "flags", tuple(flags))
        object.__setattr__(self, "env", tuple(check_env(_as_dict(self.env, "env")).items()))
        object.__setattr__(
            self,
            "frameworks",
            tuple(check_frameworks(_as_dict(self.frameworks, "frameworks")).items()),
        )


@dataclass(frozen=True)
class KeyInputs:
    """A graph fingerprint (from ``fingerprint_hlo``) plus its compile context."""

    fingerprint: str
    context: CompileContext

    def __post_init__(self) -> None:
        if not isinstance(self.fingerprint, str) or not _HEX64.fullmatch(self.fingerprint):
            raise KeyingError(
                f"fingerprint {self.fingerprint!r} is not 64 lowercase hex digits "
                "(use fingerprint_hlo)"
            )
        if not isinstance(self.context, CompileContext):
            raise KeyingError("context must be a CompileContext")


def _as_dict(pairs: Pairs, what: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise KeyingError(f"{what} must be (name, value) pairs, got {pair!r}")
        name, value = pair
        if name in result:
            raise KeyingError(f"{what} names {name!r} twice")
        result[name] = value
    return result
