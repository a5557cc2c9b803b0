"""The ``Tokens`` role on every backend."""

from __future__ import annotations

import dataclasses

import pytest
from support.backends import IndexHandles
from support.indexes import index, store, token

from neffcache.server.errors import StoreError
from neffcache.server.index import Tokens

__all__ = ["index", "store"]


def test_tokens_are_found_by_hash_listed_by_age_and_revoked_in_place(index: Tokens) -> None:
    index.put_token(token("t2", 2.0))
    index.put_token(token("t1", 1.0))
    assert index.token_by_hash("hash-of-t2") == token("t2", 2.0)
    assert index.token_by_hash("hash-of-none") is None
    assert [t.token_id for t in index.tokens()] == ["t1", "t2"]
    assert index.revoke_token("t1")
    assert not index.revoke_token("t3")
    revoked = index.token_by_hash("hash-of-t1")
    assert revoked is not None
    assert revoked.revoked


def test_a_token_id_or_secret_is_stored_once(index: Tokens) -> None:
    index.put_token(token("t1"))
    with pytest.raises(StoreError):
        index.put_token(dataclasses.replace(token("t1"), secret_hash="another"))
    with pytest.raises(StoreError):
        index.put_token(dataclasses.replace(token("t1"), token_id="t2"))
    assert index.tokens() == [token("t1")]


def test_a_revocation_is_seen_by_every_replica_and_repeats_harmlessly(
    store: IndexHandles,
) -> None:
    first, second = store.open(), store.open()
    first.put_token(token("t1"))
    first.put_token(token("t2", 1_712_000_001.0))
    assert second.revoke_token("t1")
    assert first.revoke_token("t1")
    assert first.tokens() == [
        dataclasses.replace(token("t1"), revoked=True),
        token("t2", 1_712_000_001.0),
    ]
