"""The DocumentStore contract (blobs/documents.py), one suite run against every blob
store (memory, fs, S3 on a moto server); then what only the filesystem promises; then
the formats of recovery/documents.py.

Nothing lost, throughout: a document reads back byte for byte as last written, from a
new handle too; a create-only write never replaces a document (of several writers of
a new name, one wins whole); it is never mistaken for a blob nor a blob for it; a
name the rules refuse touches nothing; a stray file among the documents (an NFS
``.nfs*`` file, an S3 console "folder") is never listed, so a reindex does not break
on it; a crash mid-write leaves the old document whole and its temp file is cleaned
up; and a document damaged at rest (or not ours) reads as DocumentError, never as a
different row."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import blake3
import pytest
from support.backends import BLOB_STORES, backends

from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.documents import DocumentStore, check_name
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.blobs.s3 import S3BlobStore
from neffcache.server.index import Entry, PutResult, Record, Token
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.manifest import canonical_json
from neffcache.server.recovery import documents as docs
from neffcache.server.recovery.durable import DurableIndex, is_complete, mark_complete
from neffcache.server.recovery.reindex import reconcile, reindex

MiB = 1 << 20
KEY = "ab" * 32
DIGEST = "cd" * 32


@dataclass
class Backend:
    """A blob store under test; ``reopen`` gives a new handle on the same storage (for
    memory, the same object: there is nothing else to reopen). ``stray`` puts a file
    at ``documents/<name>`` behind the store's back, whatever the name (a name ending
    in ``/``: a directory, or an S3 "folder" object); None for memory, which holds
    nothing it was not given through its methods."""

    name: str
    store: BlobStore
    reopen: Callable[[], BlobStore]
    stray: Callable[[str], None] | None = None


def fs_stray(root: Path) -> Callable[[str], None]:
    def put(name: str) -> None:
        path = root / "documents" / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"not a document")

    return put


def s3_stray(url: str) -> Callable[[str], None]:
    import boto3  # type: ignore[import-untyped]  # here: only S3 tests need it

    parts = urlsplit(url)

    def put(name: str) -> None:
        # The endpoint comes from AWS_ENDPOINT_URL_S3, set by the s3_bucket fixture.
        client = boto3.session.Session().client("s3")
        try:
            key = f"{parts.path.strip('/')}/documents/{name}"
            client.put_object(
                Bucket=parts.netloc, Key=key, Body=b"" if name.endswith("/") else b"x"
            )
        finally:
            client.close()

    return put


@pytest.fixture(params=backends(*BLOB_STORES))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    opened: list[BlobStore] = []

    def track(store: BlobStore) -> BlobStore:
        opened.append(store)
        return store

    if request.param == "memory":
        memory = MemoryBlobStore()
        found = Backend("memory", track(memory), lambda: memory)
    elif request.param == "filesystem":
        root = tmp_path / "store"
        found = Backend(
            "fs", track(FsBlobStore(root)), lambda: track(FsBlobStore(root)), fs_stray(root)
        )
    else:
        url: str = request.getfixturevalue("s3_bucket")
        found = Backend(
            "s3",
            track(S3BlobStore.from_url(url)),
            lambda: track(S3BlobStore.from_url(url)),
            s3_stray(url),
        )
    yield found
    for store in opened:
        store.close()


@pytest.fixture
def store(backend: Backend) -> BlobStore:
    return backend.store


def as_documents(store: BlobStore) -> DocumentStore:
    assert isinstance(store, DocumentStore)
    return store


def put_blob(store: BlobStore, data: bytes) -> str:
    staged = store.staging_dir() / f"upload-{uuid.uuid4().hex}"
    staged.write_bytes(data)
    digest = blake3.blake3(data).hexdigest()
    assert store.commit(staged, digest) is True
    return digest


def listed(store: BlobStore, prefix: str) -> list[str]:
    return sorted(as_documents(store).documents(prefix))


# --- the contract ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [bytes(range(256)) * 3, b"", random.Random(1).randbytes(MiB)],
    ids=["binary", "empty", "1MiB"],
)
def test_put_then_get_round_trips_the_bytes(store: BlobStore, data: bytes) -> None:
    """Nothing lost: every byte written (binary, none, a mebibyte) reads back as is."""
    documents = as_documents(store)
    documents.put_document("entries/team-a/doc", data)
    assert documents.get_document("entries/team-a/doc") == data
    assert listed(store, "") == ["entries/team-a/doc"]


def test_put_replaces_the_document(store: BlobStore) -> None:
    """Nothing lost: the last write wins whole; the first one's bytes are gone. A
    plain write says it stored, new name or not."""
    documents = as_documents(store)
    assert documents.put_document("tokens/t1", b"first, and longer than the second") is True
    assert documents.put_document("tokens/t1", b"second") is True
    assert documents.get_document("tokens/t1") == b"second"
    assert listed(store, "") == ["tokens/t1"]


# --- create-only writes


def test_create_only_stores_a_new_document(store: BlobStore) -> None:
    """Nothing lost: a create-only write of a name nobody holds stores it (True), read
    back byte for byte and listed like any other, under a new directory or beside a
    document already there."""
    documents = as_documents(store)
    assert documents.put_document("entries/team-a/k1", b"first", create_only=True) is True
    assert documents.put_document("entries/team-a/k2", b"", create_only=True) is True
    assert documents.get_document("entries/team-a/k1") == b"first"
    assert documents.get_document("entries/team-a/k2") == b""
    assert listed(store, "") == ["entries/team-a/k1", "entries/team-a/k2"]


def test_create_only_keeps_an_existing_document(store: BlobStore) -> None:
    """Nothing lost: a create-only write of a name already held stores nothing (False)
    and leaves the document there byte for byte (an acknowledged entry is never
    replaced by a later publish); a plain write still replaces it."""
    documents = as_documents(store)
    name = "entries/team-a/k"
    assert documents.put_document(name, b"acknowledged, and longer", create_only=True) is True
    assert documents.put_document(name, b"a later writer", create_only=True) is False
    assert documents.get_document(name) == b"acknowledged, and longer"
    assert documents.put_document(name, b"", create_only=True) is False
    assert documents.get_document(name) == b"acknowledged, and longer"
    assert listed(store, "") == [name]

    assert documents.put_document(name, b"replaced") is True
    assert documents.put_document(name, b"kept?", create_only=True) is False
    assert documents.get_document(name) == b"replaced"


def test_create_only_after_a_delete_stores_again(store: BlobStore) -> None:
    """Nothing lost: once a document is deleted its name is free: a create-only write
    of it stores the new bytes."""
    documents = as_documents(store)
    name = "entries/team-a/k"
    documents.put_document(name, b"old")
    assert documents.delete_document(name) is True
    assert documents.put_document(name, b"new", create_only=True) is True
    assert documents.get_document(name) == b"new"


def test_one_of_several_concurrent_create_only_writers_wins(store: BlobStore) -> None:
    """Nothing lost: writers racing to create one name (two replicas publishing the
    same key): exactly one is told it stored, and the document is that writer's bytes,
    whole."""
    documents = as_documents(store)
    name = "entries/team-a/raced"
    writers = 8
    start = threading.Barrier(writers)
    results: dict[int, bool] = {}
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            start.wait()
            results[n] = documents.put_document(
                name, f"writer {n} ".encode() * 100, create_only=True
            )
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    winners = [n for n, stored in results.items() if stored]
    assert len(results) == writers
    assert len(winners) == 1
    assert documents.get_document(name) == f"writer {winners[0]} ".encode() * 100
    assert listed(store, "") == [name]


def test_get_of_an_absent_document_is_none(store: BlobStore) -> None:
    """Nothing lost: a miss is None (never an error, never another document's bytes),
    under a missing directory, under an existing one, and where a document is a
    directory's name."""
    documents = as_documents(store)
    documents.put_document("entries/team-a/present", b"x")
    assert documents.get_document("entries/team-a/absent") is None
    assert documents.get_document("entries/team-b/absent") is None
    assert documents.get_document("entries/team-a") is None  # a "directory"
    assert documents.get_document("entries/team-a/present/below") is None  # under a document
    assert documents.get_document("entries/team-a/present") == b"x"


def test_delete_says_whether_there_was_a_document(store: BlobStore) -> None:
    """Nothing lost: a delete removes only the named document, and says so."""
    documents = as_documents(store)
    documents.put_document("aliases/team-a/one", b"1")
    documents.put_document("aliases/team-a/two", b"2")
    assert documents.delete_document("aliases/team-a/one") is True
    assert documents.get_document("aliases/team-a/one") is None
    assert documents.delete_document("aliases/team-a/one") is False
    assert documents.delete_document("aliases/team-b/never") is False
    assert documents.delete_document("aliases/team-a") is False  # a "directory"
    assert documents.get_document("aliases/team-a/two") == b"2"
    assert listed(store, "") == ["aliases/team-a/two"]


def test_listing_by_prefix_lists_that_prefix_only(store: BlobStore) -> None:
    """Nothing lost: every document shows in the listing of each prefix it is under,
    and in no other."""
    documents = as_documents(store)
    names = [
        "entries/team-a/k1",
        "entries/team-a/k2",
        "entries/team-b/k1",
        "aliases/team-a/h1",
        "tokens/t1",
        "records/pin/h2",
        "records/policy/h3",
        "top",
    ]
    for name in names:
        documents.put_document(name, name.encode())
    assert listed(store, "") == sorted(names)
    assert listed(store, "entries/") == [
        "entries/team-a/k1",
        "entries/team-a/k2",
        "entries/team-b/k1",
    ]
    assert listed(store, "entries/team-a/") == ["entries/team-a/k1", "entries/team-a/k2"]
    assert listed(store, "records/") == ["records/pin/h2", "records/policy/h3"]
    assert listed(store, "tokens/") == ["tokens/t1"]
    assert listed(store, "absent/") == []
    assert listed(store, "entries/team-c/") == []


def test_a_name_that_prefixes_another_segment_is_not_confused_with_it(store: BlobStore) -> None:
    """Nothing lost: ``entries/ab`` and ``entries/abc/x`` are two documents; a listing
    of ``entries/abc/`` holds only the second, and deleting the first keeps the second."""
    documents = as_documents(store)
    documents.put_document("entries/ab", b"short")
    documents.put_document("entries/abc/x", b"long")
    assert listed(store, "entries/") == ["entries/ab", "entries/abc/x"]
    assert listed(store, "entries/abc/") == ["entries/abc/x"]
    assert documents.get_document("entries/ab") == b"short"
    assert documents.get_document("entries/abc/x") == b"long"
    assert documents.delete_document("entries/ab") is True
    assert documents.get_document("entries/abc/x") == b"long"
    assert listed(store, "") == ["entries/abc/x"]


def test_a_listing_under_a_document_name_is_empty(backend: Backend) -> None:
    """Nothing lost: listing ``entries/ab/`` where ``entries/ab`` is a document finds
    nothing (and fails nothing: a listing must not break on a name)."""
    store = backend.store
    documents = as_documents(store)
    documents.put_document("entries/ab", b"short")
    documents.put_document("entries/abc/x", b"long")
    assert listed(store, "entries/ab/") == []


def test_listing_is_lazy_and_survives_changes_under_it(store: BlobStore) -> None:
    """Nothing lost: the listing is an iterator, read as it goes; documents deleted or
    stored meanwhile break nothing, and every document there throughout is listed
    exactly once."""
    documents = as_documents(store)
    names = [f"entries/team-a/k{n:02d}" for n in range(12)]
    for name in names:
        documents.put_document(name, b"x")
    listing = documents.documents("entries/")
    assert iter(listing) is listing  # an iterator, not a list built up front
    first = next(listing)
    doomed = [n for n in names if n != first][:4]
    for name in doomed:
        documents.delete_document(name)
    documents.put_document("entries/team-a/new", b"y")
    rest = list(listing)
    seen = [first, *rest]
    assert len(seen) == len(set(seen))  # none twice
    kept = set(names) - set(doomed)
    assert kept <= set(seen)  # every one there throughout
    assert set(seen) <= set(names) | {"entries/team-a/new"}


BAD_NAMES = [
    "",
    "a//b",
    "/a",
    "/etc/passwd",
    "a/",
    "..",
    "../escape",
    "a/../b",
    ".",
    "a/./b",
    ".hidden",
    "a b",
    "a/b c",
    "é",
    "entries/é",
    "a\x00b",
    "a\nb",
    "a\\b",
    "x" * 201,
]


def refused(call: Callable[..., object], *args: object) -> bool:
    """Whether ``call(*args)`` raises ValueError (its result, if any, read whole)."""
    try:
        result = call(*args)
        if isinstance(result, Iterator):
            list(result)
    except ValueError:
        return True
    return False


def test_a_bad_name_raises_value_error_and_touches_nothing(
    backend: Backend, tmp_path: Path
) -> None:
    """Nothing lost: a name outside the rules is refused by every call, before any
    storage is touched (the canary stays as it was, and nothing appears anywhere)."""
    documents = as_documents(backend.store)
    documents.put_document("entries/canary", b"canary")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    calls: dict[str, Callable[[str], object]] = {
        "put": lambda name: documents.put_document(name, b"payload"),
        "create": lambda name: documents.put_document(name, b"payload", create_only=True),
        "get": documents.get_document,
        "delete": documents.delete_document,
    }
    accepted = [
        (what, name)
        for name in BAD_NAMES
        for what, call in calls.items()
        if not refused(call, name)
    ]
    assert accepted == []
    assert listed(backend.store, "") == ["entries/canary"]
    assert documents.get_document("entries/canary") == b"canary"
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


BAD_PREFIXES = [
    "entries",
    "/",
    "/entries/",
    "entries//",
    "entries/ab",
    "../",
    "./",
    "entries/../",
    "a b/",
    "é/",
    "//",
]


def test_a_bad_prefix_raises_value_error(store: BlobStore) -> None:
    """Nothing lost: a listing prefix outside the rules is refused, never read as some
    other place (nor a partial segment)."""
    documents = as_documents(store)
    documents.put_document("entries/abc", b"x")
    accepted = [p for p in BAD_PREFIXES if not refused(documents.documents, p)]
    assert accepted == []
    assert listed(store, "") == ["entries/abc"]


# Files a listing of documents/ can meet that no store method wrote: none is a name
# of ours (blobs/documents.py ``is_name``), so none may be listed.
STRAYS = [
    "entries/.nfs000000000001",  # NFS: a document removed while another host read it
    "entries/team-a/.k.Xy12ab",  # an rsync temporary
    "entries/team a/x",  # a space, in a directory's name
    "entries/team-a/k b",  # a space, in a file's name
    "entries/team-a/k~",  # an editor's backup
    "entries/team-a/é",  # not ASCII
    ".DS_Store",
    "entries/",  # S3: a console "folder"; fs: a directory already there
    "entries/team-a/",
    "entries/empty/",  # fs: an empty directory of a valid name
]


def test_a_listing_skips_files_that_are_not_documents(backend: Backend) -> None:
    """Nothing lost: a stray file under documents/ (an NFS ``.nfs*`` file, an rsync
    temporary, a name with a space, an S3 console "folder" object) is not listed, by
    any prefix or from a new handle, while every document beside it is; the
    documents still read."""
    if backend.stray is None:
        pytest.skip("a memory store holds only what its methods were given")
    documents = as_documents(backend.store)
    documents.put_document("entries/team-a/k", b"kept")
    documents.put_document("tokens/t1", b"token")
    for name in STRAYS:
        backend.stray(name)
    assert listed(backend.store, "") == ["entries/team-a/k", "tokens/t1"]
    assert listed(backend.store, "entries/") == ["entries/team-a/k"]
    assert listed(backend.store, "entries/team-a/") == ["entries/team-a/k"]
    assert listed(backend.store, "entries/empty/") == []
    assert documents.get_document("entries/team-a/k") == b"kept"
    assert sorted(as_documents(backend.reopen()).documents("")) == ["entries/team-a/k", "tokens/t1"]


def publish(index: DurableIndex, store: BlobStore, n: int) -> Entry:
    """An entry as the API publishes it: its blob committed, then its row and document."""
    key = blake3.blake3(f"key {n}".encode()).hexdigest()
    data = f"model.neff {n}".encode() * 10
    files = {"model.neff": {"digest": put_blob(store, data), "size": len(data)}}
    stored = Entry("team-a", key, canonical_json({"files": files, "key": key}), 1.0 + n, "tok1")
    assert index.put_entry(stored, ()) is PutResult.CREATED
    return stored


def test_a_stray_file_breaks_neither_reindex_nor_reconcile(backend: Backend) -> None:
    """Nothing lost: with stray files among the entry documents, a lost row is still
    restored before a collection (``reconcile``), and a lost index is still rebuilt
    whole and marked complete (``reindex``): the strays are not documents, so they
    are neither read nor reported as damaged."""
    if backend.stray is None:
        pytest.skip("a memory store holds only what its methods were given")
    store = backend.store
    documents = as_documents(store)
    index = MemoryIndex()
    mark_complete(index, "test")
    entries = [publish(DurableIndex(index, documents), store, n) for n in range(3)]
    for name in STRAYS:
        backend.stray(name)

    lost = entries[1]
    assert index.delete_entry(lost.namespace, lost.key, lost.created_at) is True
    partial = reconcile(index, store, documents)
    assert (partial.restored, partial.damaged, partial.missing_blobs) == (1, [], [])
    assert index.get_entry(lost.namespace, lost.key) == lost

    fresh = MemoryIndex()
    whole = reindex(fresh, store, documents, progress=lambda line: None)
    assert (whole.complete, whole.restored, whole.damaged, whole.missing_blobs) == (True, 3, [], [])
    assert is_complete(fresh) is True
    assert [fresh.get_entry(e.namespace, e.key) for e in entries] == entries


def test_documents_and_blobs_never_list_as_each_other(store: BlobStore) -> None:
    """Nothing lost: a document is never collected as an unreferenced blob (nor counted
    as one), and a blob never reads as a document, even one named like a blob."""
    documents = as_documents(store)
    digest = put_blob(store, b"blob bytes")
    lookalikes = [digest, f"blobs/{digest[:2]}/{digest}", f"{digest[:2]}/{digest}"]
    for name in lookalikes:
        documents.put_document(name, b"document bytes")
    documents.put_document("entries/team-a/k", b"doc")
    assert [blob.digest for blob in store.blobs()] == [digest]
    assert store.size(digest) == len(b"blob bytes")
    assert listed(store, "") == sorted([*lookalikes, "entries/team-a/k"])
    assert documents.get_document(digest) == b"document bytes"
    assert documents.delete_document(digest) is True
    assert store.size(digest) == len(b"blob bytes")  # the blob stays
    assert store.delete(digest) is True
    assert listed(store, "") == sorted([*lookalikes[1:], "entries/team-a/k"])


def test_a_document_survives_reopening_the_store(backend: Backend) -> None:
    """Nothing lost: a document written is there for the next process (a new handle
    on the same storage), bytes and listing alike."""
    if backend.name == "memory":
        pytest.skip("a memory store has no storage beyond the object")
    as_documents(backend.store).put_document("entries/team-a/k", b"kept")
    backend.store.close()
    reopened = as_documents(backend.reopen())
    assert reopened.get_document("entries/team-a/k") == b"kept"
    assert sorted(reopened.documents("")) == ["entries/team-a/k"]


# --- the filesystem -------------------------------------------------------------------


def staging_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "staging").rglob("*") if p.is_file() and p.name != "lock")


