"""What a cache key is made of: the graph's fingerprint and the compile context."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from neffcache.protocol import is_hex64

from ._compiler import check_compiler_version
from ._env import check_env, check_frameworks
from ._errors import KeyingError
from ._flags import normalize_flags

# Accelerator families neuronx-cc compiles for (--target). inf1 uses the older
# neuron-cc and is out of scope.
TARGETS = ("inf2", "trn1", "trn2", "trn3")

Pairs = tuple[tuple[str, str], ...]


class FrozenInstanceError(AttributeError):
    """An attempt to assign or delete a field of a frozen value (as dataclasses')."""


class Frozen:
    """What ``@dataclass(frozen=True)`` generated, for keying's value classes.

    ``dataclasses`` imports ``inspect`` and builds each class's methods at import; the
    compiler wrapper imports keying once per graph and cannot spare the milliseconds.
    A subclass lists its fields in order as ``__match_args__`` (what repr shows and
    pickling keeps) and as ``__slots__``, and in ``_compared`` those that ``__eq__``
    and ``__hash__`` use; its ``__init__`` sets them with ``object.__setattr__``, and
    it declares them to mypy as properties, under TYPE_CHECKING.
    """

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()
    _compared: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return _values(self, self._compared) == _values(other, self._compared)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(_values(self, self._compared))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__match_args__)
        return f"{self.__class__.__qualname__}({fields})"

    def __getstate__(self) -> tuple[object, ...]:
        return _values(self, self.__match_args__)

    def __setstate__(self, state: object) -> None:
        if isinstance(state, dict):
            # A pickle from when these were dataclasses: their state was the dict.
            if set(state) != set(self.__match_args__):
                raise TypeError(f"cannot unpickle {self.__class__.__name__} from {sorted(state)}")
            values = tuple(state[name] for name in self.__match_args__)
        elif isinstance(state, tuple) and len(state) == len(self.__match_args__):
            values = state
        else:
            raise TypeError(f"cannot unpickle {self.__class__.__name__} from {state!r:.80}")
        for name, value in zip(self.__match_args__, values, strict=True):
            object.__setattr__(self, name, value)

    if not TYPE_CHECKING:  # hidden from mypy, which would then allow any attribute

        def __setattr__(self, name, value):
            raise FrozenInstanceError(f"cannot assign to field {name!r}")

        def __delattr__(self, name):
            raise FrozenInstanceError(f"cannot delete field {name!r}")


def _values(value: object, names: tuple[str, ...]) -> tuple[object, ...]:
    return tuple([getattr(value, name) for name in names])


class CompileContext(Frozen):
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

    __match_args__ = ("compiler_version", "target", "flags", "env", "frameworks")
    __slots__ = _compared = __match_args__

    if TYPE_CHECKING:  # read-only fields, as a frozen dataclass's

        @property
        def compiler_version(self) -> str: ...
        @property
        def target(self) -> str: ...
        @property
        def flags(self) -> tuple[str, ...]: ...
        @property
        def env(self) -> Pairs: ...
        @property
        def frameworks(self) -> Pairs: ...

    def __init__(
        self,
        compiler_version: str,
        target: str,
        flags: tuple[str, ...] = (),
        env: Pairs = (),
        frameworks: Pairs = (),
    ) -> None:
        check_compiler_version(compiler_version)
        if target not in TARGETS:
            raise KeyingError(f"target {target!r} is not one of {', '.join(TARGETS)}")
        kept = []
        for flag in normalize_flags(flags):
            name, _, value = flag.partition("=")
            if name == "--target":
                if value != target:
                    raise KeyingError(f"flag {flag} contradicts target {target!r}")
                continue
            kept.append(flag)
        object.__setattr__(self, "compiler_version", compiler_version)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "flags", tuple(kept))
        object.__setattr__(self, "env", tuple(check_env(_as_dict(env, "env")).items()))
        object.__setattr__(
            self,
            "frameworks",
            tuple(check_frameworks(_as_dict(frameworks, "frameworks")).items()),
        )

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


class KeyInputs(Frozen):
    """A graph fingerprint (from ``fingerprint_hlo``) plus its compile context."""

    __match_args__ = ("fingerprint", "context")
    __slots__ = _compared = __match_args__

    if TYPE_CHECKING:  # read-only fields, as a frozen dataclass's

        @property
        def fingerprint(self) -> str: ...
        @property
        def context(self) -> CompileContext: ...

    def __init__(self, fingerprint: str, context: CompileContext) -> None:
        if not is_hex64(fingerprint):
            raise KeyingError(
                f"fingerprint {fingerprint!r} is not 64 lowercase hex digits (use fingerprint_hlo)"
            )
        if not isinstance(context, CompileContext):
            raise KeyingError("context must be a CompileContext")
        object.__setattr__(self, "fingerprint", fingerprint)
        object.__setattr__(self, "context", context)


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
