"""``DurableIndex``: an index that keeps its durable rows' documents in step.

A wrapper, like a metrics decorator: every call goes to the wrapped index, and after a
call that changed an entry, an alias, a token or an admin record, the document of that
row is made to match what the index now holds. Reading the index back, rather than
writing what the call was given, makes the rule the same for every interleaving: when
two replicas race (a publish beside an eviction of the same key, two admins'
compare-and-set), whichever settles last writes the index's final state.

Acknowledged means durable: a publish whose document cannot be written is taken back
and fails (503), so a client retries rather than trusting an entry that a lost index
would lose. A failed document write after any other change raises too (the change
stands in the index; ``neffcache admin fsck --repair`` writes the missing document).
A failed document delete only logs: the index row is gone, and a document left over
is what ``fsck`` reports as unindexed.

The marker record (``complete``) says the index holds every document's row: set on
a fresh pair of stores and by ``reindex``, and gone when the index is wiped. Without
it blob collection stops (a wiped index references nothing) until a reindex. Tokens,
policies and pins never wait for the marker: whoever sets it restores them first, and
they are restored again at every start and before every collection (a marked index
put back to an older backup lacks those made since), whatever else the store holds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.documents import DocumentStore
from neffcache.server.errors import StoreError
from neffcache.server.index import Entry, Index, PutResult, Record, Token, Touch

from . import documents as docs

log = logging.getLogger("neffcache.server.recovery")

META = "meta"  # record kind of the marker; not a durable kind
EMPTY_BESIDE_BLOBS = "the index is empty beside a blob store holding blobs but no documents"
# Record kind: an entry removed whose document could not be (value: its created_at).
TOMBSTONE = "removed"
_MARKER = "complete"


class DurableIndex:
    """``Index`` over ``index``, with documents in ``store``. Calls this class does
    not define go straight to the wrapped index (``__getattr__``): reads, leases,
    events, audit and access times have no documents."""

    def __init__(self, index: Index, store: DocumentStore, blobs: BlobStore | None = None) -> None:
        """``blobs`` tells whether a documented entry's blobs are there (by default
        ``store`` itself, when it is also the blob store, as every backend is)."""
        self.inner = index
        self.store = store
        self.blobs = blobs if blobs is not None else store if hasattr(store, "size") else None

    @property
    def local(self) -> bool:
        return bool(getattr(self.inner, "local", False) and getattr(self.store, "local", False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # --- entries

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        result = self.inner.put_entry(entry, aliases)
        if result is PutResult.CREATED:
            try:
                result = self._document_created(entry)
            except StoreError:
                self.inner.delete_entry(entry.namespace, entry.key, entry.created_at)
                raise
            if self.inner.get_entry(entry.namespace, entry.key) != entry:
                # Removed meanwhile (another replica's eviction, between the row and
                # the document): the document must follow the index, not the call.
                try:
                    self.sync_entry(entry.namespace, entry.key)
                except StoreError as exc:
                    log.warning("entry %s/%s: %s", entry.namespace, entry.key, exc)
        elif result is PutResult.SAME:
            # A retry of a publish that may have died between the row and its document.
            self.sync_entry(entry.namespace, entry.key, missing_only=True)
        return result

    def _document_created(self, entry: Entry) -> PutResult:
        """Write a new row's document, create-only: a document already there was
        acknowledged for a row the index has lost (a wipe not yet reindexed, a backup
        restored). Of another manifest, it wins: the row goes back to it and this
        publish conflicts, as it would have against the row."""
        name = docs.entry_name(entry.namespace, entry.key)
        wanted = docs.entry_document(entry)
        if self.store.put_document(name, wanted, create_only=True):
            return PutResult.CREATED
        try:
            held: Entry | None = docs.entry_from(self.store.get_document(name) or b"")
        except docs.DocumentError:
            held = None  # gone since, or damaged: nothing to keep
        if held is not None and held.manifest != entry.manifest and self._restorable(held):
            self.inner.delete_entry(entry.namespace, entry.key, entry.created_at)
            if (
                self.inner.put_entry(held, docs.manifest_aliases(held.manifest))
                is PutResult.CREATED
            ):
                self.inner.touch_entries([Touch(held.namespace, held.key, time.time(), 0)])
            return PutResult.CONFLICT
        self.store.put_document(name, wanted)
        return PutResult.CREATED

    def _restorable(self, entry: Entry) -> bool:
        """Whether every blob a documented entry names is stored (without a blob store
        to ask, it is kept)."""
        files = docs.manifest_files(entry.manifest)
        return self.blobs is None or all(self.blobs.size(d) == n for d, n in files.items())

    def delete_entry(self, namespace: str, key: str, created_at: float) -> bool:
        deleted = self.inner.delete_entry(namespace, key, created_at)
        if deleted:
            try:
                self.sync_entry(namespace, key)
            except StoreError as exc:
                # The removal stands; a tombstone says so, so that the check before
                # the next collection (reindex.py reconcile) deletes the document
                # rather than taking the entry for one the index lost.
                log.warning("entry %s/%s removed; its document stays: %s", namespace, key, exc)
                self.inner.put_record(Record(TOMBSTONE, namespace, key, repr(created_at)))
        return deleted

    def sync_entry(self, namespace: str, key: str, *, missing_only: bool = False) -> None:
        """Make the entry's document what the index holds now (none, if no entry)."""
        name = docs.entry_name(namespace, key)
        entry = self.inner.get_entry(namespace, key)
        if entry is None:
            self.store.delete_document(name)
            # A publish of the key between the two calls wrote its document before
            # the delete, or writes it after: look once more.
            entry = self.inner.get_entry(namespace, key)
        if entry is not None:
            wanted = docs.entry_document(entry)
            if missing_only and self.store.get_document(name) == wanted:
                return
            self.store.put_document(name, wanted)

    # --- aliases

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        result = self.inner.add_alias(namespace, alias, key)
        if result is not None and result is not PutResult.CONFLICT:
            name = docs.alias_name(namespace, alias)
            wanted = docs.alias_document(namespace, alias, key)
            if result is PutResult.CREATED or self.store.get_document(name) != wanted:
                self.store.put_document(name, wanted)
        return result

    # --- tokens

    def put_token(self, token: Token) -> None:
        self.inner.put_token(token)
        self.sync_token(token.token_id)

    def revoke_token(self, token_id: str) -> bool:
        revoked = self.inner.revoke_token(token_id)
        if revoked:
            self.sync_token(token_id)
        return revoked

    def sync_token(self, token_id: str) -> None:
        """Make the token's document what the index holds, except that a revocation
        either side knows of stands on both: a token re-created at start-up on a lost
        index (the bootstrap token), or an index restored from an older backup, never
        brings a revoked token back."""
        name = docs.token_name(token_id)
        for token in self.inner.tokens():
            if token.token_id != token_id:
                continue
            if not token.revoked and self._revoked_in_document(name):
                self.inner.revoke_token(token_id)
                token = replace(token, revoked=True)
            self.store.put_document(name, docs.token_document(token))

    def _revoked_in_document(self, name: str) -> bool:
        data = self.store.get_document(name)
        try:
            return data is not None and docs.token_from(data).revoked
        except docs.DocumentError:
            return False

    # --- admin records

    def put_record(
        self, record: Record, *, create_only: bool = False, replacing: str | None = None
    ) -> bool:
        stored = self.inner.put_record(record, create_only=create_only, replacing=replacing)
        if stored and record.kind in docs.DURABLE_KINDS:
            self.sync_record(record.kind, record.namespace, record.name)
        return stored

    def delete_record(self, kind: str, namespace: str, name: str) -> bool:
        deleted = self.inner.delete_record(kind, namespace, name)
        if deleted and kind in docs.DURABLE_KINDS:
            self.sync_record(kind, namespace, name)
        return deleted

    def sync_record(self, kind: str, namespace: str, name: str) -> None:
        """Make the record's document what the index holds now; written again while
        the index changes under it (another admin's compare-and-set)."""
        doc_name = docs.record_name(kind, namespace, name)
        for _ in range(3):
            record = self.inner.get_record(kind, namespace, name)
            if record is None:
                try:
                    self.store.delete_document(doc_name)
                except StoreError:
                    # The removal stands: a tombstone tells fsck the document left
                    # is of a removed record, not of a row the index lost.
                    self.inner.put_record(Record(TOMBSTONE, "", doc_name, "record"))
                    raise
            else:
                self.store.put_document(doc_name, docs.record_document(record))
                # A tombstone of an earlier removal of this record is stale now: left,
                # it would have a restore delete this document if the row were lost.
                self.inner.delete_record(TOMBSTONE, "", doc_name)
            if self.inner.get_record(kind, namespace, name) == record:
                return


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
