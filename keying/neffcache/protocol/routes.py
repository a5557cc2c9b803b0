"""The paths of the HTTP API (docs/protocol.md), spelled once.

The ``*_ROUTE`` constants are the server's route templates (what FastAPI declares);
the functions build the paths a client sends. ``tests/protocol`` checks every template
against the server's OpenAPI document, so a renamed route fails a test, not a fleet.

Keys and digests go into paths as they are (64 hex digits need no quoting). A lease
name or an alias may be a stock address (``neuronxcc-…/MODULE_…+…``): its ``+`` and
any other byte outside a path's alphabet are percent-quoted, its ``/`` kept, as the
server's ``{alias:path}`` and ``{name:path}`` routes read it.
"""

from __future__ import annotations

from .states import LeaseOutcome

API = "/v1"
BLOB_ROUTE = "/v1/blobs/{digest}"
BLOB_MISMATCH_ROUTE = "/v1/blobs/{digest}/mismatch"
BLOBS_MISSING = "/v1/blobs/missing"
ENTRIES_ROUTE = "/v1/ns/{namespace}/entries"
ENTRY_ROUTE = "/v1/ns/{namespace}/entries/{key}"
ALIAS_ROUTE = "/v1/ns/{namespace}/aliases/{alias}"
FAILURE_ROUTE = "/v1/ns/{namespace}/failures/{key}"
LEASE_ROUTE = "/v1/ns/{namespace}/leases/{name}"
EXPLAIN_ROUTE = "/v1/ns/{namespace}/explain"
EVENTS = "/v1/events"
STATUS = "/v1/status"


def _quoted(name: str, safe: str = "/") -> str:
    # Imported here: urllib.parse costs the shim's import more than this whole package,
    # and only a request that names an alias or a lease needs it.
    from urllib.parse import quote

    return quote(name, safe=safe)


def namespace_path(namespace: str) -> str:
    """The prefix of every path inside ``namespace``."""
    return f"{API}/ns/{namespace}"


def blob_path(digest: str) -> str:
    return f"{API}/blobs/{digest}"


def blob_mismatch_path(digest: str) -> str:
    return f"{blob_path(digest)}/mismatch"


def entries_path(namespace: str) -> str:
    return f"{namespace_path(namespace)}/entries"


def entry_path(namespace: str, key: str) -> str:
    return f"{entries_path(namespace)}/{key}"


def alias_path(namespace: str, alias: str) -> str:
    return f"{namespace_path(namespace)}/aliases/{_quoted(alias)}"


def failure_path(namespace: str, key: str) -> str:
    return f"{namespace_path(namespace)}/failures/{key}"


def explain_path(namespace: str) -> str:
    return f"{namespace_path(namespace)}/explain"


def lease_path(namespace: str, name: str) -> str:
    """Ask for (POST) the lease on ``name``."""
    return f"{namespace_path(namespace)}/leases/{_quoted(name)}"


def lease_renew_path(namespace: str, name: str, lease_id: str) -> str:
    """Renew (PUT) a held lease."""
    # The id comes from the server's answer: quoted whole, it can add no parameter.
    return f"{lease_path(namespace, name)}?lease={_quoted(lease_id, safe='')}"


def lease_release_path(namespace: str, name: str, lease_id: str, outcome: LeaseOutcome) -> str:
    """Release (DELETE) a held lease, saying how its compile ended."""
    return f"{lease_renew_path(namespace, name, lease_id)}&outcome={outcome}"
