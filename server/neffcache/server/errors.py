"""The server's exception tree; ``api`` maps each class to one HTTP status.

    ServerError
        BadRequest          400  a malformed digest, key, manifest or body
        Unauthorized        401  no token, or an unknown or revoked one
        Forbidden           403  a token without the scope or namespace needed
        NotFound            404  (a miss is a return value in the stores; the API raises this)
        RequestTimeout      408  a request body that stalled
        Conflict            409  a different manifest for an existing key
        TooLarge            413  over max_blob_bytes, or a JSON body over its cap
        RangeNotSatisfiable 416  a Range outside the blob, or not one bytes=a-b range
        StoreError          503  a backend cannot be reached
            StoreFull       507  no space left; nothing partial is kept

Stores return None for "absent"; they raise only StoreError and its subclasses.
"""

from __future__ import annotations

import errno

# Out of space and out of quota both mean "free space first": both are StoreFull.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class ServerError(Exception):
    status = 500


class BadRequest(ServerError):
    status = 400


class Unauthorized(ServerError):
    status = 401


class Forbidden(ServerError):
    status = 403


class NotFound(ServerError):
    status = 404


class RequestTimeout(ServerError):
    status = 408


class ClientGone(ServerError):
    """The client closed the connection before its request body ended: nobody reads
    this answer (nginx logs such requests as 499), and nothing of the body is kept."""

    status = 499


class Conflict(ServerError):
    status = 409


class TooLarge(ServerError):
    status = 413


class RangeNotSatisfiable(ServerError):
    status = 416


class StoreError(ServerError):
    """A backend failed or cannot be reached."""

    status = 503


class StoreFull(StoreError):
    """The store is out of space; nothing partial was left behind."""

    status = 507
