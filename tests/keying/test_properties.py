"""Hypothesis properties of the key: determinism, spelling insensitivity, order sensitivity,
sensitivity to every value, and unambiguous (tagged) hashing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from neffcache.keying import (
    OUTPUT_NEUTRAL_FLAGS,
    WRAPPER_ONLY_FLAGS,
    CompileContext,
    KeyInputs,
    compute_key,
    normalize_flags,
)
from neffcache.keying._hasher import TaggedHasher

# Modest example counts keep the suite fast; no deadline, so no assertion depends on time.
PROPERTY = settings(max_examples=100, deadline=None)

VERSION = "2.20.9961.0+0acef03a"

# Names with a meaning of their own are left to the example tests: dropped flags, the
# --target that lives in its own field, and aliases of names generated separately.
_SPECIAL = {*WRAPPER_ONLY_FLAGS, *OUTPUT_NEUTRAL_FLAGS, "--target", "--lnc"}

KNOWN_VALUE_FLAGS = (
    "--model-type",
    "--auto-cast",
    "--auto-cast-type",
    "--optlevel",
    "--logical-nc-config",
    "--distribution-strategy",
    "--tensorizer-options",
    "--execute-repetition",
)
KNOWN_SWITCHES = (
    "--enable-saturate-infinity",
    "--enable-mixed-precision-accumulation",
    "--enable-fast-context-switch",
)

_LOWER = "abcdefghijklmnopqrstuvwxyz"

# Flag names --[a-z][a-z-]{0,10}; values [A-Za-z0-9_.]{1,8}.
names = st.builds(
    lambda first, rest: f"--{first}{rest}",
    st.sampled_from(_LOWER),
    st.text(alphabet=_LOWER + "-", max_size=10),
).filter(lambda name: name not in _SPECIAL and name not in KNOWN_SWITCHES)
values = st.text(alphabet=_LOWER + _LOWER.upper() + "0123456789_.", min_size=1, max_size=8)
fingerprints = st.binary(min_size=32, max_size=32).map(bytes.hex)


@st.composite
def flag_sets(draw: st.DrawFn) -> list[tuple[str, str | None]]:
    """Flags with distinct names: generated and known value flags, and known switches."""
    valued = draw(
        st.dictionaries(st.one_of(names, st.sampled_from(KNOWN_VALUE_FLAGS)), values, max_size=8)
    )
    switches = draw(st.lists(st.sampled_from(KNOWN_SWITCHES), unique=True, max_size=2))
    flags: list[tuple[str, str | None]] = list(valued.items())
    flags += [(name, None) for name in switches]
    return draw(st.permutations(flags))


def spell(flags: list[tuple[str, str | None]], spaced: list[bool]) -> list[str]:
    """Tokens for ``flags``: ``--k=v`` or, where ``spaced`` says so, ``--k v``."""
    tokens: list[str] = []
    for (name, value), space in zip(flags, spaced[: len(flags)], strict=True):
        if value is None:
            tokens.append(name)
        elif space:
            tokens += [name, value]
        else:
            tokens.append(f"{name}={value}")
    return tokens


def key(tokens: list[str] | str, fingerprint: str = "0" * 64) -> str:
    context = CompileContext.create(compiler_version=VERSION, target="trn2", flags=tokens)
    return compute_key(KeyInputs(fingerprint, context)).key


@PROPERTY
@given(flags=flag_sets(), fingerprint=fingerprints, target=st.sampled_from(["inf2", "trn1"]))
def test_compute_key_deterministic(
    flags: list[tuple[str, str | None]], fingerprint: str, target: str
) -> None:
    tokens = spell(flags, [False] * len(flags))

    def once() -> str:
        context = CompileContext.create(compiler_version=VERSION, target=target, flags=tokens)
        return compute_key(KeyInputs(fingerprint, context)).key

    first = once()
    assert first == once()
    assert len(first) == 64
    assert int(first, 16) >= 0


@PROPERTY
@given(
    flags=st.lists(
        st.tuples(
            st.one_of(
                names,
                st.sampled_from(KNOWN_VALUE_FLAGS),
                st.sampled_from(sorted(_SPECIAL - {"--no_cache", "--retry_failed_compilation"})),
            ),
            values,
        ),
        max_size=10,
    ),
    spaced=st.lists(st.booleans(), min_size=10, max_size=10),
    extra=st.lists(st.sampled_from(["compile", "model.pb", "-O2", "-lnc=2", "--no_cache"])),
)
def test_normalize_flags_idempotent(
    flags: list[tuple[str, str]], spaced: list[bool], extra: list[str]
) -> None:
    # Repeated names and dropped flags included; every value flag gets a value
    # (a value flag missing its value is rejected: see test_flags).
    tokens = [*extra, *spell(list(flags), spaced)]
    once = normalize_flags(tokens)
    assert normalize_flags(once) == once


@PROPERTY
@given(flags=flag_sets(), spaced=st.lists(st.booleans(), min_size=10, max_size=10))
def test_equals_and_space_spellings_agree(
    flags: list[tuple[str, str | None]], spaced: list[bool]
) -> None:
    with_equals = spell(flags, [False] * len(flags))
    mixed = spell(flags, spaced)
    all_spaced = spell(flags, [True] * len(flags))
    assert normalize_flags(mixed) == normalize_flags(with_equals) == normalize_flags(all_spaced)
    assert normalize_flags(" ".join(all_spaced)) == normalize_flags(with_equals)
    assert key(mixed) == key(with_equals) == key(all_spaced)


@PROPERTY
@given(flags=flag_sets(), data=st.data())
def test_reordering_flags_changes_the_key_unless_the_order_is_the_same(
    flags: list[tuple[str, str | None]], data: st.DataObject
) -> None:
    # Differently named flags may compete (--enable-x/--disable-x, abbreviations), so
    # order is part of the key: equal keys exactly when the normalized order is equal.
    shuffled = data.draw(st.permutations(flags))
    spelled = spell(flags, [False] * len(flags))
    reordered = spell(shuffled, [False] * len(shuffled))
    same_order = normalize_flags(spelled) == normalize_flags(reordered)
    assert same_order == (key(spelled) == key(reordered))
    # Generated names avoid every flag normalization drops, so all are kept.
    assert same_order == (flags == shuffled)


@PROPERTY
@given(flags=flag_sets().filter(lambda f: any(v is not None for _, v in f)), data=st.data())
def test_changing_any_value_changes_key(
    flags: list[tuple[str, str | None]], data: st.DataObject
) -> None:
    valued = [i for i, (_, value) in enumerate(flags) if value is not None]
    index = data.draw(st.sampled_from(valued))
    name, old = flags[index]
    new = data.draw(values.filter(lambda v: v != old))
    changed = list(flags)
    changed[index] = (name, new)
    spelled = spell(flags, [False] * len(flags))
    assert key(spelled) != key(spell(changed, [False] * len(changed)))


@PROPERTY
@given(flags=flag_sets(), name=names, value=values)
def test_adding_a_flag_changes_key(
    flags: list[tuple[str, str | None]], name: str, value: str
) -> None:
    if any(existing == name for existing, _ in flags):
        return
    spelled = spell(flags, [False] * len(flags))
    assert key(spelled) != key([*spelled, f"{name}={value}"])


def test_tagged_hashing_keeps_flag_boundaries() -> None:
    assert key(["-O2", "-g"]) != key(["-O2-g"])
    assert key(["--a=b", "--c"]) != key(["--a=b--c"])
    assert key(["--a=b c"]) != key(["--a=b", "--c"])


def _digest(fields: list[tuple[str, str | list[str]]]) -> str:
    hasher = TaggedHasher("neffcache test domain")
    for label, value in fields:
        hasher.field(label, value)
    return hasher.hexdigest()


@PROPERTY
@given(left=st.text(max_size=6), right=st.text(max_size=6), cut=st.integers(0, 12))
def test_tagged_hasher_field_boundaries(left: str, right: str, cut: int) -> None:
    # Moving the boundary between a label and its value, or between two values, must
    # change the digest: every field is length-prefixed (ccache hash_delimiter).
    joined = left + right
    cut = min(cut, len(joined))
    if cut == len(left):
        return
    assert _digest([(left, right)]) != _digest([(joined[:cut], joined[cut:])])
    assert _digest([("a", left), ("b", right)]) != _digest(
        [("a", joined[:cut]), ("b", joined[cut:])]
    )
    assert _digest([("flags", [left, right])]) != _digest([("flags", [joined])])
