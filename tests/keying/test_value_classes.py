"""Keying's value classes behave as the frozen dataclasses they replace.

They are plain slotted classes because importing ``dataclasses`` (and with it
``inspect``) costs the compiler wrapper milliseconds at every start: equality, hash,
repr, immutability and pickling are checked here instead of inherited.
"""

from __future__ import annotations

import copy
import os
import pickle
import site
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import pytest

from neffcache.keying import (
    CacheKey,
    CompileContext,
    KeyInputs,
    NeuronAddress,
    compute_key,
    direct_key,
)
from neffcache.keying._joined import Joined

REPO = Path(__file__).resolve().parents[2]
VERSION = "2.20.9961.0+0acef03a"
FINGERPRINT = "0123456789abcdef" * 4


def context(target: str = "trn2", flags: str = "--model-type transformer -O1") -> CompileContext:
    return CompileContext.create(compiler_version=VERSION, target=target, flags=flags)


def joined(content: bytes = b"c") -> Joined:
    return Joined([0, -1], [-1], [-1], [-1], [b"\xff"], content)


# Per class: a value, an equal one built separately, one differing in a compared
# field, and the repr a frozen dataclass gives the first.
CASES: dict[str, tuple[Callable[[], object], Callable[[], object], object, str]] = {
    "CompileContext": (
        context,
        lambda: CompileContext(VERSION, "trn2", ("--model-type", "transformer", "-O1")),
        context(target="trn1"),
        "CompileContext(compiler_version='2.20.9961.0+0acef03a', target='trn2', "
        "flags=('--model-type=transformer', '--optlevel=1'), env=(), frameworks=())",
    ),
    "KeyInputs": (
        lambda: KeyInputs(FINGERPRINT, context()),
        lambda: KeyInputs(fingerprint=FINGERPRINT, context=context()),
        KeyInputs(FINGERPRINT, context(flags="-O2")),
        f"KeyInputs(fingerprint='{FINGERPRINT}', context=CompileContext("
        "compiler_version='2.20.9961.0+0acef03a', target='trn2', "
        "flags=('--model-type=transformer', '--optlevel=1'), env=(), frameworks=()))",
    ),
    "CacheKey": (
        lambda: CacheKey("ab" * 32, {"target": "trn2"}),
        lambda: CacheKey(key="ab" * 32, components={"target": "trn2"}),
        CacheKey("cd" * 32, {"target": "trn2"}),
        f"CacheKey(key='{'ab' * 32}', components={{'target': 'trn2'}})",
    ),
    "NeuronAddress": (
        lambda: NeuronAddress(VERSION, "16518787498567201059", "3cc9a3cb"),
        lambda: NeuronAddress(
            compiler_version=VERSION, module_key="16518787498567201059", flags_hash="3cc9a3cb"
        ),
        NeuronAddress(VERSION, "16518787498567201059", "3cc9a3cc"),
        "NeuronAddress(compiler_version='2.20.9961.0+0acef03a', "
        "module_key='16518787498567201059', flags_hash='3cc9a3cb')",
    ),
    "Joined": (
        joined,
        joined,
        joined(b"d"),
        "Joined(ids=[0, -1], operands=[-1], preds=[-1], called=[-1], attrs=[b'\\xff'], "
        "content=b'c')",
    ),
}
NAMES = list(CASES)
FIELDS = {
    "CompileContext": ("compiler_version", "target", "flags", "env", "frameworks"),
    "KeyInputs": ("fingerprint", "context"),
    "CacheKey": ("key", "components"),
    "NeuronAddress": ("compiler_version", "module_key", "flags_hash"),
    "Joined": ("ids", "operands", "preds", "called", "attrs", "content"),
}


@pytest.mark.parametrize("name", NAMES)
def test_equality(name: str) -> None:
    make, make_equal, different, _ = CASES[name]
    value, equal = make(), make_equal()
    assert value is not equal
    assert value == equal
    assert (value != equal) is False
    assert value != different
    assert (value == different) is False


@pytest.mark.parametrize("name", NAMES)
def test_other_types_are_not_equal(name: str) -> None:
    value = CASES[name][0]()
    fields = tuple(getattr(value, field) for field in FIELDS[name])
    assert value.__eq__(fields) is NotImplemented
    assert value != fields
    assert all(value != CASES[other][0]() for other in NAMES if other != name)


@pytest.mark.parametrize("name", [name for name in NAMES if name != "Joined"])
def test_equal_values_hash_alike(name: str) -> None:
    make, make_equal, _, _ = CASES[name]
    assert hash(make()) == hash(make_equal())
    assert len({make(), make_equal()}) == 1


def test_hash_is_that_of_the_compared_fields() -> None:
    ctx = context()
    assert hash(ctx) == hash(tuple(getattr(ctx, field) for field in FIELDS["CompileContext"]))
    assert hash(CacheKey("k", {"a": "b"})) == hash(("k",))


def test_joined_holds_lists_so_it_is_unhashable_as_before() -> None:
    with pytest.raises(TypeError, match="unhashable"):
        hash(joined())


