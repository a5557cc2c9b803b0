"""What each durable document holds, and its name.

A document is JSON: ``{"format": 1, "kind": K, "body": {...}, "blake3": H}``, where
``H`` is the BLAKE3 of the body's canonical JSON: a document damaged at rest reads as
``DocumentError``, never as a different row. Bodies carry every field the index row
has, so a row comes back exactly as it was written (``created_at`` included: expiry
counts from the first publish, not from the rebuild).

Names (blobs/documents.py) hash whatever is not a plain segment:

    entries/<namespace>/<key>                   an entry (its manifest names its aliases)
    aliases/<namespace>/<blake3(alias)[:32]>    an alias added after the publish
    tokens/<token_id>                           a token (its secret's hash, never the secret)
    records/<kind>/<blake3(kind, ns, name)[:32]> a namespace policy or a pin
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

import blake3

from neffcache.server.eviction.pins import PIN
from neffcache.server.index import Entry, Record, Token
from neffcache.server.manifest import canonical_json
from neffcache.server.namespaces import POLICY

FORMAT = 1
ENTRIES = "entries/"
ALIASES = "aliases/"
TOKENS = "tokens/"
RECORDS = "records/"
# Records that are configuration, made by admins. The others (condemned marks, the
# program map, this module's own marker) are working state, rebuilt or re-learnt.
DURABLE_KINDS = frozenset({POLICY, PIN})


class DocumentError(ValueError):
    """A document that is not what its name says (damaged, or not ours)."""


def _hash(*parts: str) -> str:
    return blake3.blake3("\0".join(parts).encode()).hexdigest()[:32]


def entry_name(namespace: str, key: str) -> str:
    return f"{ENTRIES}{namespace}/{key}"


def alias_name(namespace: str, alias: str) -> str:
    return f"{ALIASES}{namespace}/{_hash(alias)}"


def token_name(token_id: str) -> str:
    return f"{TOKENS}{token_id}"


def record_name(kind: str, namespace: str, name: str) -> str:
    return f"{RECORDS}{kind}/{_hash(kind, namespace, name)}"


def encode(kind: str, body: dict[str, Any]) -> bytes:
    canonical = canonical_json(body)
    digest = blake3.blake3(canonical.encode()).hexdigest()
    text = f'{{"blake3":"{digest}","body":{canonical},"format":{FORMAT},"kind":"{kind}"}}'
    return text.encode()


def decode(data: bytes, kind: str) -> dict[str, Any]:
    """The body of a document of ``kind``; DocumentError if it is anything else."""
    try:
        raw = json.loads(data)
    except ValueError:
        raise DocumentError("not JSON") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("kind") != kind:
        raise DocumentError(f"not a format-{FORMAT} {kind} document")
    body = raw.get("body")
    if not isinstance(body, dict):
        raise DocumentError("no body")
    if blake3.blake3(canonical_json(body).encode()).hexdigest() != raw.get("blake3"):
        raise DocumentError("its body does not match its digest (damaged at rest)")
    return body


# --- entries


def entry_document(entry: Entry) -> bytes:
    return encode("entry", asdict(entry))


def entry_from(data: bytes) -> Entry:
    body = decode(data, "entry")
    try:
        entry = Entry(**body)
    except TypeError:
        raise DocumentError("an entry document with other fields") from None
    if not all(isinstance(getattr(entry, f), str) for f in ("namespace", "key", "manifest")):
        raise DocumentError("an entry document with fields of the wrong type")
    if not isinstance(entry.created_at, (int, float)) or not isinstance(entry.writer, str):
        raise DocumentError("an entry document with fields of the wrong type")
    return entry


# --- aliases added after their entry's publish


def alias_document(namespace: str, alias: str, key: str) -> bytes:
    return encode("alias", {"namespace": namespace, "alias": alias, "key": key})


def alias_from(data: bytes) -> tuple[str, str, str]:
    """(namespace, alias, key)."""
    body = decode(data, "alias")
    values = (body.get("namespace"), body.get("alias"), body.get("key"))
    if set(body) != {"namespace", "alias", "key"} or not all(isinstance(v, str) for v in values):
        raise DocumentError("an alias document with other fields")
    namespace, alias, key = (str(v) for v in values)
    return namespace, alias, key


# --- tokens


def token_document(token: Token) -> bytes:
    return encode("token", asdict(token))


def token_from(data: bytes) -> Token:
    body = decode(data, "token")
    # Every field required and typed: a default here could bring a revoked token back.
    if set(body) != {f.name for f in fields(Token)}:
        raise DocumentError("a token document with other fields")
    namespaces, created_at = body["namespaces"], body["created_at"]
    if (
        not all(isinstance(body[f], str) for f in ("token_id", "secret_hash", "scope", "name"))
        or not isinstance(namespaces, list)
        or not all(isinstance(n, str) for n in namespaces)
        or not isinstance(created_at, (int, float))
        or isinstance(created_at, bool)
        or not all(isinstance(body[f], bool) for f in ("revoked", "trusted"))
    ):
        raise DocumentError("a token document with fields of the wrong type")
    return Token(**{**body, "namespaces": tuple(namespaces)})


# --- namespace policies and pins


def record_document(record: Record) -> bytes:
    return encode("record", asdict(record))


def record_from(data: bytes) -> Record:
    body = decode(data, "record")
    try:
        record = Record(**body)
    except TypeError:
        raise DocumentError("a record document with other fields") from None
    if not all(isinstance(getattr(record, f), str) for f in ("kind", "namespace", "name", "value")):
        raise DocumentError("a record document with fields of the wrong type")
    return record


# --- what a stored manifest names, read tolerantly


def manifest_files(manifest: str) -> dict[str, int]:
    """Digest -> size of every file a stored manifest names. Tolerant, as
    ``entry_facts`` is: an entry acknowledged under an older, laxer parser is still
    restored (the publish validated it then; this only needs its blobs)."""
    try:
        files = json.loads(manifest).get("files")
    except (ValueError, AttributeError):
        return {}
    if not isinstance(files, dict):
        return {}
    found = {}
    for ref in files.values():
        if isinstance(ref, dict) and isinstance(ref.get("digest"), str):
            size = ref.get("size")
            found[ref["digest"]] = size if isinstance(size, int) else -1
    return found


def manifest_aliases(manifest: str) -> tuple[str, ...]:
    """The aliases a stored manifest gives its entry (``Manifest.aliases``), tolerantly."""
    try:
        raw = json.loads(manifest)
    except ValueError:
        return ()
    if not isinstance(raw, dict):
        return ()
    return tuple(
        value
        for value in (raw.get("direct_key"), raw.get("neuron_address"))
        if isinstance(value, str) and value
    )
