"""Tokens as the admin API and ``neffcache admin token --local`` handle them."""

from __future__ import annotations

from typing import Any

from neffcache.server.audit import token_created
from neffcache.server.auth import new_token
from neffcache.server.index import Token
from neffcache.server.services import Services


def token_view(token: Token) -> dict[str, Any]:
    """A token's record as the API shows it: never its secret."""
    return {
        "token_id": token.token_id,
        "scope": token.scope,
        "namespaces": list(token.namespaces),
        "name": token.name,
        "created_at": token.created_at,
        "revoked": token.revoked,
        "trusted": token.trusted,
    }


def create_token(
    services: Services,
    actor: str,
    scope: str,
    namespaces: tuple[str, ...],
    name: str,
    *,
    trusted: bool,
) -> tuple[Token, str]:
    """A new token stored and audited as ``actor``'s; its record and its secret, which
    is shown this once. Blocks: call it in a worker thread from the event loop."""
    token, secret = new_token(scope, namespaces, name, trusted=trusted)
    services.index.put_token(token)
    services.tokens.created()
    services.audit.write([token_created(actor, token)])
    return token, secret


def token_views(services: Services) -> list[dict[str, Any]]:
    return [token_view(token) for token in services.index.tokens()]
