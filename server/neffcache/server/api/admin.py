"""``/v1/admin/tokens``: create, list and revoke tokens (admin tokens for ``*`` only)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import (
    BODY,
    NUMBER,
    TOKEN,
    array,
    errors,
    json_answer,
    no_body,
    obj,
    request_body,
)
from neffcache.server.api.body import read_body
from neffcache.server.auth import SCOPES, Caller
from neffcache.server.deps import BackendsDep, CallerDep
from neffcache.server.errors import BadRequest, Forbidden, NotFound
from neffcache.server.manifest import NAMESPACE
from neffcache.server.services import tokens

router = APIRouter(prefix="/v1/admin")
_TOKEN_REQUEST_MAX = 64 * 1024


class TokenRequest(BaseModel):
    # Checked by new_token; the schema states the same.
    scope: str = Field(description="read, write or admin", json_schema_extra={"enum": list(SCOPES)})
    namespaces: list[str] = Field(
        min_length=1,
        description="namespaces, or ['*']",
        json_schema_extra={"items": {"type": "string", "pattern": rf"^(\*|{NAMESPACE})$"}},
    )
    name: str = Field("", max_length=200, description="who or what the token is for")
    trusted: bool = Field(
        False, description="may publish into namespaces that take only trusted writers"
    )


def _require_admin(caller: Caller) -> None:
    caller.require("admin")
    if "*" not in caller.namespaces:
        raise Forbidden("managing tokens needs an admin token for every namespace ('*')")


_TOKEN_VIEW = {
    "token_id": {"type": "string"},
    "scope": {"type": "string", "enum": ["read", "write", "admin"]},
    "namespaces": array({"type": "string"}, 1),
    "name": {"type": "string"},
    "created_at": NUMBER,
    "revoked": {"type": "boolean"},
    "trusted": {"type": "boolean"},
}


@router.post(
    "/tokens",
    status_code=201,
    openapi_extra=request_body(TokenRequest),
    responses={
        **json_answer(
            201,
            obj({**_TOKEN_VIEW, "token": {"type": "string"}}),
            "the token's record and its secret, shown this once",
        ),
        **errors(*TOKEN, *BODY),
    },
)
async def create_token(
    request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    _require_admin(caller)
    try:
        body = TokenRequest.model_validate_json(await read_body(request, _TOKEN_REQUEST_MAX))
    except ValidationError as exc:
        raise BadRequest(f"invalid token request: {exc.errors()[0]['msg']}") from None
    token, secret = await run_in_threadpool(
        tokens.create_token,
        backends,
        caller.label,
        body.scope,
        tuple(body.namespaces),
        body.name,
        trusted=body.trusted,
    )
    return {**tokens.token_view(token), "token": secret}


@router.get(
    "/tokens",
    responses={
        **json_answer(200, obj({"tokens": array(obj(_TOKEN_VIEW))}), "every token, no secret"),
        **errors(*TOKEN),
    },
)
def list_tokens(caller: CallerDep, backends: BackendsDep) -> dict[str, Any]:
    _require_admin(caller)
    return {"tokens": tokens.token_views(backends)}


@router.delete(
    "/tokens/{token_id}",
    status_code=204,
    responses={**no_body(204, "revoked"), **errors(*TOKEN, 404, e404="no such token")},
)
def revoke_token(token_id: str, caller: CallerDep, backends: BackendsDep) -> Response:
    _require_admin(caller)
    if not backends.index.revoke_token(token_id):
        raise NotFound(f"no token {token_id}")
    backends.audit.add(caller.label, "token.revoke", "", token_id)
    return Response(status_code=204)