def test_fs_document_write_leaves_nothing_in_staging(tmp_path: Path) -> None:
    """Nothing lost: a document write stages its bytes and moves them into place, so
    the staging area holds nothing afterwards (no leak per write, create-only ones
    included, stored or not) and the bytes are under documents/."""
    store = FsBlobStore(tmp_path / "store")
    try:
        for n in range(3):
            store.put_document(f"entries/team-a/k{n}", b"x" * n)
        store.put_document("entries/team-a/k0", b"replaced")
        assert store.put_document("entries/team-a/k1", b"kept out", create_only=True) is False
        assert store.put_document("entries/team-b/new", b"created", create_only=True) is True
        assert staging_files(tmp_path / "store") == []
        documents = tmp_path / "store/documents/entries"
        assert (documents / "team-a/k0").read_bytes() == b"replaced"
        assert (documents / "team-a/k1").read_bytes() == b"x"
        assert (documents / "team-b/new").read_bytes() == b"created"
    finally:
        store.close()


_CRASH = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from neffcache.server.blobs import fs
    store = fs.FsBlobStore(Path(sys.argv[1]))
    create_only = sys.argv[2] == "create-only"
    # Killed between the staged write and its move into place: a rename, or for a
    # create-only write a link.
    if create_only:
        fs.os.link = lambda *args: os._exit(9)
    else:
        fs.os.replace = lambda *args: os._exit(9)
    store.put_document("entries/team-a/k", b"new bytes", create_only=create_only)
    """
)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("mode", "old"),
    [("replace", b"old bytes"), ("create-only", b"old bytes"), ("create-only", None)],
    ids=["replace", "create-only", "create-only-new-name"],
)
def test_fs_crash_mid_write_keeps_the_old_document_and_cleans_its_temp(
    tmp_path: Path, mode: str, old: bytes | None
) -> None:
    """Nothing lost: a process killed in the middle of a document write (a plain or a
    create-only one) leaves the old document whole, or for a new name no document at
    all (never a partial one); its staged temp file is removed when the store is next
    opened, while a live process's staging area is left alone."""
    root = tmp_path / "store"
    alive = FsBlobStore(root)
    try:
        if old is not None:
            alive.put_document("entries/team-a/k", old)
        live_upload = alive.staging_dir() / "upload-in-flight"
        live_upload.write_bytes(b"a live upload")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(["keying", "client", "server"])}
        crashed = subprocess.run(
            [sys.executable, "-c", _CRASH, str(root), mode],
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            timeout=120,
        )
        assert crashed.returncode == 9, crashed.stderr.decode(errors="replace")
        leftovers = [p for p in staging_files(root) if p.name.startswith("document-")]
        assert len(leftovers) == 1
        assert leftovers[0].read_bytes() == b"new bytes"
        assert alive.get_document("entries/team-a/k") == old

        reopened = FsBlobStore(root)
        try:
            assert all(not p.exists() for p in leftovers)
            assert staging_files(root) == [live_upload]  # the live area is untouched
            assert reopened.get_document("entries/team-a/k") == old
            assert sorted(reopened.documents("")) == ([] if old is None else ["entries/team-a/k"])
        finally:
            reopened.close()
    finally:
        alive.close()


