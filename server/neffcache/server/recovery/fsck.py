"""``fsck``: compare the index, the documents and the blobs; report, and repair.

What it looks for, and what ``repair`` does about each:

- **dangling entries**: index rows naming a blob that is absent or of another size
  (a blob lost at rest): removed, with their documents (an audit record each). The
  graph misses, and its next publish heals it.
- **corrupt blobs** (``verify`` only: every blob is read and hashed): quarantined;
  the entries naming them are then dangling, and removed.
- **orphaned blobs**: named by no entry and no document, older than
  ``blob_grace_seconds``: reported only. Blobs have one collector, the evicting
  replica (its lease, two sightings a grace apart, the downloads under way on each
  replica); fsck beside it could remove a blob a publish had just claimed.
- **undocumented entries**: index rows whose document is missing or differs
  (written before documents existed, or a document write that failed): written.
- **unindexed documents**: documents without their index row (the index lost rows;
  or an eviction whose document delete failed): restored when their blobs are all
  there, else removed.
- **damaged documents**: documents that do not read (``documents.DocumentError``):
  written again from the index when it holds the row, else removed.
- tokens, policies and pins whose documents are missing or differ: written (a
  revocation on either side stands); token, policy and pin documents without their
  row: restored, unless a tombstone says the row was removed and only the document
  delete failed (then the document goes).

Beside live replicas, every finding about an entry is checked once more before it is
reported (a publish or an eviction between the two listings is no problem), every
removal is conditional on what it found (``delete_entry`` by ``created_at``), and
restores never replace a row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import blake3

from neffcache.server.audit import record
from neffcache.server.blobs import BlobInfo
from neffcache.server.index import Entry
from neffcache.server.services import Services

from . import documents as docs
from .documented import TOMBSTONE, untrusted
from .durable import DurableIndex, finish_removal
from .reindex import ReindexReport, all_entries, decoded, restore_entry

ACTOR = "fsck"


@dataclass
class FsckReport:
    entries: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    documents: int = 0
    verified: int = 0  # blobs read and hashed
    dangling: list[str] = field(default_factory=list)  # "ns/key: digest, ..."
    corrupt: list[str] = field(default_factory=list)  # digests
    orphaned: list[str] = field(default_factory=list)  # digests
    orphaned_bytes: int = 0
    undocumented: list[str] = field(default_factory=list)  # "ns/key"
    unindexed: list[str] = field(default_factory=list)  # "ns/key"
    damaged: list[str] = field(default_factory=list)  # document names
    configuration: list[str] = field(default_factory=list)  # token and record documents
    repaired: dict[str, int] = field(default_factory=dict)  # action -> count
    left: int = 0  # problems --repair could not fix (orphans are not counted)
    seconds: float = 0.0

    @property
    def problems(self) -> int:
        """Findings that are damage; orphaned blobs are not: they await the collector."""
        return sum(
            len(found)
            for found in (
                self.dangling,
                self.corrupt,
                self.undocumented,
                self.unindexed,
                self.damaged,
                self.configuration,
            )
        )

    def as_json(self) -> dict[str, Any]:
        value = dict(self.__dict__)
        value["problems"] = self.problems
        value["seconds"] = round(self.seconds, 3)
        return value


def fsck(
    backends: Services,
    *,
    repair: bool = False,
    verify: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> FsckReport:
    """Check (and with ``repair``, fix) the stores of ``backends``, whose index must
    be a ``DurableIndex`` (``services.durable``)."""
    index = backends.index
    if not isinstance(index, DurableIndex):
        raise TypeError("fsck needs the index wrapped with its documents (DurableIndex)")
    started = time.monotonic()
    report = FsckReport()
    now = time.time()
    grace = backends.settings.blob_grace_seconds
    # Blobs listed first (as a collection does): one stored after the listing is not
    # judged, and one an entry published meanwhile names is seen as referenced.
    listed = {blob.digest: blob for blob in backends.blobs.blobs()}
    report.blobs = len(listed)
    report.blob_bytes = sum(blob.size for blob in listed.values())
    progress(f"{report.blobs} blobs listed")
    if verify:
        for blob in listed.values():
            if not _intact(backends, blob):
                report.corrupt.append(blob.digest)
            report.verified += 1
        progress(f"{report.verified} blobs verified, {len(report.corrupt)} corrupt")
    corrupt = set(report.corrupt)

    referenced: set[str] = set()
    indexed: dict[str, Entry] = {}
    for entry in all_entries(index.inner):
        indexed[docs.entry_name(entry.namespace, entry.key)] = entry
        sizes = docs.manifest_files(entry.manifest)
        referenced.update(sizes)
        gone = [
            d
            for d, size in sizes.items()
            if d in corrupt
            or (d in listed and listed[d].size != size)
            or (d not in listed and backends.blobs.size(d) != size)
        ]
        if gone:
            report.dangling.append(f"{entry.namespace}/{entry.key}: {', '.join(sorted(gone))}")
    report.entries = len(indexed)
    progress(f"{report.entries} entries read")

    documented: dict[str, Entry] = {}
    for name, entry in decoded(index.store, docs.ENTRIES, docs.entry_from, report.damaged):
        documented[name] = entry
    report.documents = len(documented) + len(report.damaged)
    for name, entry in indexed.items():
        if name not in report.damaged and documented.get(name) != entry:
            # Checked again: evicted, or published, between the two listings.
            held = index.inner.get_entry(entry.namespace, entry.key)
            data = index.store.get_document(name)
            if held is not None and (data is None or data != docs.entry_document(held)):
                report.undocumented.append(f"{entry.namespace}/{entry.key}")
    for name, entry in documented.items():
        if name not in indexed:
            referenced.update(docs.manifest_files(entry.manifest))  # a reindex needs them
            if index.inner.get_entry(entry.namespace, entry.key) is None:
                report.unindexed.append(f"{entry.namespace}/{entry.key}")
    progress(f"{report.documents} entry documents read")

    for blob in listed.values():
        if blob.digest not in referenced and now - blob.modified >= grace:
            report.orphaned.append(blob.digest)
            report.orphaned_bytes += blob.size
    report.configuration = _configuration(index)

    if repair:
        _repair(backends, index, report, indexed, documented)
    report.seconds = time.monotonic() - started
    return report


def _intact(backends: Services, blob: BlobInfo) -> bool:
    chunks = backends.blobs.read(blob.digest)
    if chunks is None:
        return True  # removed since the listing: nothing to judge
    hasher = blake3.blake3()
    for chunk in chunks:
        hasher.update(chunk)
    return bool(hasher.hexdigest() == blob.digest)


def _configuration(index: DurableIndex) -> list[str]:
    """Token, policy and pin documents that are missing, differ from the index, or
    have no row."""
    stale = []
    tokens = {docs.token_name(token.token_id): token for token in index.inner.tokens()}
    for name, token in tokens.items():
        if index.store.get_document(name) != docs.token_document(token):
            stale.append(name)
    held = {
        docs.record_name(row.kind, row.namespace, row.name): row
        for kind in sorted(docs.DURABLE_KINDS)
        for row in index.inner.records(kind)
    }
    for name, row in held.items():
        if index.store.get_document(name) != docs.record_document(row):
            stale.append(name)
    for prefix, rows in ((docs.TOKENS, tokens), (docs.RECORDS, held)):
        stale.extend(name for name in index.store.documents(prefix) if name not in rows)
    return stale


def _repair(
    backends: Services,
    index: DurableIndex,
    report: FsckReport,
    indexed: dict[str, Entry],
    documented: dict[str, Entry],
) -> None:
    done = report.repaired

    def count(action: str, ok: bool = True) -> None:
        if ok:
            done[action] = done.get(action, 0) + 1
        else:
            report.left += 1

    for digest in report.corrupt:
        backends.blobs.quarantine(digest)
        count("quarantined")
    audit = []
    for line in report.dangling:
        where, _, gone = line.partition(": ")
        entry = indexed[docs.entry_name(*where.split("/", 1))]
        # Through the durable index: the document goes with the row.
        removed = index.delete_entry(entry.namespace, entry.key, entry.created_at)
        count("removed", removed)
        if removed:
            audit.append(
                record(ACTOR, "fsck.remove", entry.namespace, entry.key, missing=gone.split(", "))
            )
    backends.audit.write(audit)
    dangling = {line.partition(": ")[0] for line in report.dangling}
    for where in report.undocumented:
        if where not in dangling:
            index.sync_entry(*where.split("/", 1))
            count("documented")
    refused = untrusted(index.inner)
    for where in report.unindexed:
        name = docs.entry_name(*where.split("/", 1))
        if finish_removal(index.inner, index.store, documented[name]):
            count("removal_finished")
            continue
        restored = ReindexReport()
        restore_entry(index.inner, documented[name], restored, backends.blobs.size, refused)
        if restored.missing_blobs or restored.untrusted:
            index.sync_entry(*where.split("/", 1))  # no row: the document goes
            count("unrestorable_removed")
        elif restored.restored:
            count("restored")
        elif not restored.present:
            count("restored", False)  # a conflict, or damaged: left for a person
    for name in report.damaged:
        namespace, _, key = name.removeprefix(docs.ENTRIES).partition("/")
        if docs.entry_name(namespace, key) == name:
            index.sync_entry(namespace, key)  # rewritten from the row, or removed
        else:
            index.store.delete_document(name)
        count("damaged_fixed")
    records = {
        docs.record_name(r.kind, r.namespace, r.name): r
        for kind in docs.DURABLE_KINDS
        for r in index.inner.records(kind)
    }
    for name in report.configuration:
        if name.startswith(docs.TOKENS):
            token_id = name.removeprefix(docs.TOKENS)
            if not any(t.token_id == token_id for t in index.inner.tokens()):
                data = index.store.get_document(name)
                try:
                    index.inner.put_token(docs.token_from(data or b""))
                except docs.DocumentError:
                    index.store.delete_document(name)
            index.sync_token(token_id)
        elif name in records:
            held = records[name]
            index.sync_record(held.kind, held.namespace, held.name)
        elif index.inner.get_record(TOMBSTONE, "", name) is not None:
            index.store.delete_document(name)  # a removed policy or pin
            index.inner.delete_record(TOMBSTONE, "", name)
        else:
            _restore_record(index, name)  # a row the index lost
        count("configuration")


def _restore_record(index: DurableIndex, name: str) -> None:
    """Put back the policy or pin a document holds, whose row the index lost; a
    document that does not read is removed."""
    try:
        held = docs.record_from(index.store.get_document(name) or b"")
    except docs.DocumentError:
        index.store.delete_document(name)
        return
    index.inner.put_record(held, create_only=True)
