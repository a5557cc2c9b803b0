"""API tokens written once over ``Maps``: each token is one field of the map
``token-records``, named by the hash of its secret (the one read a request's token
costs), holding the JSON of the token's other fields. Tokens are few and never
deleted, so listing them and revoking one by id read the map whole.
"""

from __future__ import annotations

import dataclasses
import json

from neffcache.server.errors import StoreError

from .base import Token
from .primitives import Maps
from .records import ROUNDS

TOKENS = "token-records"


def token_value(token: Token) -> str:
    return json.dumps(
        {
            "token_id": token.token_id,
            "scope": token.scope,
            "namespaces": list(token.namespaces),
            "name": token.name,
            "created_at": token.created_at,  # JSON floats round-trip exactly (repr)
            "revoked": token.revoked,
            "trusted": token.trusted,
        },
        ensure_ascii=False,
    )


def token_from(secret_hash: str, value: str) -> Token:
    fields = json.loads(value)
    return Token(
        token_id=fields["token_id"],
        secret_hash=secret_hash,
        scope=fields["scope"],
        namespaces=tuple(fields["namespaces"]),
        name=fields["name"],
        created_at=float(fields["created_at"]),
        revoked=fields["revoked"],
        trusted=fields["trusted"],
    )


class MapTokens:
    """The ``Tokens`` role over any ``Maps``."""

    def __init__(self, maps: Maps) -> None:
        self._maps = maps

    def put_token(self, token: Token) -> None:
        # Ids are unique too: a second token under one id could never be revoked.
        if any(t.token_id == token.token_id for t in self.tokens()):
            raise StoreError(f"token {token.token_id} exists already")
        value = token_value(token)
        # Equal is stored: a client's retry of a write that had landed finds its own.
        stored = self._maps.put_new(TOKENS, token.secret_hash, value)
        if not stored and self._maps.get(TOKENS, token.secret_hash) != value:
            raise StoreError(f"token {token.token_id}: a token with its secret exists")

    def token_by_hash(self, secret_hash: str) -> Token | None:
        value = self._maps.get(TOKENS, secret_hash)
        return None if value is None else token_from(secret_hash, value)

    def tokens(self) -> list[Token]:
        found = [token_from(h, value) for h, value in self._maps.items(TOKENS).items()]
        return sorted(found, key=lambda t: (t.created_at, t.token_id))

    def revoke_token(self, token_id: str) -> bool:
        for _ in range(ROUNDS):
            held = self._maps.items(TOKENS)
            mine = (h for h, value in held.items() if token_from(h, value).token_id == token_id)
            found = next(mine, None)
            if found is None:
                return False
            token = token_from(found, held[found])
            revoked = token_value(dataclasses.replace(token, revoked=True))
            # Against the value as stored, not as this code would write it again; also
            # when revoked already: a retry's write (a documented map writes the
            # token's document after it, which the first try may not have).
            if self._maps.swap(TOKENS, found, held[found], revoked):
                return True
        raise StoreError(f"token {token_id}: still contended after {ROUNDS} rounds")
