"""Start-up, the leader's reindex and fsck on a live cluster.

Each test's docstring says the failure it guards against and what prevents it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.recovery import publish, service_backends

from neffcache.server import cli
from neffcache.server.blobs import open_blob_store
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index import open_index
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.recovery import documents as docs
from neffcache.server.recovery.durable import DurableIndex
from neffcache.server.recovery.fsck import fsck
from neffcache.server.recovery.reindex import check_at_start
from neffcache.server.services import durable

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]


def create_local_token(data_dir: Path) -> None:
    """``neffcache admin token create --local``, as docs/operations.md says to run
    before the first ``serve`` on anything but loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
    argv = [*NEFFCACHE, "admin", "token", "create", "--local", "--data-dir", str(data_dir)]
    done = subprocess.run(
        [*argv, "--scope", "admin", "--namespace", "*", "--json"],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["token"]


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NEFFCACHE_"):
            monkeypatch.delenv(name)


@pytest.mark.e2e
def test_a_new_cache_set_up_as_documented_is_not_taken_for_a_lost_index(
    tmp_path: Path, plain_env: None, to_close: list[Any]
) -> None:
    """Was broken: the documented first steps (``token create --local``, then ``serve``)
    open the stores with ``at_start=False`` (recovery/commands.py), so the token's
    document is written to a store whose index was never marked. The first start
    then finds a document and no marker, logs that the index was lost, and pauses
    collection until the leader's reindex: every new install starts with a false
    alarm telling the operator to run ``reindex``.

    Fix: ``local_backends`` runs ``check_at_start`` before writing (it is a start of
    the stores like any other), or ``has_documents`` counts only entry documents, as
    docs/operations.md says ("a server that finds entry documents but no marker")."""
    data_dir = tmp_path / "data"
    create_local_token(data_dir)
    from neffcache.server.settings import load_settings

    settings = load_settings(data_dir=str(data_dir))
    blobs = open_blob_store(settings.blob_store_url())
    to_close.append(blobs)
    index = open_index(settings.index_store_url())
    to_close.append(index)
    assert check_at_start(index, blobs, blobs), "a brand-new cache is reported as a lost index"


@pytest.mark.e2e
def test_a_server_restarted_on_a_lost_sqlite_index_starts_on_its_documented_tokens(
    tmp_path: Path, plain_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was broken: ``neffcache serve`` on anything but loopback refuses to start while the
    index holds no token (protected mode), and a lost index (a deleted ``index.db``,
    Redis restarted empty) holds none until a reindex. But the reindex docs/operations.md
    promises ("the evicting replica's next pass runs the reindex itself") runs only in
    a server that has started: no replica can start, and the refusal tells the operator
    to create a new admin token rather than to reindex.

    Fix: at start-up, when the index holds no token but ``documents/tokens/`` does,
    restore the tokens (the first step of ``reindex``) before the protected-mode check;
    at least name ``neffcache admin reindex`` in the refusal."""
    data_dir = tmp_path / "data"
    create_local_token(data_dir)
    for name in ("index.db", "index.db-wal", "index.db-shm"):
        (data_dir / name).unlink(missing_ok=True)  # the index is lost

    served: list[Any] = []

    def run(app: Any, sock: Any, config: Any) -> int:
        served.append(app)
        sock.close()
        app.state.backends.index.close()
        app.state.backends.blobs.close()
        return 0

    monkeypatch.setattr("neffcache.server.serving.run", run)
    args = argparse.Namespace(host="0.0.0.0", port=0, data_dir=str(data_dir), config=None)
    cli.run_serve(args, [])  # raises "refusing to listen on 0.0.0.0 without tokens"
    assert served


class PublishDuringListing(MemoryBlobStore):
    """A store on which another replica publishes an entry while fsck lists the
    entry documents (a busy cluster: publishes never stop)."""

    def __init__(self) -> None:
        super().__init__()
        self.during: Any = None

    def documents(self, prefix: str) -> Iterator[str]:
        if prefix == docs.ENTRIES and self.during is not None:
            during, self.during = self.during, None
            during()
        return super().documents(prefix)


def test_fsck_of_a_healthy_busy_cluster_reports_no_problem(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: fsck reads the index, then the documents; an entry published in between
    (on a 100k-entry cache the gap is minutes) is reported as an "unindexed
    document", so fsck without --repair exits 4 ("problems left") on a healthy cluster
    that is publishing, and --repair exits 1: useless for the alerting the docs
    suggest (``--json``). An entry evicted in between is likewise "undocumented".

    Fix: re-check each finding before reporting it (``get_entry`` for an unindexed
    document, the row and the document again for an undocumented entry), as the
    dangling check already does with ``blobs.size``."""
    store = PublishDuringListing()
    to_close.append(store)
    index = MemoryIndex()
    replica = durable(index, store)
    publish(replica, store, "published before fsck")
    store.during = lambda: publish(replica, store, "published during fsck")
    report = fsck(service_backends(DurableIndex(index, store), store, tmp_path))
    assert report.problems == 0, f"a healthy cluster: {report.as_json()}"


def test_a_stray_file_among_the_documents_does_not_stop_reindex(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: ``FsBlobStore.documents`` lists every file under ``documents/``, valid
    name or not, and ``get_document`` raises ValueError (``check_name``) for one that
    is not, which ``decoded`` does not catch (it catches DocumentError only). One
    stray file (NFS's ``.nfsXXXX`` silly-rename of a document deleted while another
    replica read it, an rsync temporary left by an interrupted restore, an editor's
    backup) makes every reindex and fsck fail with a traceback; in the leader's tick
    it is logged as a bug each tick and collection stays paused for good. On S3 a
    console-made "folder" object (``documents/entries/``) does the same.

    Fix: ``documents()`` skips names that are not valid (the S3 listing too), or
    ``decoded`` reports them as damaged."""
    from neffcache.server.blobs.fs import FsBlobStore
    from neffcache.server.recovery.reindex import reindex

    store = FsBlobStore(tmp_path / "store")
    to_close.append(store)
    publish(durable(MemoryIndex(), store), store, "an entry")
    stray = tmp_path / "store" / "documents" / "entries" / "team-a" / ".nfs000000000123"
    stray.write_bytes(b"")
    report = reindex(MemoryIndex(), store, store)  # ValueError: not a document name
    assert report.restored == 1
