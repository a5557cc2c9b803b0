"""The ``Tokens`` role on every backend."""

from __future__ import annotations

from support.indexes import index, store, token

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