# --- the formats ----------------------------------------------------------------------


def manifest(key: str = KEY) -> str:
    files = {"model.neff": {"digest": DIGEST, "size": 3}}
    return json.dumps({"files": files, "key": key}, sort_keys=True, separators=(",", ":"))


ENTRY = Entry("team-a", KEY, manifest(), 1_712_000_000.125, "tok1")
TOKEN = Token(
    token_id="t1",
    secret_hash="ef" * 32,
    scope="admin",
    namespaces=("team-a", "team-b"),
    name="CI job é",
    created_at=1_712_000_000.5,
    revoked=True,
    trusted=True,
)
RECORD = Record("pin", "team-a", "prod/v1 é", '{"by":"admin"}')
ALIAS = ("team-a", "neuronxcc-2.20/MODULE_1+2", KEY)


def test_every_kind_round_trips_exactly() -> None:
    """Nothing lost: each row comes back field for field (floats exactly, tuples as
    tuples, flags set)."""
    awkward = Entry("team-a", KEY, manifest(), 0.1 + 0.2, "tok-é")
    assert docs.entry_from(docs.entry_document(ENTRY)) == ENTRY
    assert docs.entry_from(docs.entry_document(awkward)) == awkward
    assert docs.alias_from(docs.alias_document(*ALIAS)) == ALIAS
    assert docs.token_from(docs.token_document(TOKEN)) == TOKEN
    plain = Token("t2", "12" * 32, "read", ("*",), "reader", 1.0)
    assert docs.token_from(docs.token_document(plain)) == plain
    assert docs.record_from(docs.record_document(RECORD)) == RECORD


