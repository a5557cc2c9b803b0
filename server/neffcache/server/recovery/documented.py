"""The primitives durable rows live in, each write followed by its row's document:
``DocumentedCatalogs`` (entries and aliases) and ``DocumentedMaps`` (the token map and
the maps of the durable record kinds). ``DurableIndex`` (durable.py) writes the roles
over these instead of the index's own, so a row's document follows every primitive
call that changed the row, whatever role made it.

After a call that changed a row, its document is made what the primitive holds now,
read back rather than taken from the call: when two replicas race (a publish beside an
eviction of the same key, two admins' compare-and-set), whichever settles last writes
the final state. A refused write of an equal row or value (a client's retry) writes the
document too if it is missing: the first try may have died between the two.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from neffcache.server.auth import trusted_writer_ids
from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.documents import DocumentStore
from neffcache.server.errors import StoreError
from neffcache.server.index import Entry, EntryStats, Index, Record, Touch
from neffcache.server.index.base import EntryFacts, entry_facts
from neffcache.server.index.catalogs import Catalogs
from neffcache.server.index.primitives import Maps
from neffcache.server.index.records import MapRecords, documented_kind
from neffcache.server.index.tokens import TOKENS, token_from, token_value
from neffcache.server.namespaces import POLICY

from . import documents as docs

log = logging.getLogger("neffcache.server.recovery")

# Record kind: a row removed whose document could not be (for an entry, its
# created_at; for a record, the name of its document).
TOMBSTONE = "removed"
# Rounds of writing a record's or token's document while its row changes under it
# (another admin's compare-and-set) before the last writer's document is left to stand.
ROUNDS = 3


def untrusted(index: Index) -> Callable[[Entry], bool]:
    """Whether an entry's writer may not publish into its namespace now (it takes only
    trusted writers): its document outlived a take-back (services/publish.py ``publish``
    removes an untrusted entry that raced the rule) whose document delete failed."""
    trusted = trusted_writer_ids(index)
    only = set()
    for held in index.records(POLICY):
        try:
            value = json.loads(held.value)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("trusted_writers_only") is True:
            only.add(held.namespace)
    return lambda entry: entry.namespace in only and entry.writer not in trusted


class DocumentedCatalogs:
    """``Catalogs`` over ``inner``: a row's document (``entries/``) is written with it,
    create-only, and removed with it; a name's (``aliases/``) when it is claimed."""

    def __init__(
        self,
        inner: Catalogs,
        store: DocumentStore,
        blobs: BlobStore | None,
        marks: MapRecords,
        refused: Callable[[Entry], bool],
    ) -> None:
        """``blobs`` tells whether a documented row's blobs are there (None: assume
        so); ``marks`` holds tombstones, records without documents; ``refused``, whether
        a documented row's writer may no longer write to its catalog (``untrusted``
        above): such a row is never put back."""
        self.inner = inner
        self.store = store
        self.blobs = blobs
        self.marks = marks
        self.refused = refused

    def put_new(self, row: Entry, facts: EntryFacts, names: Sequence[str]) -> Entry | None:
        held = self.inner.put_new(row, facts, names)
        if held is not None:
            if held.manifest == row.manifest:
                self.sync(row.namespace, row.key, missing_only=True)
            return held
        try:
            held = self._document_created(row)
        except StoreError:
            # Acknowledged means durable: without its document the row is taken back,
            # and the publish fails (503) for the client to retry.
            self.inner.delete_if(row.namespace, row.key, row.created_at)
            raise
        if self.inner.get(row.namespace, row.key) != (held or row):
            # Removed meanwhile (another replica's eviction, between the row and the
            # document): the document must follow the catalog, not the call.
            try:
                self.sync(row.namespace, row.key)
            except StoreError as exc:
                log.warning("entry %s/%s: %s", row.namespace, row.key, exc)
        return held

    def _document_created(self, row: Entry) -> Entry | None:
        """Write a new row's document, create-only, and return None; a document
        already there was acknowledged for a row the catalog has lost (a wipe not yet
        reindexed, a backup restored). Of another manifest whose blobs are all there,
        it wins: its row goes back in this one's place and is returned, as a put
        refused by it would have returned it. Not a removal's leftover (a tombstone
        says so), nor a row whose writer the catalog refuses now: reindex and fsck
        would not put those back either, and this row replaces them."""
        name = docs.entry_name(row.namespace, row.key)
        wanted = docs.entry_document(row)
        if self.store.put_document(name, wanted, create_only=True):
            return None
        try:
            held: Entry | None = docs.entry_from(self.store.get_document(name) or b"")
        except docs.DocumentError:
            held = None  # gone since, or damaged: nothing to keep
        if held is not None and held.manifest != row.manifest and self._restorable(held):
            self.inner.delete_if(row.namespace, row.key, row.created_at)
            aliases = docs.manifest_aliases(held.manifest)
            if self.inner.put_new(held, entry_facts(held.manifest), aliases) is None:
                self.inner.touch([Touch(held.namespace, held.key, time.time(), 0)])
            return held
        self.store.put_document(name, wanted)
        return None

    def _restorable(self, row: Entry) -> bool:
        if self._removed(row) or self.refused(row):
            return False
        files = docs.manifest_files(row.manifest)
        return self.blobs is None or all(self.blobs.size(d) == n for d, n in files.items())

    def _removed(self, row: Entry) -> bool:
        """Whether ``row``'s document is a removal's leftover (durable.py
        ``finish_removal`` reads the same tombstone)."""
        tomb = self.marks.get_record(TOMBSTONE, row.namespace, row.key)
        return tomb is not None and tomb.value == repr(row.created_at)

    def claim(self, catalog: str, name: str, key: str) -> tuple[bool, str] | None:
        claimed = self.inner.claim(catalog, name, key)
        if claimed is not None and claimed[1] == key:
            doc_name = docs.alias_name(catalog, name)
            wanted = docs.alias_document(catalog, name, key)
            if claimed[0] or self.store.get_document(doc_name) != wanted:
                self.store.put_document(doc_name, wanted)
        return claimed

    def delete_if(self, catalog: str, key: str, created_at: float) -> bool:
        deleted = self.inner.delete_if(catalog, key, created_at)
        if deleted:
            try:
                self.sync(catalog, key)
            except StoreError as exc:
                # The removal stands; a tombstone says so, so that the check before
                # the next collection (reindex.py reconcile) deletes the document
                # rather than taking the entry for one the catalog lost.
                log.warning("entry %s/%s removed; its document stays: %s", catalog, key, exc)
                self.marks.put_record(Record(TOMBSTONE, catalog, key, repr(created_at)))
        return deleted

    def sync(self, catalog: str, key: str, *, missing_only: bool = False) -> None:
        """Make the row's document what the catalog holds now (none, if no row)."""
        name = docs.entry_name(catalog, key)
        row = self.inner.get(catalog, key)
        if row is None:
            self.store.delete_document(name)
            # A publish of the key between the two calls wrote its document before
            # the delete, or writes it after: look once more.
            row = self.inner.get(catalog, key)
        if row is not None:
            wanted = docs.entry_document(row)
            if missing_only and self.store.get_document(name) == wanted:
                return
            self.store.put_document(name, wanted)

    # Reads and use have no documents.

    def get(self, catalog: str, key: str) -> Entry | None:
        return self.inner.get(catalog, key)

    def resolve(self, catalog: str, name: str) -> str | None:
        return self.inner.resolve(catalog, name)

    def names_of(self, catalog: str, key: str) -> list[str]:
        return self.inner.names_of(catalog, key)

    def rows(self, catalog: str, after: str | None, limit: int) -> list[Entry]:
        return self.inner.rows(catalog, after, limit)

    def stats(self, catalog: str, after: str | None, limit: int) -> list[EntryStats]:
        return self.inner.stats(catalog, after, limit)

    def touch(self, touches: Sequence[Touch]) -> None:
        self.inner.touch(touches)

    def catalogs(self) -> list[str]:
        return self.inner.catalogs()