@pytest.mark.parametrize("name", NAMES)
def test_repr_is_the_dataclass_repr(name: str) -> None:
    make, _, _, expected = CASES[name]
    assert repr(make()) == expected


@pytest.mark.parametrize("name", NAMES)
def test_fields_cannot_be_set_or_deleted(name: str) -> None:
    value = CASES[name][0]()
    before = repr(value)
    for field in FIELDS[name]:
        with pytest.raises(AttributeError, match=f"cannot assign to field '{field}'"):
            setattr(value, field, None)
        with pytest.raises(AttributeError, match=f"cannot delete field '{field}'"):
            delattr(value, field)
    with pytest.raises(AttributeError):
        value.extra = 1  # type: ignore[attr-defined]
    assert not hasattr(value, "__dict__")
    assert repr(value) == before


@pytest.mark.parametrize("name", NAMES)
def test_match_args_are_the_fields_in_order(name: str) -> None:
    value = CASES[name][0]()
    assert type(value).__match_args__ == FIELDS[name]  # type: ignore[attr-defined]


def test_positional_patterns_match_fields() -> None:
    match NeuronAddress(VERSION, "1", "3cc9a3cb"):
        case NeuronAddress(version, module_key, flags_hash):
            assert (version, module_key, flags_hash) == (VERSION, "1", "3cc9a3cb")
        case _:
            pytest.fail("no match")


def test_cache_key_equality_ignores_components() -> None:
    ctx = context()
    key = direct_key(b"module", ctx)
    bare = CacheKey(key.key, {})
    assert bare == key
    assert hash(bare) == hash(key)
    assert key != direct_key(b"other module", ctx)
    assert compute_key(KeyInputs(FINGERPRINT, ctx)) == compute_key(KeyInputs(FINGERPRINT, ctx))


def test_constructors_keep_their_signatures() -> None:
    assert CompileContext(VERSION, "trn1") == CompileContext(
        compiler_version=VERSION, target="trn1", flags=(), env=(), frameworks=()
    )
    with pytest.raises(TypeError):
        CompileContext(VERSION)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        CacheKey("k")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        NeuronAddress(VERSION, "1", "3cc9a3cb", "extra")  # type: ignore[call-arg]


def test_construction_normalizes() -> None:
    ctx = CompileContext(
        VERSION,
        "trn2",
        ("--target=trn2", "-O1"),
        (("XLA_FLAGS", "--a"),),
    )
    assert ctx.flags == ("--optlevel=1",)
    assert ctx.env == (("XLA_FLAGS", "--a"),)
    assert ctx == CompileContext.create(
        compiler_version=VERSION, target="trn2", flags="-O1", env={"XLA_FLAGS": "--a"}
    )


# The components of a real key are mapping proxies, which do not pickle.
PICKLABLE: list[Callable[[], object]] = [
    context,
    lambda: KeyInputs(FINGERPRINT, context()),
    lambda: CacheKey("ab" * 32, {"flags": ("-O1",)}),
    lambda: NeuronAddress(VERSION, "1", "3cc9a3cb"),
    joined,
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("make", PICKLABLE)
def test_pickle_round_trip(make: Callable[[], object], protocol: int) -> None:
    value = make()
    again = pickle.loads(pickle.dumps(value, protocol))
    assert again == value
    assert repr(again) == repr(value)


@pytest.mark.parametrize("name", NAMES)
def test_copies_are_equal(name: str) -> None:
    value = CASES[name][0]()
    for duplicate in (copy.copy(value), copy.deepcopy(value)):
        assert duplicate == value
        assert repr(duplicate) == repr(value)


def test_real_keys_copy_with_their_components() -> None:
    key = direct_key(b"module", context())
    duplicate = copy.copy(key)
    assert duplicate == key
    assert duplicate.components is key.components
    assert isinstance(duplicate.components, MappingProxyType)


def test_importing_keying_does_not_import_dataclasses() -> None:
    # python -S: no .pth file or sitecustomize may import it first and hide a regression.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "keying"), *site.getsitepackages()])
    code = "import sys, neffcache.keying; print('dataclasses' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_dataclass_era_pickle_state_loads_by_name_and_others_are_refused() -> None:
    # A dataclass pickle's state is a dict; zipping its keys with the
    # fields would load CompileContext(compiler_version='compiler_version', ...) silently.
    from neffcache.keying import CompileContext

    ctx = CompileContext.create(
        compiler_version="2.20.9961.0+0acef03a", target="trn2", flags="--model-type transformer"
    )
    state = {name: getattr(ctx, name) for name in CompileContext.__match_args__}
    loaded = CompileContext.__new__(CompileContext)
    loaded.__setstate__(dict(reversed(list(state.items()))))  # order must not matter
    assert loaded == ctx
    assert loaded.compiler_version == "2.20.9961.0+0acef03a"
    for bad in ({"compiler_version": "x"}, ("too", "short"), "text"):
        with pytest.raises(TypeError):
            CompileContext.__new__(CompileContext).__setstate__(bad)