def test_the_entry_document_format_is_pinned() -> None:
    """Nothing lost: documents are on disk for years; this byte string changes only on
    purpose (with a new ``format`` and a reader for the old one)."""
    expected = (
        b'{"blake3":"1204e2ed3280695fce31ca955485608929658f15de51a483d812e39d3a69e9e7",'
        b'"body":{"created_at":1712000000.125,'
        b'"key":"abababababababababababababababababababababababababababababababab",'
        b'"manifest":"{\\"files\\":{\\"model.neff\\":{\\"digest\\":'
        b'\\"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd\\",'
        b'\\"size\\":3}},\\"key\\":'
        b'\\"abababababababababababababababababababababababababababababababab\\"}",'
        b'"namespace":"team-a","writer":"tok1"},"format":1,"kind":"entry"}'
    )
    assert docs.entry_document(ENTRY) == expected
    assert docs.entry_from(expected) == ENTRY


ENCODED = {
    "entry": docs.entry_document(ENTRY),
    "alias": docs.alias_document(*ALIAS),
    "token": docs.token_document(TOKEN),
    "record": docs.record_document(RECORD),
}
READERS: dict[str, Callable[[bytes], object]] = {
    "entry": docs.entry_from,
    "alias": docs.alias_from,
    "token": docs.token_from,
    "record": docs.record_from,
}


