"""Keys of a folder input (``torch_neuronx.trace``): ``tree_digest`` and ``digest_key``."""

from __future__ import annotations

import pytest

from neffcache.keying import (
    CompileContext,
    KeyingError,
    digest_key,
    direct_key,
    tree_digest,
)

FILES = [("graph.hlo", "blake3:aa"), ("metadata.json", "blake3:bb"), ("weights/w0.npy", "b:cc")]


def ctx() -> CompileContext:
    return CompileContext.create(compiler_version="2.20.9961.0+0acef03a", target="trn1", flags=[])


def test_tree_digest_golden() -> None:
    # Pinned: a change here changes every folder's key; bump KEY_VERSION.
    assert tree_digest(FILES) == "cc8942ac01710ad28eb5f2d6ea042bf87900f429a43ea85a7e399a55c2939982"


def test_order_does_not_matter_but_every_field_does() -> None:
    base = tree_digest(FILES)
    assert tree_digest(reversed(FILES)) == base
    assert tree_digest([*FILES[:2], ("weights/w0.npy", "b:cd")]) != base  # other weights
    assert tree_digest([*FILES[:2], ("weights/w1.npy", "b:cc")]) != base  # renamed
    assert tree_digest(FILES[:2]) != base  # a file fewer
    assert tree_digest([*FILES, ("weights/w1.npy", "b:cc")]) != base  # a file more


def test_fields_cannot_run_into_each_other() -> None:
    assert tree_digest([("a", "bc")]) != tree_digest([("ab", "c")])


@pytest.mark.parametrize(
    "path",
    ["", "/abs", "a/../b", "./a", "a//b", "a/"],
    ids=["empty", "abs", "up", "dot", "2", "end"],
)
def test_paths_must_be_normalized_relative_paths(path: str) -> None:
    with pytest.raises(KeyingError):
        tree_digest([(path, "x")])


def test_a_path_listed_twice_is_refused() -> None:
    with pytest.raises(KeyingError, match="twice"):
        tree_digest([("a", "x"), ("a", "y")])


def test_digest_key_is_a_direct_key_in_its_own_space() -> None:
    tree = tree_digest(FILES)
    key = digest_key(tree, ctx())
    assert key.components["module_digest"] == tree
    assert key.key != direct_key(tree.encode(), ctx()).key
    assert digest_key(tree, ctx()) == key
    with pytest.raises(KeyingError):
        digest_key("abc", ctx())
