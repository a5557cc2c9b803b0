"""Tokens and who may do what.

A token is ``nfc_<id>_<secret>``; the index keeps only the BLAKE3 of the whole string.
Scopes are ordered: read < write < admin. A token applies to the namespaces it lists,
or to all with ``*``; blobs are shared by every namespace, so any write token may
upload them and any read token may fetch them.

Protected mode (like Redis): while no token exists, requests need none, and the
server refuses to listen on anything but a loopback address.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import time
from dataclasses import dataclass

import blake3

from neffcache.server.errors import BadRequest, Forbidden, StoreError, Unauthorized
from neffcache.server.index import AuditRecord, Index, Token
from neffcache.server.manifest import NAMESPACE

SCOPES = ("read", "write", "admin")
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Caller:
    """Who is asking: a token, or anonymous in protected mode."""

    name: str  # token id, or "anonymous"
    scope: str
    namespaces: tuple[str, ...]
    # May publish into namespaces that take only trusted writers: tokens marked so, and
    # admin tokens (which could mark themselves anyway).
    trusted: bool = True
    label: str = ANONYMOUS  # for the audit log: the token's id and name

    def covers(self, namespace: str) -> bool:
        return "*" in self.namespaces or namespace in self.namespaces

    def require(self, scope: str, namespace: str | None = None) -> None:
        if SCOPES.index(self.scope) < SCOPES.index(scope):
            article = "an" if scope == "admin" else "a"
            raise Forbidden(f"this needs {article} {scope} token; yours is {self.scope}")
        if namespace is not None and not self.covers(namespace):
            raise Forbidden(f"your token does not cover namespace {namespace!r}")


def is_trusted(token: Token) -> bool:
    """Whether a token may publish into namespaces that take only trusted writers:
    marked so, or an admin token (which could mark itself anyway)."""
    return token.trusted or token.scope == "admin"


def trusted_writer_ids(index: Index) -> set[str]:
    """The writer ids of entries trusted writers published: trusted tokens, and the
    anonymous writer of protected mode (the host's own admin)."""
    return {t.token_id for t in index.tokens() if is_trusted(t)} | {ANONYMOUS}


def hash_secret(secret: str) -> str:
    digest: str = blake3.blake3(secret.encode(), derive_key_context="neffcache token").hexdigest()
    return digest


def new_token(
    scope: str, namespaces: tuple[str, ...], name: str, *, trusted: bool = False
) -> tuple[Token, str]:
    """A fresh token and its secret (shown once, never stored)."""
    if scope not in SCOPES:
        raise BadRequest(f"scope {scope!r} is not one of {', '.join(SCOPES)}")
    if not namespaces:
        raise BadRequest("a token needs at least one namespace, or '*'")
    for namespace in namespaces:
        if namespace != "*" and not re.fullmatch(NAMESPACE, namespace):
            raise BadRequest(f"{namespace!r} is not a namespace name")
    token_id = secrets.token_hex(6)
    secret = f"nfc_{token_id}_{secrets.token_urlsafe(32)}"
    token = Token(
        token_id, hash_secret(secret), scope, namespaces, name, time.time(), trusted=trusted
    )
    return token, secret


BOOTSTRAP = "bootstrap"


def ensure_bootstrap_token(index: Index, secret: str) -> list[AuditRecord]:
    """Make the configured bootstrap secret an admin token for every namespace, and
    revoke earlier bootstrap secrets: changing the setting rotates the secret.

    A bootstrap token revoked through the API stays revoked while the setting is
    unchanged; a new secret gets a new token id, so no old record is reused. Returns
    the audit records of what changed.
    """
    from neffcache.server.audit import record

    secret_hash = hash_secret(secret)
    changes = []
    for token in index.tokens():
        if token.name == BOOTSTRAP and token.secret_hash != secret_hash and not token.revoked:
            index.revoke_token(token.token_id)
            changes.append(record("server start-up", "token.revoke", "", token.token_id))
    if index.token_by_hash(secret_hash) is None:
        token_id = f"{BOOTSTRAP}-{secret_hash[:12]}"
        try:
            index.put_token(Token(token_id, secret_hash, "admin", ("*",), BOOTSTRAP, time.time()))
        except StoreError:
            # Replicas starting together: another one made it since it was looked up.
            if index.token_by_hash(secret_hash) is None:
                raise
            return changes
        changes.append(
            record("server start-up", "token.create", "", token_id, scope="admin", name=BOOTSTRAP)
        )
    return changes


class TokenPresence:
    """Whether any token exists, asked of the index at most once per ``ttl`` seconds.

    Anonymous requests need this answer every time; the index's token list is too
    dear to read per request. A token created elsewhere (``--local``, another replica)
    ends protected mode within ``ttl``; one created through this server, at once.
    """

    def __init__(self, index: Index, ttl: float = 1.0) -> None:
        self._index = index
        self._ttl = ttl
        # Asked at once, not at the first anonymous request: a server that started
        # with tokens never takes a wiped index (no token until the rebuild restores
        # them from their documents) for protected mode, whatever it was asked before.
        self._known: bool | None = bool(index.tokens())
        self._checked = time.monotonic()

    def __call__(self) -> bool:
        now = time.monotonic()
        if self._known is None or (not self._known and now - self._checked > self._ttl):
            self._known = bool(self._index.tokens())
            self._checked = now
        return self._known

    def created(self) -> None:
        self._known = True


def authenticate(index: Index, authorization: str | None, tokens_exist: TokenPresence) -> Caller:
    """The caller behind an ``Authorization`` header."""
    if not authorization:
        if not tokens_exist():
            return Caller(ANONYMOUS, "admin", ("*",))
        raise Unauthorized("this server needs a token: Authorization: Bearer <token>")
    kind, _, secret = authorization.partition(" ")
    if kind.lower() != "bearer" or not secret:
        raise Unauthorized("use Authorization: Bearer <token>")
    token = index.token_by_hash(hash_secret(secret.strip()))
    if token is None or token.revoked:
        raise Unauthorized("unknown or revoked token")
    return Caller(
        token.token_id,
        token.scope,
        token.namespaces,
        trusted=is_trusted(token),
        label=f"{token.token_id} ({token.name})" if token.name else token.token_id,
    )


# The public token id a secret of new_token's form starts with.
_TOKEN_ID = re.compile(r"nfc_([0-9a-f]{12})_")


def presented_as(authorization: str | None) -> str:
    """Who a request's ``Authorization`` header says it is, for the server's log:
    ``anonymous`` without one, ``token ID`` for a secret of this server's form (the id
    is no secret: ``token list`` shows it), else ``an unrecognized token``. Never any
    part of the secret itself."""
    if not authorization:
        return ANONYMOUS
    found = _TOKEN_ID.match(authorization.partition(" ")[2].strip())
    return f"token {found[1]}" if found else "an unrecognized token"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