@pytest.mark.parametrize("kind", sorted(ENCODED))
def test_every_flipped_bit_of_a_document_is_an_error(kind: str) -> None:
    """Nothing lost: any single flipped byte (damage at rest), in the body or the
    envelope, reads as DocumentError, never as another row."""
    data = ENCODED[kind]
    for at in range(len(data)):
        damaged = data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]
        with pytest.raises(docs.DocumentError):
            READERS[kind](damaged)


@pytest.mark.parametrize("kind", sorted(ENCODED))
def test_a_document_of_another_kind_is_an_error(kind: str) -> None:
    """Nothing lost: a document never reads as a row of another kind."""
    for other, read in READERS.items():
        if other != kind:
            with pytest.raises(docs.DocumentError):
                read(ENCODED[kind])


def envelope(kind: str, body: Any, changes: dict[str, Any] | None = None) -> bytes:
    """A document with a correct digest of ``body``, and ``changes`` to the envelope."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    raw = {"blake3": blake3.blake3(canonical.encode()).hexdigest(), "body": body}
    raw.update({"format": 1, "kind": kind, **(changes or {})})
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    "changes",
    [{"format": 2}, {"format": "1"}, {"format": None}, {"kind": "Entry"}, {"kind": None}],
    ids=["format-2", "format-string", "format-null", "kind-case", "kind-null"],
)
def test_a_wrong_envelope_is_an_error(changes: dict[str, Any]) -> None:
    """Nothing lost: only format 1 of the kind asked for is read (a later format is
    not misread by this version)."""
    body = asdict(ENTRY)
    assert docs.entry_from(envelope("entry", body)) == ENTRY  # the control
    with pytest.raises(docs.DocumentError):
        docs.entry_from(envelope("entry", body, changes))


def test_a_missing_envelope_field_is_an_error() -> None:
    """Nothing lost: a document without its digest, body, format or kind is not read."""
    whole = json.loads(ENCODED["entry"])
    for field in whole:
        partial = {k: v for k, v in whole.items() if k != field}
        with pytest.raises(docs.DocumentError):
            docs.entry_from(json.dumps(partial).encode())


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"\xff\xfe\x00", b"[]", b"null", b'"entry"', b"1", b'{"body":[]}'],
    ids=["empty", "truncated", "binary", "list", "null", "string", "number", "body-list"],
)
def test_what_is_not_a_document_is_an_error(data: bytes) -> None:
    """Nothing lost: bytes that are not a document object are never read as one."""
    for read in READERS.values():
        with pytest.raises(docs.DocumentError):
            read(data)


def body_of(kind: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(ENCODED[kind])["body"]
    return body


# (kind, field): each field of each kind; its removal must be refused.
MISSING = [(kind, field) for kind in sorted(ENCODED) for field in sorted(body_of(kind))]


@pytest.mark.parametrize(("kind", "field"), MISSING)
def test_a_missing_body_field_is_an_error(kind: str, field: str) -> None:
    """Nothing lost: a document lacking a field (with a valid digest: not ours) is
    refused rather than completed with a guess (a revoked token read as live)."""
    body = {k: v for k, v in body_of(kind).items() if k != field}
    with pytest.raises(docs.DocumentError):
        READERS[kind](envelope(kind, body))


@pytest.mark.parametrize("kind", sorted(ENCODED))
def test_an_extra_body_field_is_an_error(kind: str) -> None:
    """Nothing lost: a document with a field this version does not know is refused,
    not read with the field dropped."""
    body = {**body_of(kind), "extra": "x"}
    with pytest.raises(docs.DocumentError):
        READERS[kind](envelope(kind, body))


WRONG_TYPES: list[tuple[str, str, Any]] = [
    ("entry", "namespace", 7),
    ("entry", "key", None),
    ("entry", "manifest", {"files": {}}),
    ("entry", "created_at", "1712000000.125"),
    ("entry", "created_at", None),
    ("entry", "writer", ["tok1"]),
    ("alias", "namespace", 1),
    ("alias", "alias", None),
    ("alias", "key", ["k"]),
    ("token", "token_id", 1),
    ("token", "secret_hash", None),
    ("token", "scope", 3),
    ("token", "namespaces", "team-a"),
    ("token", "namespaces", [1, 2]),
    ("token", "name", None),
    ("token", "created_at", "yesterday"),
    ("token", "revoked", "no"),
    ("token", "trusted", 1),
    ("record", "kind", 1),
    ("record", "namespace", None),
    ("record", "name", 2.5),
    ("record", "value", {"by": "admin"}),
]


@pytest.mark.parametrize(("kind", "field", "value"), WRONG_TYPES)
def test_a_body_field_of_the_wrong_type_is_an_error(kind: str, field: str, value: Any) -> None:
    """Nothing lost: a field of the wrong type is refused, never restored into a row
    the index (or the server reading it) would misread."""
    body = {**body_of(kind), field: value}
    with pytest.raises(docs.DocumentError):
        READERS[kind](envelope(kind, body))


def test_names_are_valid_and_hash_what_is_not_a_segment() -> None:
    """Nothing lost: every row's document name is a valid name, distinct rows get
    distinct names, and the same row always the same name (found again to update or
    remove it)."""
    aliases = ["neuronxcc-2.20/MODULE_1+2", "a b", "é", "../..", "x" * 500, ""]
    names = [docs.alias_name("team-a", alias) for alias in aliases]
    names += [docs.alias_name("team-b", aliases[0])]
    records = [
        ("pin", "team-a", "prod/v1 é"),
        ("pin", "team-b", "prod/v1 é"),
        ("policy", "team-a", ""),
    ]
    names += [docs.record_name(*record) for record in records]
    names += [docs.entry_name("team-a", KEY), docs.token_name("t1")]
    assert all(check_name(name) == name for name in names)
    assert len(set(names)) == len(names)
    assert docs.alias_name("team-a", aliases[0]) == names[0]
    assert docs.entry_name("team-a", KEY) == f"entries/team-a/{KEY}"
    assert docs.token_name("t1") == "tokens/t1"
    assert names[0].startswith("aliases/team-a/")
    assert len(names[0].rsplit("/")[-1]) == 32
    assert docs.record_name("pin", "team-a", "x").startswith("records/pin/")
    assert docs.record_name("pin", "team-a", "x") != docs.record_name("policy", "team-a", "x")