class DocumentedMaps:
    """``Maps`` over ``inner``: a field of the token map (``tokens/``, by token id)
    or of a durable record kind's map (``records/``) has its document written after
    every write that changed it; other maps have none."""

    def __init__(self, inner: Maps, store: DocumentStore, marks: MapRecords) -> None:
        self.inner = inner
        self.store = store
        self.marks = marks

    def put_new(self, name: str, field: str, value: str) -> bool:
        stored = self.inner.put_new(name, field, value)
        if self._documented(name) and (stored or self.inner.get(name, field) == value):
            self.sync(name, field)
        return stored

    def swap(self, name: str, field: str, expected: str, value: str) -> bool:
        swapped = self.inner.swap(name, field, expected, value)
        if swapped:
            self.sync(name, field)
        return swapped

    def delete_if(self, name: str, field: str, expected: str) -> bool:
        deleted = self.inner.delete_if(name, field, expected)
        if deleted:
            self.sync(name, field)
        return deleted

    def get(self, name: str, field: str) -> str | None:
        return self.inner.get(name, field)

    def items(self, name: str) -> dict[str, str]:
        return self.inner.items(name)

    @staticmethod
    def _documented(name: str) -> bool:
        return name == TOKENS or documented_kind(name, docs.DURABLE_KINDS) is not None

    def sync(self, name: str, field: str) -> None:
        """Make the field's document what the map holds now (none for a map without
        documents)."""
        if name == TOKENS:
            self._sync_token(field)
        elif (kind := documented_kind(name, docs.DURABLE_KINDS)) is not None:
            self._sync_record(kind, name, field)

    def _sync_token(self, secret_hash: str) -> None:
        """A token's document is what the map holds, except that a revocation either
        side knows of stands on both: a token re-created at start-up on a lost index
        (the bootstrap token), or an index restored from an older backup, never brings
        a revoked token back. (Tokens are never deleted.)"""
        for _ in range(ROUNDS):
            value = self.inner.get(TOKENS, secret_hash)
            if value is None:
                return
            token = token_from(secret_hash, value)
            name = docs.token_name(token.token_id)
            if not token.revoked and self._revoked_in_document(name):
                token = replace(token, revoked=True)
                if not self.inner.swap(TOKENS, secret_hash, value, token_value(token)):
                    continue  # changed meanwhile: read it again
            self.store.put_document(name, docs.token_document(token))
            if self.inner.get(TOKENS, secret_hash) == token_value(token):
                return

    def _revoked_in_document(self, name: str) -> bool:
        data = self.store.get_document(name)
        try:
            return data is not None and docs.token_from(data).revoked
        except docs.DocumentError:
            return False

    def _sync_record(self, kind: str, map_name: str, field: str) -> None:
        namespace, name = json.loads(field)
        doc_name = docs.record_name(kind, namespace, name)
        for _ in range(ROUNDS):
            value = self.inner.get(map_name, field)
            if value is None:
                try:
                    self.store.delete_document(doc_name)
                except StoreError:
                    # The removal stands: a tombstone tells fsck the document left
                    # is of a removed record, not of a row the index lost.
                    self.marks.put_record(Record(TOMBSTONE, "", doc_name, "record"))
                    raise
            else:
                record = Record(kind, namespace, name, value)
                self.store.put_document(doc_name, docs.record_document(record))
                # A tombstone of an earlier removal of this record is stale now: left,
                # it would have a restore delete this document if the row were lost.
                self.marks.delete_record(TOMBSTONE, "", doc_name)
            if self.inner.get(map_name, field) == value:
                return
