"""Blob collection never deletes a blob an acknowledged entry needs.

Each test's docstring says the failure it guards against and what prevents it."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from support.recovery import BOOT, NS, commit, digests, publish, service_backends

from neffcache.server.app import create_app
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.index.sqlite import SqliteIndex
from neffcache.server.recovery.durable import DurableIndex, is_complete
from neffcache.server.recovery.fsck import fsck
from neffcache.server.recovery.reindex import reindex
from neffcache.server.services import durable
from neffcache.server.settings import ServerSettings


def test_an_index_restored_from_its_backup_keeps_the_blobs_of_later_entries(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: the marker is a row of the index, so every partial loss of the index
    keeps it: a SQLite index restored from ``sqlite3 index.db .backup`` (what
    docs/operations.md tells operators to take), a Redis restarted from an RDB
    snapshot or an ``appendfsync everysec`` AOF (both listed there as choices), a
    failover to a lagging Redis replica. The entries acknowledged after the snapshot
    have documents but no rows; the index still says "complete"; the collector
    (``Evictor._referenced`` reads only index rows) removes their blobs, and a
    later reindex can only report them as ``missing_blobs`` (fsck --repair then
    deletes their documents): acknowledged entries lost for good.

    Fix: make collection honour documents, not a marker: before a collection,
    list ``documents/entries/`` (names only: one LIST per 1000 entries on S3) and
    compare with the index rows; restore (or at least count as referenced) every
    documented entry the index lacks. The marker can then go."""
    blobs = FsBlobStore(tmp_path / "store")
    to_close.append(blobs)
    db = tmp_path / "index.db"
    index = SqliteIndex(db)
    wrapped = durable(index, blobs)  # start-up: a new cache, marked complete
    publish(wrapped, blobs, "published before the backup")
    backup = tmp_path / "index.db.bak"
    source, target = sqlite3.connect(db), sqlite3.connect(backup)
    source.backup(target)
    source.close()
    target.close()
    later = publish(wrapped, blobs, "acknowledged after the backup")
    index.close()

    # The disk holding index.db is lost; the backup is put back; the server starts.
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, db)
    restored = SqliteIndex(db)
    to_close.append(restored)
    server = service_backends(durable(restored, blobs), blobs, tmp_path)
    assert is_complete(restored)  # the marker came back with the backup
    server.maintenance.run("evictor")

    kept = {d: blobs.size(d) is not None for d in sorted(digests(later))}
    assert all(kept.values()), f"blobs of an acknowledged entry were collected: {kept}"


def test_start_up_does_not_mark_an_empty_index_complete_beside_a_store_full_of_blobs(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: ``check_at_start`` marks an index complete whenever the store holds no
    document, even when the index is EMPTY and the store is full of blobs. That is
    never the upgrade case the rule exists for (an upgraded index holds entries); it
    is a blob store being restored (``aws s3 sync`` copies ``blobs/`` before
    ``documents/``: docs/operations.md says "put the blob store back, start the
    servers on an empty index"), or a replica started with a wrong prefix against
    the shared index. The marker is global: the evicting replica then collects every
    blob as unreferenced, and the reindex that follows finds them all missing.

    Fix: at start-up mark only when there are no documents AND (the index holds
    entries, or the store holds no blobs); otherwise leave it to ``reindex``/``fsck
    --repair``. Better still, the document-listing check of the previous test."""
    original = MemoryBlobStore()
    to_close.append(original)
    entries = [publish(durable(MemoryIndex(), original), original, f"e{n}") for n in range(3)]

    restoring = MemoryBlobStore()
    to_close.append(restoring)
    for digest in sorted({d for e in entries for d in digests(e)}):
        chunks = original.read(digest)
        assert chunks is not None
        commit(restoring, b"".join(chunks))
    index = MemoryIndex()
    server_index = durable(index, restoring)  # a server starts mid-restore
    for name in original.documents(""):  # the copy reaches documents/
        data = original.get_document(name)
        assert data is not None
        restoring.put_document(name, data)
    server = service_backends(server_index, restoring, tmp_path)
    server.maintenance.run("evictor")
    report = reindex(index, restoring, restoring)

    assert report.missing_blobs == [], f"restored blobs were collected: {report.missing_blobs}"


def test_fsck_repair_beside_the_evicting_replica_never_leaves_an_entry_without_its_blob(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: ``fsck --repair`` collects orphans itself (``Evictor.remove_blobs`` with
    ``leading=lambda: True``), beside the replica that holds the evictor lease, which
    docs/operations.md says is safe. Both use the same condemned mark per digest, so
    fsck's step 3 clears the mark the leader's collection relies on. Here the leader
    has marked blob X and read the references (X unreferenced); fsck marks X, removes
    it and clears the mark; a client uploads X again and publishes an entry naming it
    (no mark: the publish is acknowledged); the leader then removes X on its stale
    reading. An acknowledged entry names a blob that is gone.

    Fix: fsck must not run a second collector: report orphans and leave their
    removal to the evictor, or take the evictor lease (``Maintenance.lead``) for the
    removal and refuse when another replica holds it. (fsck's own criterion is also
    weaker than a collection's: ``modified`` older than the grace, with no second
    sighting and no ``BlobUse``.)"""
    blobs, index = MemoryBlobStore(), MemoryIndex()
    to_close.append(blobs)
    settings = ServerSettings(
        data_dir=tmp_path,
        bootstrap_admin_token=BOOT,
        blob_grace_seconds=0,
        eviction_interval_seconds=0,
    )
    app = create_app(settings, blob_store=blobs, index=index)
    data = b"a NEFF whose first entry was evicted" * 100
    digest = commit(blobs, data)  # an orphan: its entry was evicted
    leader = service_backends(DurableIndex(index, blobs), blobs, tmp_path)
    admin_host = service_backends(DurableIndex(index, blobs), blobs, tmp_path)
    key = "ab" * 32
    manifest = {"key": key, "files": {"model.neff": {"digest": digest, "size": len(data)}}}
    answers: list[int] = []

    with TestClient(app) as http:
        http.headers["Authorization"] = f"Bearer {BOOT}"

        def meanwhile() -> bool:
            """Between the leader's reading of references and its removal."""
            if not answers:
                fsck(admin_host, repair=True)
                answers.append(http.put(f"/v1/blobs/{digest}", content=data).status_code)
                answers.append(http.put(f"/v1/ns/{NS}/entries/{key}", json=manifest).status_code)
            return True

        leader.evictor.collect_blobs(meanwhile)
        # fsck left the orphan to the leader, whose mark stands: the publish waits for
        # its decision (then 503, publish again) rather than being acknowledged over a
        # blob about to go.
        assert answers[0] == 200
        if answers[1] in (200, 201):
            assert blobs.size(digest) == len(data), "an acknowledged entry's blob was removed"
        else:
            assert answers[1] == 503
