"""``DurableIndex``: an index that keeps its durable rows' documents in step.

A wrapper of the primitives, like a metrics decorator: the roles that hold durable
rows (entries and aliases, tokens, records) are written over the index's catalogs and
maps wrapped by documented.py, whose every write that changed a row is followed by that
row's document; every other call (reads, leases, failures, events, audit, access
times) goes straight to the wrapped index (``__getattr__``).

Acknowledged means durable: a publish whose document cannot be written is taken back
and fails (503), so a client retries rather than trusting an entry that a lost index
would lose. A failed document write after any other change raises too (the change
stands in the index; ``neffcache admin fsck --repair`` writes the missing document).
A failed document delete only logs: the index row is gone, a tombstone says so, and a
document left over is what ``fsck`` reports as unindexed.

The marker record (``complete``) says the index holds every document's row: set on
a fresh pair of stores and by ``reindex``, and gone when the index is wiped. Without
it blob collection stops (a wiped index references nothing) until a reindex. Tokens,
policies and pins never wait for the marker: whoever sets it restores them first, and
they are restored again at every start and before every collection (a marked index
put back to an older backup lacks those made since), whatever else the store holds.
"""

from __future__ import annotations

import time
from typing import Any, cast

from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.documents import DocumentStore
from neffcache.server.index import Entry, Index, PutResult, Record, Token
from neffcache.server.index.entries import CatalogEntries
from neffcache.server.index.primitive_roles import IndexBackend
from neffcache.server.index.records import MapRecords, record_field, records_map
from neffcache.server.index.tokens import TOKENS, MapTokens

from . import documents as docs
from .documented import TOMBSTONE, DocumentedCatalogs, DocumentedMaps, untrusted

META = "meta"  # record kind of the marker; not a durable kind
EMPTY_BESIDE_BLOBS = "the index is empty beside a blob store holding blobs but no documents"
_MARKER = "complete"


class DurableIndex:
    """``Index`` over ``index``, with documents in ``store``, and an ``IndexBackend``
    itself: its ``catalogs`` and ``maps`` are the documented ones. Calls this class
    does not define go straight to the wrapped index (``__getattr__``): reads,
    leases, failures, events, audit and access times have no documents."""

    def __init__(
        self, index: IndexBackend, store: DocumentStore, blobs: BlobStore | None = None
    ) -> None:
        """``blobs`` tells whether a documented entry's blobs are there (by default
        ``store`` itself, when it is also the blob store, as every backend is)."""
        self.inner = index
        self.store = store
        self.blobs = blobs
        if blobs is None and hasattr(store, "size"):
            self.blobs = cast(BlobStore, store)
        marks = MapRecords(index.maps)
        self.catalogs = DocumentedCatalogs(
            index.catalogs, store, self.blobs, marks, refused=self._untrusted
        )
        self.maps = DocumentedMaps(index.maps, store, marks)
        self._entries = CatalogEntries(self.catalogs)
        self._tokens = MapTokens(self.maps)
        self._records = MapRecords(self.maps)

    def _untrusted(self, entry: Entry) -> bool:
        """Whether the namespace refuses ``entry``'s writer now (documented.py)."""
        return untrusted(self.inner)(entry)

    @property
    def local(self) -> bool:
        return bool(getattr(self.inner, "local", False) and getattr(self.store, "local", False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # --- the writes of durable rows, over the documented primitives

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        return self._entries.put_entry(entry, aliases)

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        return self._entries.add_alias(namespace, alias, key)

    def delete_entry(self, namespace: str, key: str, created_at: float) -> bool:
        return self._entries.delete_entry(namespace, key, created_at)

    def tokens_ready(self) -> MapTokens:
        self.inner.tokens_ready()
        return self._tokens

    def put_token(self, token: Token) -> None:
        self.tokens_ready().put_token(token)

    def revoke_token(self, token_id: str) -> bool:
        return self.tokens_ready().revoke_token(token_id)

    def put_record(
        self, record: Record, *, create_only: bool = False, replacing: str | None = None
    ) -> bool:
        return self._records.put_record(record, create_only=create_only, replacing=replacing)

    def delete_record(self, kind: str, namespace: str, name: str) -> bool:
        return self._records.delete_record(kind, namespace, name)

    # --- documents made what the index holds (fsck's repairs)

    def sync_entry(self, namespace: str, key: str, *, missing_only: bool = False) -> None:
        """Make the entry's document what the index holds now (none, if no entry)."""
        self.catalogs.sync(namespace, key, missing_only=missing_only)

    def sync_token(self, token_id: str) -> None:
        """Make the token's document what the index holds (a revocation either side
        knows of standing on both: documented.py)."""
        for token in self.inner.tokens():
            if token.token_id == token_id:
                self.maps.sync(TOKENS, token.secret_hash)

    def sync_record(self, kind: str, namespace: str, name: str) -> None:
        """Make the record's document what the index holds now."""
        self.maps.sync(records_map(kind), record_field(namespace, name))


# --- the marker


def is_complete(index: Index) -> bool:
    """Whether the index holds a row for every document (see the module docstring)."""
    return index.get_record(META, "", _MARKER) is not None


def mark_complete(index: Index, how: str) -> None:
    index.put_record(Record(META, "", _MARKER, f'{{"at":{time.time()!r},"how":"{how}"}}'))


def has_documents(store: DocumentStore, *prefixes: str) -> bool:
    """Whether the store holds a document under any of ``prefixes``."""
    return any(next(iter(store.documents(prefix)), None) is not None for prefix in prefixes)


def looks_lost(index: Index, store: DocumentStore, blobs: BlobStore) -> str | None:
    """Why an unmarked index must not be marked complete as it is (None: it may be):
    entry documents exist (a lost or wiped index), or it is empty beside a blob store
    holding blobs but no documents (a restore under way that copied blobs/ before
    documents/, or a replica pointed at the wrong prefix)."""
    if has_documents(store, docs.ENTRIES):
        return "the blob store holds entry documents: the index was lost or wiped"
    if not index.namespaces() and next(iter(blobs.blobs()), None) is not None:
        return EMPTY_BESIDE_BLOBS
    return None


def finish_removal(index: Index, store: DocumentStore, entry: Entry) -> bool:
    """Whether ``entry`` (read from a document without its row) was removed on
    purpose, its document left by a failed delete (a tombstone says so): then the
    document and the tombstone are deleted now, and it must not be restored."""
    tomb = index.get_record(TOMBSTONE, entry.namespace, entry.key)
    if tomb is None or tomb.value != repr(entry.created_at):
        return False
    store.delete_document(docs.entry_name(entry.namespace, entry.key))
    index.delete_record(TOMBSTONE, entry.namespace, entry.key)
    return True
