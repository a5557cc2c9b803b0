"""``reindex``: rebuild the index from the documents in the blob store; and
``IndexRecovery``, which the evicting replica runs before it collects blobs.

Additive and idempotent: a row the index holds already stays as it is (the index wins
a disagreement, reported as a conflict), so it is safe beside live replicas and safe
to run twice. An entry comes back only if every blob it names is there at its size;
one whose blobs are gone is reported, never restored half (``fsck --repair`` removes
its document). Rows come back as written, ``created_at`` included, and as last served
at the restore, with no hits: a restore is not a reason to expire them all.

Tokens, policies and pins come back on every path that restores anything (start-up,
the evicting replica's tick on an unmarked index, ``reindex``, the check before a
collection), whatever the store holds beside their documents: an index wiped before
any entry was published lacks them as much as one wiped later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import TypeVar

from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.documents import DocumentStore
from neffcache.server.errors import StoreError
from neffcache.server.index import Entry, Index, PutResult, Touch

from . import documents as docs
from .documented import TOMBSTONE, untrusted
from .durable import (
    EMPTY_BESIDE_BLOBS,
    DurableIndex,
    finish_removal,
    is_complete,
    looks_lost,
    mark_complete,
)

log = logging.getLogger("neffcache.server.recovery")
T = TypeVar("T")

# Documents fetched at once: S3 answers each GET in milliseconds, so a large cache
# needs many in flight; a filesystem does not mind.
_FETCHERS = 16
_BATCH = 1000


@dataclass
class ReindexReport:
    restored: int = 0  # entries put back
    present: int = 0  # entries the index held already
    conflicts: list[str] = field(default_factory=list)  # index holds another manifest
    missing_blobs: list[str] = field(default_factory=list)  # entries not restored
    untrusted: list[str] = field(default_factory=list)  # writers the namespace refuses now
    removed: int = 0  # documents of rows removed on purpose (a tombstone), deleted now
    aliases: int = 0
    tokens: int = 0
    records: int = 0  # namespace policies and pins
    damaged: list[str] = field(default_factory=list)  # documents that do not read
    complete: bool = False  # ran to the end and marked the index complete
    seconds: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "restored": self.restored,
            "present": self.present,
            "conflicts": self.conflicts,
            "missing_blobs": self.missing_blobs,
            "untrusted": self.untrusted,
            "removed": self.removed,
            "aliases": self.aliases,
            "tokens": self.tokens,
            "records": self.records,
            "damaged": self.damaged,
            "complete": self.complete,
            "seconds": round(self.seconds, 3),
        }


def fetched(store: DocumentStore, names: Iterable[str]) -> Iterator[tuple[str, bytes | None]]:
    """The documents ``names`` lists, with their bytes (None: deleted since listed),
    fetched by a pool of threads in order, a batch at a time (memory stays bounded
    for any number of documents)."""
    listing = iter(names)
    with ThreadPoolExecutor(_FETCHERS, thread_name_prefix="neffcache-documents") as pool:
        while batch := list(islice(listing, _BATCH)):
            yield from zip(batch, pool.map(store.get_document, batch), strict=True)


def decoded(
    store: DocumentStore,
    prefix: str,
    reader: Callable[[bytes], T],
    damaged: list[str],
) -> Iterator[tuple[str, T]]:
    """Every document under ``prefix`` read by ``reader`` (``decoded_names``)."""
    return decoded_names(store, store.documents(prefix), reader, damaged)


def decoded_names(
    store: DocumentStore,
    names: Iterable[str],
    reader: Callable[[bytes], T],
    damaged: list[str],
) -> Iterator[tuple[str, T]]:
    """The documents ``names`` lists, read by ``reader`` (``documents.*_from``), with
    their names; the names of those that do not read (or that an entry's fields would
    name otherwise: a document copied to the wrong place) go to ``damaged``."""
    for name, data in fetched(store, names):
        if data is None:
            continue  # deleted since the listing
        try:
            value = reader(data)
            if isinstance(value, Entry) and name != docs.entry_name(value.namespace, value.key):
                raise docs.DocumentError("named for another entry")
        except docs.DocumentError:
            damaged.append(name)
            continue
        yield name, value


def all_entries(index: Index) -> Iterator[Entry]:
    """Every entry of every namespace, a page at a time."""
    for namespace in index.namespaces():
        after = None
        while page := index.list_entries(namespace, after, _BATCH):
            yield from page
            after = page[-1].key


def restore_entry(
    index: Index,
    entry: Entry,
    report: ReindexReport,
    size: Callable[[str], int | None],
    refused: Callable[[Entry], bool] = lambda entry: False,
) -> None:
    """Put one documented entry back, if every blob it names is there (``size``:
    a digest's stored size, None when absent) and its writer may write there
    (``untrusted``); the index's own rules decide between it and a row already
    there."""
    where = f"{entry.namespace}/{entry.key}"
    if refused(entry):
        report.untrusted.append(where)
        return
    files = docs.manifest_files(entry.manifest)
    if not files:
        report.damaged.append(docs.entry_name(entry.namespace, entry.key))
        return
    if any(size(digest) != expected for digest, expected in files.items()):
        report.missing_blobs.append(where)
        return
    result = index.put_entry(entry, docs.manifest_aliases(entry.manifest))
    if result is PutResult.CREATED:
        report.restored += 1
        index.touch_entries([Touch(entry.namespace, entry.key, time.time(), 0)])
    elif result is PutResult.SAME:
        report.present += 1
    else:
        report.conflicts.append(where)


def put_back(
    index: Index,
    store: DocumentStore,
    entry: Entry,
    report: ReindexReport,
    size: Callable[[str], int | None],
    refused: Callable[[Entry], bool],
) -> None:
    """A documented entry the index lacks: its removal finished (a tombstone), or the
    entry restored (``restore_entry``)."""
    if finish_removal(index, store, entry):
        report.removed += 1
    else:
        restore_entry(index, entry, report, size, refused)


def restore_configuration(index: Index, store: DocumentStore, report: ReindexReport) -> None:
    """Namespace policies and pins, then tokens, from their documents: whatever the
    index lacks. Policies first: a restored token must never find its namespace
    without its rules (an untrusted writer publishing into a namespace that takes
    only trusted writers while that rule is not back yet). A token revoked on either
    side stays revoked; a row the index holds stays as it is. A record whose removal
    could not delete its document (a tombstone says so) is not restored: its
    removal is finished now, as fsck --repair finishes it."""
    for name, record in decoded(store, docs.RECORDS, docs.record_from, report.damaged):
        if index.get_record(record.kind, record.namespace, record.name) is not None:
            continue
        if index.get_record(TOMBSTONE, "", name) is not None:
            store.delete_document(name)
            index.delete_record(TOMBSTONE, "", name)
            report.removed += 1
        elif index.put_record(record, create_only=True):
            report.records += 1
    for _, token in decoded(store, docs.TOKENS, docs.token_from, report.damaged):
        held = index.token_by_hash(token.secret_hash)
        if held is None:
            index.put_token(token)
            report.tokens += 1
        elif token.revoked and not held.revoked:
            index.revoke_token(held.token_id)
            report.tokens += 1


def check_at_start(index: Index, store: DocumentStore, blobs: BlobStore) -> bool:
    """At start-up, before the bootstrap token and protected mode: the index gets
    the tokens, policies and pins it lacks back from their documents at once (a
    server off loopback refuses to start without tokens, and a revoked bootstrap
    token must be found revoked before it is made again). Marked or not: a marked
    index put back to a backup lacks those made after it, and the marker says
    nothing of them. Then an unmarked index is marked complete when nothing can be
    missing from it (``looks_lost``: a new cache, or one from before documents,
    which ``fsck --repair`` backs up); else its entries wait for the evicting
    replica's reindex (eviction/maintenance.py), or ``neffcache admin reindex``.
    True when it is complete."""
    complete = is_complete(index)
    restored = ReindexReport()
    try:
        restore_configuration(index, store, restored)
    except StoreError as exc:
        if not complete:
            raise
        # A marked index lacks at most what a backup missed, not a reason to refuse
        # to start; the check before the next collection tries again.
        log.warning(
            "start-up: cannot compare tokens, policies and pins with their documents: %s", exc
        )
    if restored.tokens or restored.records:
        log.warning(
            "start-up: %d tokens and %d policies and pins restored from their documents "
            "(the index had lost them)",
            restored.tokens,
            restored.records,
        )
    if complete:
        return True
    why = looks_lost(index, store, blobs)
    if why is not None:
        log.warning(
            "%s: blob collection waits until a reindex restores it (the evicting "
            "replica's own, or `neffcache admin reindex`)",
            why,
        )
        return False
    mark_complete(index, "start-up: nothing to restore")
    return True


def reindex(
    index: Index,
    blobs: BlobStore,
    store: DocumentStore,
    progress: Callable[[str], None] = log.info,
    leading: Callable[[], bool] = lambda: True,
) -> ReindexReport:
    """Restore every documented row the index lacks, then mark the index complete.
    ``index`` is the plain index, not ``DurableIndex``: the documents are the source
    here. ``leading`` is asked every batch (the evicting replica's lease, renewed):
    False stops it unmarked, for the next leader to finish. StoreError ends it
    early; run it again."""
    started = time.monotonic()
    report = ReindexReport()
    # Configuration first: replicas answer 401 to every client until their tokens are
    # back, and entries are restored by the rules of the policies and tokens.
    restore_configuration(index, store, report)
    progress(f"tokens {report.tokens}, policies and pins {report.records}")
    # One listing of the blobs instead of a HEAD per blob: on S3, a thousand per request.
    sizes = {blob.digest: blob.size for blob in blobs.blobs()}
    progress(f"{len(sizes)} blobs listed")
    entries = decoded(store, docs.ENTRIES, docs.entry_from, report.damaged)
    refused = untrusted(index)

    def size(digest: str) -> int | None:
        # A blob stored after the listing is asked for; one listed stays until its
        # entry is back (the collector runs on this replica, after this).
        return sizes[digest] if digest in sizes else blobs.size(digest)

    for count, (_, entry) in enumerate(entries, 1):
        put_back(index, store, entry, report, size, refused)
        if count % _BATCH == 0:
            if not leading():
                report.seconds = time.monotonic() - started
                return report
            if count % 10_000 == 0:
                progress(f"{count} entry documents read, {report.restored} entries restored")
    for _, (namespace, alias, key) in decoded(store, docs.ALIASES, docs.alias_from, report.damaged):
        if index.add_alias(namespace, alias, key) is PutResult.CREATED:
            report.aliases += 1
    if leading():
        mark_complete(index, "reindex")
        report.complete = True
    report.seconds = time.monotonic() - started
    return report


def reconcile(index: Index, blobs: BlobStore, store: DocumentStore) -> ReindexReport:
    """Restore the documented rows a complete-looking index lacks: rows lost with the
    marker kept (an index restored from a backup, Redis restarted from a snapshot or
    failed over to a replica that lagged). Tokens, policies and pins first (few: each
    document read), then entries, which they decide on; for those it costs a listing
    of the documents' names and of the index's keys, and a read only for what is
    missing."""
    report = ReindexReport()
    restore_configuration(index, store, report)
    indexed = {docs.entry_name(e.namespace, e.key) for e in all_entries(index)}
    missing = [name for name in store.documents(docs.ENTRIES) if name not in indexed]
    refused = untrusted(index)
    for _, entry in decoded_names(store, missing, docs.entry_from, report.damaged):
        put_back(index, store, entry, report, blobs.size, refused)
    return report


class IndexRecovery:
    """What the evicting replica does for a lost index (eviction/maintenance.py):
    ``intact`` every tick (one index read), ``complete`` when it is not (the whole
    reindex), ``reconciled`` before every blob collection (``reconcile``). Over an
    index without documents (a test's blob store) all three are True at once."""

    def __init__(self, index: Index, blobs: BlobStore) -> None:
        self.index = index
        self.blobs = blobs
        self._warned = 0.0

    def _warn(self, why: str) -> None:
        if time.monotonic() - self._warned >= 3600 or not self._warned:
            self._warned = time.monotonic()
            log.warning("%s: blob collection waits for `neffcache admin reindex`", why)

    def intact(self) -> bool:
        if not isinstance(self.index, DurableIndex):
            return True
        return is_complete(self.index.inner)

    def complete(self, leading: Callable[[], bool]) -> bool:
        """True when the index holds every documented entry, after rebuilding it here
        if it was lost or wiped; False when that cannot be done now."""
        index = self.index
        if not isinstance(index, DurableIndex) or is_complete(index.inner):
            return True
        try:
            why = looks_lost(index.inner, index.store, self.blobs)
            if why is not None and why != EMPTY_BESIDE_BLOBS:
                log.warning("%s: reindexing from the documents", why)
                report = reindex(index.inner, self.blobs, index.store, leading=leading)
                log.warning("reindex: %s", report.as_json())
                return report.complete
            # No entry to restore, but the wipe took the tokens, policies and pins too
            # (every client refused): they come back before the marker says complete.
            report = ReindexReport()
            restore_configuration(index.inner, index.store, report)
        except StoreError as exc:
            log.warning("cannot reindex now (blob collection waits): %s", exc)
            return False
        if report.tokens or report.records:
            log.warning("restored the index's configuration: %s", report.as_json())
        if why is not None:
            # No entry documents yet beside the blobs: they may be on their way. An
            # admin who knows the blobs are orphans says so with `admin reindex`.
            self._warn(why)
            return False
        mark_complete(index.inner, "no entry documents")
        return True

    def reconciled(self, leading: Callable[[], bool]) -> bool:
        """Before a blob collection: True when the index is complete and holds every
        documented entry whose blobs are there, so a blob no index row names is one
        no document names either."""
        if not self.complete(leading):
            return False
        index = self.index
        if not isinstance(index, DurableIndex):
            return True
        try:
            report = reconcile(index.inner, self.blobs, index.store)
        except StoreError as exc:
            log.warning("cannot compare the index with its documents (collection waits): %s", exc)
            return False
        if report.restored or report.tokens or report.records:
            log.warning(
                "restored %d entries, %d tokens and %d policies and pins the index had lost: %s",
                report.restored,
                report.tokens,
                report.records,
                report.as_json(),
            )
        return True
