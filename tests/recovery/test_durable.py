"""``DurableIndex`` (recovery/durable.py): every durable row's document kept in step
with the index, on memory, SQLite + filesystem, and a real redis-server + memory
documents; the ``complete`` marker and the start-up check; the restores of
recovery/reindex.py (``restore_entry``, ``restore_configuration``, ``reindex``,
``reconcile``) and ``IndexRecovery``, which the evicting replica runs; and what all
of it guards: blob collection on a wiped, or partly lost, index.

Nothing lost, throughout: an acknowledged publish has its document (or is not
acknowledged, and leaves no row); an acknowledged entry the index lost is never
replaced by a later publish of another manifest; a document matches what the index
holds after every change, whichever replica settles last; a revocation, once
documented, stands; and a lost or partly lost index never lets blob collection remove
a blob an entry references: the pass waits, or the index is rebuilt (or its lost rows
restored) first."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import pytest
import redis
from support.backends import backends

from neffcache.server.auth import TokenPresence
from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.documents import DocumentStore
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.deps import Backends
from neffcache.server.errors import StoreError
from neffcache.server.eviction.maintenance import Maintenance
from neffcache.server.index import Entry, Index, Lease, PutResult, Record, Token
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.index.redis import RedisIndex
from neffcache.server.index.sqlite import SqliteIndex
from neffcache.server.manifest import canonical_json
from neffcache.server.namespaces import POLICY
from neffcache.server.recovery import documents as docs
from neffcache.server.recovery.durable import (
    META,
    TOMBSTONE,
    DurableIndex,
    has_documents,
    is_complete,
    mark_complete,
)
from neffcache.server.recovery.fsck import fsck
from neffcache.server.recovery.reindex import (
    IndexRecovery,
    ReindexReport,
    check_at_start,
    reconcile,
    reindex,
    restore_configuration,
    restore_entry,
)
from neffcache.server.services import durable
from neffcache.server.settings import ServerSettings

NS = "team-a"
KEY = "ab" * 32
OTHER_KEY = "cd" * 32
LOGGER = "neffcache.server.recovery"


class Spy:
    """A DocumentStore over another that records writes (``created``: the create-only
    ones), reads, listings and deletes, and can fail them (StoreError, as a backend
    would) or run a hook first (another replica acting in between)."""

    def __init__(self, inner: DocumentStore) -> None:
        self.inner = inner
        self.puts: list[str] = []
        self.created: list[str] = []
        self.gets: list[str] = []
        self.listed: list[str] = []
        self.deletes: list[str] = []
        self.fail_put = False
        self.fail_get = False
        self.fail_delete = False
        self.fail_list = False
        self.before_put: Callable[[str], None] | None = None
        self.before_delete: Callable[[str], None] | None = None

    def put_document(self, name: str, data: bytes, *, create_only: bool = False) -> bool:
        if self.before_put is not None:
            hook, self.before_put = self.before_put, None
            hook(name)
        if self.fail_put:
            raise StoreError(f"injected: cannot write document {name}")
        self.puts.append(name)
        if create_only:
            self.created.append(name)
        return self.inner.put_document(name, data, create_only=create_only)

    def get_document(self, name: str) -> bytes | None:
        if self.fail_get:
            raise StoreError(f"injected: cannot read document {name}")
        self.gets.append(name)
        return self.inner.get_document(name)

    def delete_document(self, name: str) -> bool:
        if self.before_delete is not None:
            hook, self.before_delete = self.before_delete, None
            hook(name)
        if self.fail_delete:
            raise StoreError(f"injected: cannot delete document {name}")
        self.deletes.append(name)
        return self.inner.delete_document(name)

    def documents(self, prefix: str) -> Iterator[str]:
        if self.fail_list:
            raise StoreError("injected: cannot list documents")
        self.listed.append(prefix)
        return self.inner.documents(prefix)

    def reset(self) -> None:
        for calls in (self.puts, self.created, self.gets, self.listed, self.deletes):
            calls.clear()


@dataclass
class Pair:
    """An index and a blob store (whose documents back it), with the index wrapped."""

    kind: str
    index: Index
    blobs: BlobStore
    spy: Spy
    durable: DurableIndex
    tmp: Path
    redis_url: str = ""

    def document(self, name: str) -> bytes | None:
        return self.spy.inner.get_document(name)

    def all_documents(self) -> list[str]:
        return sorted(self.spy.inner.documents(""))

    def wipe(self) -> Index:
        """Lose the index the way each backend loses it; the index to use now (the same
        object when it was wiped in place under a running server)."""
        if self.kind == "memory":
            for namespace in self.index.namespaces():
                for entry in self.index.list_entries(namespace, None, 10_000):
                    assert self.index.delete_entry(namespace, entry.key, entry.created_at)
            self.index.delete_record(META, "", "complete")
            return self.index
        if self.kind == "redis":
            with redis.Redis.from_url(self.redis_url) as client:
                client.flushdb()
            return self.index
        # The SQLite file is gone: a restarted server opens a new, empty one.
        return SqliteIndex(self.tmp / f"index-{uuid.uuid4().hex}.db")


# Blob store + index: every index, each beside a document store.
PAIRS = ["memory", "filesystem+sqlite", "memory+redis"]


@pytest.fixture(params=backends(*PAIRS))
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    redis_url = ""
    index: Index
    blobs: BlobStore
    if request.param == "memory":
        index, blobs = MemoryIndex(), MemoryBlobStore()
    elif request.param == "filesystem+sqlite":
        index, blobs = SqliteIndex(tmp_path / "index.db"), FsBlobStore(tmp_path / "blobs")
    else:
        redis_url = request.getfixturevalue("redis_server")
        with redis.Redis.from_url(redis_url) as client:
            client.flushdb()
        index, blobs = RedisIndex.from_url(redis_url), MemoryBlobStore()
    assert isinstance(blobs, DocumentStore)
    spy = Spy(blobs)
    kind = request.param.rpartition("+")[2]  # the index
    yield Pair(kind, index, blobs, spy, DurableIndex(index, spy, blobs), tmp_path, redis_url)
    index.close()
    blobs.close()


@pytest.fixture
def blobs() -> Iterator[MemoryBlobStore]:
    store = MemoryBlobStore()
    yield store
    store.close()


def entry(key: str = KEY, *, created_at: float = 1_712_000_000.125, neff: str = "11") -> Entry:
    return Entry(NS, key, f'{{"neff":"{neff}"}}', created_at, "tok1")


def entry_doc(pair: Pair, key: str = KEY) -> bytes | None:
    return pair.document(docs.entry_name(NS, key))


def blob(store: BlobStore, data: bytes) -> str:
    staged = store.staging_dir() / f"upload-{uuid.uuid4().hex}"
    staged.write_bytes(data)
    digest = blake3.blake3(data).hexdigest()
    store.commit(staged, digest)
    return digest


def made(
    blobs: BlobStore,
    n: int,
    namespace: str = NS,
    *,
    created_at: float | None = None,
    build: str = "",
) -> Entry:
    """An entry as a client would publish it, its blobs committed (its row not yet
    written): key ``n`` of ``namespace``, with a direct-key alias; another ``build``
    of the same key has other blobs, so another manifest."""
    key = blake3.blake3(f"key {namespace} {n}".encode()).hexdigest()
    direct = blake3.blake3(f"direct {namespace} {n}".encode()).hexdigest()
    files = {}
    for name in ("model.neff", "model.hlo"):
        data = f"{name} of {namespace} {n} {build}".encode() * (n + 1)
        files[name] = {"digest": blob(blobs, data), "size": len(data)}
    manifest = canonical_json({"key": key, "direct_key": direct, "files": files})
    when = time.time() if created_at is None else created_at
    return Entry(namespace, key, manifest, when, "tok1")


def direct_key(stored: Entry) -> str:
    value: str = json.loads(stored.manifest)["direct_key"]
    return value


def entry_digests(stored: Entry) -> set[str]:
    files = json.loads(stored.manifest)["files"]
    return {ref["digest"] for ref in files.values()}


def published(
    index: Index, blobs: BlobStore, n: int, namespace: str = NS, *, created_at: float | None = None
) -> Entry:
    """An entry as the API publishes it: its blobs committed, then its row (through
    ``index``, so a DurableIndex writes its document), with a direct-key alias."""
    stored = made(blobs, n, namespace, created_at=created_at)
    assert index.put_entry(stored, (direct_key(stored),)) is PutResult.CREATED
    return stored


def stats_of(index: Index, stored: Entry) -> tuple[float, int]:
    """(last_access, hits) of an entry the index holds."""
    for stats in index.entry_stats(stored.namespace, None, 10_000):
        if stats.key == stored.key:
            return stats.last_access, stats.hits
    raise AssertionError(f"no entry {stored.namespace}/{stored.key}")


# --- entries --------------------------------------------------------------------------


def test_a_created_entry_writes_its_document(pair: Pair) -> None:
    """Nothing lost: an acknowledged publish has its document, byte for byte the
    document of the row the index holds, written create-only (one write: it never
    replaces a document already there)."""
    stored = entry()
    assert pair.durable.put_entry(stored, ()) is PutResult.CREATED
    assert entry_doc(pair) == docs.entry_document(stored)
    assert pair.spy.puts == [docs.entry_name(NS, KEY)]
    assert pair.spy.created == [docs.entry_name(NS, KEY)]
    assert pair.index.get_entry(NS, KEY) == stored


def test_a_same_publish_writes_a_missing_or_different_document_only(pair: Pair) -> None:
    """Nothing lost: a retried publish (SAME) heals a document a failed first try
    never wrote, or one that differs, with the index's row (the first writer's
    ``created_at``); an equal one is left alone (no write per retry)."""
    first = entry(created_at=1.5)
    retry = entry(created_at=2.5)
    pair.durable.put_entry(first, ())
    name = docs.entry_name(NS, KEY)
    pair.spy.reset()

    assert pair.durable.put_entry(retry, ()) is PutResult.SAME
    assert pair.spy.puts == []  # equal: untouched

    pair.spy.inner.delete_document(name)
    assert pair.durable.put_entry(retry, ()) is PutResult.SAME
    assert entry_doc(pair) == docs.entry_document(first)

    pair.spy.inner.put_document(name, b"something else")
    assert pair.durable.put_entry(retry, ()) is PutResult.SAME
    assert entry_doc(pair) == docs.entry_document(first)
    assert pair.spy.puts == [name, name]


def test_a_conflicting_publish_writes_nothing(pair: Pair) -> None:
    """Nothing lost: a CONFLICT changes no document (the first manifest's stays)."""
    original = entry(neff="11")
    pair.durable.put_entry(original, ())
    pair.spy.reset()
    assert pair.durable.put_entry(entry(neff="22", created_at=9.0), ()) is PutResult.CONFLICT
    assert pair.spy.puts == []
    assert entry_doc(pair) == docs.entry_document(original)


def test_a_publish_over_a_lost_entry_of_another_manifest_conflicts_and_restores_it(
    pair: Pair,
) -> None:
    """Nothing lost: the index lost the row of an acknowledged entry whose document
    stands (a wipe not yet reindexed, a backup restored); a publish of its key with
    another manifest does not replace it. The documented entry is the row again (with
    its manifest's aliases, the publish's own gone), its document stays byte for byte,
    and the publish conflicts, as it would have against the row."""
    acknowledged = made(pair.blobs, 0, created_at=1_712_000_000.5, build="first compile")
    name = docs.entry_name(NS, acknowledged.key)
    pair.spy.inner.put_document(name, docs.entry_document(acknowledged))
    later = made(pair.blobs, 0, build="second compile")
    assert later.manifest != acknowledged.manifest

    result = pair.durable.put_entry(later, ("alias-of-the-later-publish",))
    assert result is PutResult.CONFLICT
    assert pair.index.get_entry(NS, acknowledged.key) == acknowledged
    assert pair.index.resolve_alias(NS, direct_key(acknowledged)) == acknowledged.key
    assert pair.index.resolve_alias(NS, "alias-of-the-later-publish") is None
    assert pair.document(name) == docs.entry_document(acknowledged)
    assert pair.spy.created[:1] == [name]  # it tried create-only, and kept what it found
    assert pair.all_documents() == [name]


def test_a_publish_over_a_lost_entry_of_the_same_manifest_is_created_and_documented(
    pair: Pair,
) -> None:
    """Nothing lost: the lost entry's document names the manifest now published (the
    same compile, published again): the publish is CREATED, and the document is
    rewritten to match the row the index now holds (its ``created_at``)."""
    lost = entry(created_at=1.5)
    name = docs.entry_name(NS, KEY)
    pair.spy.inner.put_document(name, docs.entry_document(lost))
    again = entry(created_at=9.5)
    assert pair.durable.put_entry(again, ()) is PutResult.CREATED
    assert pair.index.get_entry(NS, KEY) == again
    assert entry_doc(pair) == docs.entry_document(again)
    assert pair.all_documents() == [name]


@pytest.mark.parametrize(
    "found",
    [b"damaged at rest", docs.alias_document(NS, "a", KEY)],
    ids=["damaged", "another-kind"],
)
def test_a_publish_over_a_document_that_does_not_read_replaces_it(pair: Pair, found: bytes) -> None:
    """Nothing lost: a document under the key's name that does not read as an entry
    holds nothing to keep; the publish is CREATED and its document written."""
    name = docs.entry_name(NS, KEY)
    pair.spy.inner.put_document(name, found)
    stored = entry()
    assert pair.durable.put_entry(stored, ()) is PutResult.CREATED
    assert pair.index.get_entry(NS, KEY) == stored
    assert entry_doc(pair) == docs.entry_document(stored)


def test_a_leftover_document_whose_blobs_are_gone_does_not_refuse_a_publish(
    pair: Pair,
) -> None:
    """Nothing lost: a document whose entry cannot be restored (a blob it names is
    gone: reindex and reconcile leave it out) must not win over a publish whose blobs
    are all there: the publish is CREATED, and the index never holds a row naming an
    absent blob."""
    unrestorable = made(pair.blobs, 0, created_at=1.5, build="first compile")
    name = docs.entry_name(NS, unrestorable.key)
    pair.spy.inner.put_document(name, docs.entry_document(unrestorable))
    for digest in entry_digests(unrestorable):
        assert pair.blobs.delete(digest) is True
    fresh = made(pair.blobs, 0, build="second compile")

    result = pair.durable.put_entry(fresh, (direct_key(fresh),))
    held = pair.index.get_entry(NS, fresh.key)
    assert held is not None
    assert all(pair.blobs.size(d) is not None for d in entry_digests(held))
    assert result is PutResult.CREATED
    assert held == fresh
    assert pair.document(name) == docs.entry_document(fresh)


def test_a_failed_document_write_takes_the_publish_back(pair: Pair) -> None:
    """Nothing lost: a publish whose document cannot be written fails (StoreError: the
    client retries) and leaves no row, alias included, that a lost index would lose;
    the retry then succeeds whole."""
    stored = entry()
    pair.spy.fail_put = True
    with pytest.raises(StoreError):
        pair.durable.put_entry(stored, ("alias-1",))
    assert pair.index.get_entry(NS, KEY) is None
    assert pair.index.resolve_alias(NS, "alias-1") is None
    assert pair.all_documents() == []

    pair.spy.fail_put = False
    assert pair.durable.put_entry(stored, ("alias-1",)) is PutResult.CREATED
    assert entry_doc(pair) == docs.entry_document(stored)
    assert pair.index.resolve_alias(NS, "alias-1") == KEY


def test_delete_entry_removes_its_document(pair: Pair) -> None:
    """Nothing lost: an evicted entry leaves no document to resurrect it, and the
    other entries' documents stay."""
    doomed, kept = entry(), entry(OTHER_KEY)
    pair.durable.put_entry(doomed, ())
    pair.durable.put_entry(kept, ())
    assert pair.durable.delete_entry(NS, KEY, doomed.created_at) is True
    assert pair.index.get_entry(NS, KEY) is None
    assert entry_doc(pair) is None
    assert entry_doc(pair, OTHER_KEY) == docs.entry_document(kept)


def test_a_stale_delete_leaves_row_and_document(pair: Pair) -> None:
    """Nothing lost: a delete planned against an earlier publish of the key (another
    ``created_at``) removes neither the row nor its document."""
    stored = entry(created_at=5.0)
    pair.durable.put_entry(stored, ())
    pair.spy.reset()
    assert pair.durable.delete_entry(NS, KEY, 4.0) is False
    assert pair.index.get_entry(NS, KEY) == stored
    assert entry_doc(pair) == docs.entry_document(stored)
    assert pair.spy.deletes == []
    assert pair.spy.puts == []


def test_a_publish_racing_a_delete_keeps_its_document(pair: Pair) -> None:
    """Nothing lost: another replica publishes the key again between this delete's
    row removal and its document removal (its document written, then removed by this
    delete); the entry in the index ends with its document, equal to its row."""
    old, new = entry(created_at=1.0), entry(created_at=2.0)
    pair.durable.put_entry(old, ())
    other_replica = DurableIndex(pair.index, pair.spy.inner)

    def republish(name: str) -> None:
        assert other_replica.put_entry(new, ()) is PutResult.CREATED

    pair.spy.before_delete = republish
    assert pair.durable.delete_entry(NS, KEY, old.created_at) is True
    assert pair.index.get_entry(NS, KEY) == new
    assert entry_doc(pair) == docs.entry_document(new)


def test_a_delete_racing_a_publish_leaves_no_document(pair: Pair) -> None:
    """Nothing lost (nor resurrected): another replica evicts the entry between this
    publish's row and its document; the index then holds no entry, and its document
    must be gone too (the module's rule: whichever settles last writes the index's
    final state), else the next reindex restores an evicted entry."""
    stored = entry()
    other_replica = DurableIndex(pair.index, pair.spy.inner)

    def evict(name: str) -> None:
        assert other_replica.delete_entry(NS, KEY, stored.created_at) is True

    pair.spy.before_put = evict
    pair.durable.put_entry(stored, ())
    assert pair.index.get_entry(NS, KEY) is None
    assert entry_doc(pair) is None


def test_a_failed_document_delete_logs_and_the_delete_stands(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing lost: the row is gone either way, so the delete succeeds (no error for
    the evictor to retry forever); the leftover document is logged (fsck reports it
    as unindexed)."""
    stored = entry()
    pair.durable.put_entry(stored, ())
    pair.spy.fail_delete = True
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert pair.durable.delete_entry(NS, KEY, stored.created_at) is True
    assert pair.index.get_entry(NS, KEY) is None
    assert entry_doc(pair) == docs.entry_document(stored)
    assert any(KEY in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


# --- aliases --------------------------------------------------------------------------


def test_add_alias_documents_created_and_same_aliases_only(pair: Pair) -> None:
    """Nothing lost: an alias added after its entry's publish has its document (written
    again when missing); an alias that conflicts or names no entry writes none."""
    pair.durable.put_entry(entry(), ())
    pair.durable.put_entry(entry(OTHER_KEY), ())
    name = docs.alias_name(NS, "alias-1")
    wanted = docs.alias_document(NS, "alias-1", KEY)
    pair.spy.reset()

    assert pair.durable.add_alias(NS, "alias-1", KEY) is PutResult.CREATED
    assert pair.document(name) == wanted
    assert pair.durable.add_alias(NS, "alias-1", KEY) is PutResult.SAME
    assert pair.spy.puts == [name]  # the equal document was left alone
    pair.spy.inner.delete_document(name)
    assert pair.durable.add_alias(NS, "alias-1", KEY) is PutResult.SAME
    assert pair.document(name) == wanted

    pair.spy.reset()
    assert pair.durable.add_alias(NS, "alias-1", OTHER_KEY) is PutResult.CONFLICT
    assert pair.durable.add_alias(NS, "alias-2", "ef" * 32) is None
    assert pair.spy.puts == []
    assert pair.document(name) == wanted
    assert pair.document(docs.alias_name(NS, "alias-2")) is None


# --- tokens ---------------------------------------------------------------------------


def test_tokens_and_their_revocation_are_documented(pair: Pair) -> None:
    """Nothing lost: a token's document holds its row, and a revoked token's document
    says revoked (a rebuilt index never brings a revoked token back to life)."""
    token = Token("t1", "12" * 32, "write", (NS,), "ci", 1_712_000_000.5, trusted=True)
    pair.durable.put_token(token)
    name = docs.token_name("t1")
    assert pair.document(name) == docs.token_document(token)

    assert pair.durable.revoke_token("t1") is True
    data = pair.document(name)
    assert data is not None
    assert docs.token_from(data) == dataclasses.replace(token, revoked=True)

    pair.spy.reset()
    assert pair.durable.revoke_token("absent") is False
    assert pair.spy.puts == []
    assert pair.all_documents() == [name]


def test_a_revocation_in_the_document_sticks(pair: Pair) -> None:
    """Nothing lost: a token whose document says revoked is never live again, though
    the index holds it live (the bootstrap token made again at start-up on a lost
    index, an index restored from an older backup): writing it revokes it in the
    index, and its document stays revoked."""
    token = Token("t1", "12" * 32, "admin", ("*",), "bootstrap", 1_712_000_000.5)
    name = docs.token_name("t1")
    pair.spy.inner.put_document(name, docs.token_document(dataclasses.replace(token, revoked=True)))

    pair.durable.put_token(token)
    held = pair.index.token_by_hash(token.secret_hash)
    assert held is not None
    assert held.revoked is True
    data = pair.document(name)
    assert data is not None
    assert docs.token_from(data) == dataclasses.replace(token, revoked=True)

    pair.durable.sync_token("t1")  # and again: nothing flips back
    assert [t.revoked for t in pair.index.tokens()] == [True]
    assert pair.document(name) == data


def test_a_revocation_retried_after_its_document_failed_is_documented(pair: Pair) -> None:
    """Nothing lost: a revocation whose document could not be written (503 to the
    admin) stands in the index; the admin's retry finds the token revoked already and
    still writes the document, so a rebuilt index never brings the token back."""
    token = Token("t1", "12" * 32, "write", (NS,), "ci", 1_712_000_000.5)
    pair.durable.put_token(token)
    pair.spy.fail_put = True
    with pytest.raises(StoreError):
        pair.durable.revoke_token("t1")
    pair.spy.fail_put = False
    assert [t.revoked for t in pair.index.tokens()] == [True]
    assert docs.token_from(pair.document(docs.token_name("t1")) or b"").revoked is False

    assert pair.durable.revoke_token("t1") is True
    assert docs.token_from(pair.document(docs.token_name("t1")) or b"").revoked is True


def test_a_policy_put_again_after_its_document_failed_is_documented(pair: Pair) -> None:
    """Nothing lost: the same for a policy: put again unchanged, it is documented."""
    record = Record(POLICY, NS, "expiry", '{"days":7}')
    pair.spy.fail_put = True
    with pytest.raises(StoreError):
        pair.durable.put_record(record)
    pair.spy.fail_put = False
    assert pair.index.get_record(POLICY, NS, "expiry") == record
    assert pair.document(docs.record_name(POLICY, NS, "expiry")) is None

    assert pair.durable.put_record(record) is True
    assert pair.document(docs.record_name(POLICY, NS, "expiry")) == docs.record_document(record)


def test_a_live_token_document_does_not_revive_a_revoked_token(pair: Pair) -> None:
    """Nothing lost: the other way round, a document that says live (written before
    the revocation, which then failed to write its own) never revives the token the
    index holds revoked: the document is made revoked."""
    token = Token("t1", "12" * 32, "write", (NS,), "ci", 1_712_000_000.5)
    pair.durable.put_token(token)
    name = docs.token_name("t1")
    live = pair.document(name)
    assert pair.index.revoke_token("t1") is True  # behind the wrapper: no document write
    assert pair.document(name) == live

    pair.durable.sync_token("t1")
    held = pair.index.token_by_hash(token.secret_hash)
    assert held is not None
    assert held.revoked is True
    data = pair.document(name)
    assert data is not None
    assert docs.token_from(data).revoked is True


def test_a_token_document_that_does_not_read_is_rewritten_from_the_index(pair: Pair) -> None:
    """Nothing lost: a damaged token document revokes nothing (it says nothing); the
    token stays as the index holds it and its document is written again."""
    token = Token("t1", "12" * 32, "write", (NS,), "ci", 1_712_000_000.5)
    name = docs.token_name("t1")
    pair.spy.inner.put_document(name, b"damaged at rest")
    pair.durable.put_token(token)
    assert pair.index.tokens() == [token]
    assert pair.document(name) == docs.token_document(token)


# --- records --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["policy", "pin"])
def test_policies_and_pins_keep_their_documents_in_step(pair: Pair, kind: str) -> None:
    """Nothing lost: an admin's policy or pin is documented as the index holds it,
    through replacements (compare-and-set won) and not through refused ones; a removed
    one leaves no document."""
    name = "" if kind == "policy" else "prod"
    v1, v2, v3 = (Record(kind, NS, name, f'{{"v":{n}}}') for n in (1, 2, 3))
    doc_name = docs.record_name(kind, NS, name)

    assert pair.durable.put_record(v1) is True
    assert pair.document(doc_name) == docs.record_document(v1)
    assert pair.durable.put_record(v2, replacing=v1.value) is True
    assert pair.document(doc_name) == docs.record_document(v2)

    pair.spy.reset()
    assert pair.durable.put_record(v3, replacing=v1.value) is False  # stale compare
    assert pair.durable.put_record(v3, create_only=True) is False
    assert pair.spy.puts == []
    assert pair.document(doc_name) == docs.record_document(v2)

    assert pair.durable.delete_record(kind, NS, name) is True
    assert pair.document(doc_name) is None
    pair.spy.reset()
    assert pair.durable.delete_record(kind, NS, name) is False
    assert pair.spy.deletes == []
    assert pair.all_documents() == []


@pytest.mark.parametrize("kind", ["condemned", "meta", "program"])
def test_working_records_get_no_document(pair: Pair, kind: str) -> None:
    """Nothing lost: working state (condemned marks, the marker, the program map) is
    rebuilt or re-learnt, so it costs no document write."""
    record = Record(kind, "" if kind != "program" else NS, "some-name", "1")
    assert pair.durable.put_record(record) is True
    assert pair.durable.put_record(dataclasses.replace(record, value="2"), replacing="1")
    assert pair.durable.get_record(kind, record.namespace, "some-name") is not None
    assert pair.durable.delete_record(kind, record.namespace, "some-name") is True
    assert pair.spy.puts == []
    assert pair.spy.deletes == []
    assert pair.all_documents() == []


# --- the wrapper ----------------------------------------------------------------------


class RemoteMemoryIndex(MemoryIndex):
    local = False


class RemoteSpy(Spy):
    local = False


class LocalSpy(Spy):
    local = True


def test_local_only_when_both_stores_are(blobs: MemoryBlobStore) -> None:
    """Nothing lost: calls run on the event loop only when neither store can block it
    (a remote store answered inline would stall every request)."""
    assert DurableIndex(MemoryIndex(), blobs).local is True
    assert DurableIndex(MemoryIndex(), LocalSpy(blobs)).local is True
    assert DurableIndex(MemoryIndex(), RemoteSpy(blobs)).local is False
    assert DurableIndex(MemoryIndex(), Spy(blobs)).local is False  # unsaid: not local
    assert DurableIndex(RemoteMemoryIndex(), blobs).local is False


def test_other_calls_reach_the_wrapped_index(pair: Pair) -> None:
    """Nothing lost: reads, leases, tokens and records the wrapper does not define are
    the wrapped index's own (one index, seen through either)."""
    stored = entry()
    pair.index.put_entry(stored, ("alias-1",))
    assert pair.durable.get_entry(NS, KEY) == stored
    assert pair.durable.resolve_alias(NS, "alias-1") == KEY
    assert pair.durable.list_entries(NS, None, 10) == [stored]
    now = time.time()
    lease = Lease(NS, "graph", "lease-1", "host pid 1", now, now + 60)
    assert pair.durable.acquire_lease(lease) == lease
    held = pair.index.get_lease(NS, "graph", now)
    assert held is not None
    assert (held.lease_id, held.holder) == ("lease-1", "host pid 1")
    assert pair.durable.release_lease(NS, "graph", "lease-1", None) is True
    assert pair.index.get_lease(NS, "graph", now) is None
    assert pair.spy.puts == []  # none of these is a documented change


# --- the marker and the start-up check ------------------------------------------------


def test_check_at_start_marks_an_empty_pair_complete(pair: Pair) -> None:
    """Nothing lost: a new cache has nothing to rebuild; collection may run. Once
    marked, a start whose documents cannot be listed still starts (the tokens,
    policies and pins it compares at every start are compared again before the next
    collection); an unmarked one does not."""
    assert is_complete(pair.index) is False
    assert check_at_start(pair.index, pair.spy, pair.blobs) is True
    assert is_complete(pair.index) is True
    assert check_at_start(pair.index, pair.spy, pair.blobs) is True  # and stays so
    pair.spy.fail_list = True
    assert check_at_start(pair.index, pair.spy, pair.blobs) is True
    assert pair.index.delete_record(META, "", "complete") is True
    with pytest.raises(StoreError):
        check_at_start(pair.index, pair.spy, pair.blobs)


@pytest.mark.parametrize("with_blobs", [False, True], ids=["no-blobs", "blobs"])
def test_check_at_start_marks_an_index_from_before_documents_complete(
    pair: Pair, with_blobs: bool
) -> None:
    """Nothing lost: an index with entries but no documents (an upgrade) holds every
    row there is, blobs or none beside it; it is marked, and its documents are fsck
    --repair's to write."""
    stored = made(pair.blobs, 0) if with_blobs else entry()
    pair.index.put_entry(stored, ())
    assert check_at_start(pair.index, pair.spy, pair.blobs) is True
    assert is_complete(pair.index) is True
    assert pair.index.get_entry(NS, stored.key) == stored
    assert pair.all_documents() == []


def test_check_at_start_leaves_a_wiped_index_unmarked_and_says_so(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing lost: an empty index beside entry documents was lost or wiped; it stays
    unmarked (collection paused) and the operator is told to reindex. Entries are not
    restored here (the evicting replica's reindex does that)."""
    pair.spy.inner.put_document(docs.entry_name(NS, KEY), docs.entry_document(entry()))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert check_at_start(pair.index, pair.spy, pair.blobs) is False
    assert is_complete(pair.index) is False
    assert pair.index.get_entry(NS, KEY) is None
    assert any("reindex" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_check_at_start_leaves_an_entry_holding_index_beside_entry_documents_unmarked(
    pair: Pair,
) -> None:
    """Nothing lost: entry documents beside an unmarked index mean rows may be
    missing, however many it still holds (an index restored from a backup taken
    before the marker): it is not marked."""
    pair.index.put_entry(entry(OTHER_KEY), ())
    pair.spy.inner.put_document(docs.entry_name(NS, KEY), docs.entry_document(entry()))
    assert check_at_start(pair.index, pair.spy, pair.blobs) is False
    assert is_complete(pair.index) is False


def test_check_at_start_leaves_an_empty_index_beside_blobs_unmarked(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing lost: an empty index beside a blob store holding blobs and no documents
    is not a new cache (a restore that copied blobs/ before documents/, a replica
    pointed at the wrong prefix): marking it would let the collector take every
    blob. It stays unmarked, and says why."""
    blob(pair.blobs, b"a blob of an entry whose document is not there yet")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert check_at_start(pair.index, pair.spy, pair.blobs) is False
    assert is_complete(pair.index) is False
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("blobs" in message for message in warned)


def test_check_at_start_restores_tokens_policies_and_pins_at_once(pair: Pair) -> None:
    """Nothing lost: on an unmarked index the tokens (a revoked one revoked), policies
    and pins come back from their documents before the server starts taking requests,
    even while its entries wait for a reindex; the marker is still not set."""
    live = Token("t1", "12" * 32, "write", (NS,), "ci", 1_712_000_000.5, trusted=True)
    revoked = Token("t2", "34" * 32, "admin", ("*",), "bootstrap", 1_712_000_001.5, revoked=True)
    policy = Record("policy", NS, "", '{"ttl_seconds":60}')
    pin = Record("pin", NS, "prod", '{"by":"admin"}')
    store = pair.spy.inner
    for token in (live, revoked):
        store.put_document(docs.token_name(token.token_id), docs.token_document(token))
    for record in (policy, pin):
        name = docs.record_name(record.kind, record.namespace, record.name)
        store.put_document(name, docs.record_document(record))
    store.put_document(docs.entry_name(NS, KEY), docs.entry_document(entry()))

    assert check_at_start(pair.index, pair.spy, pair.blobs) is False
    assert sorted(pair.index.tokens(), key=lambda t: t.token_id) == [live, revoked]
    assert pair.index.get_record("policy", NS, "") == policy
    assert pair.index.get_record("pin", NS, "prod") == pin
    assert pair.index.get_entry(NS, KEY) is None
    assert is_complete(pair.index) is False


def test_check_at_start_revokes_a_token_the_index_holds_live(pair: Pair) -> None:
    """Nothing lost: a token the index holds live (made again before the check, or
    restored with an old backup) whose document says revoked ends revoked."""
    token = Token("t1", "12" * 32, "admin", ("*",), "bootstrap", 1_712_000_000.5)
    pair.index.put_token(token)
    revoked = dataclasses.replace(token, revoked=True)
    pair.spy.inner.put_document(docs.token_name("t1"), docs.token_document(revoked))
    assert check_at_start(pair.index, pair.spy, pair.blobs) is True
    assert pair.index.tokens() == [revoked]


def test_has_documents_looks_under_every_prefix_given(blobs: MemoryBlobStore) -> None:
    """Nothing lost: a document under any of the prefixes counts; none, or no prefix,
    does not."""
    assert has_documents(blobs, docs.ENTRIES, docs.TOKENS) is False
    blobs.put_document(docs.token_name("t1"), b"x")
    assert has_documents(blobs, docs.ENTRIES) is False
    assert has_documents(blobs, docs.ENTRIES, docs.TOKENS) is True
    assert has_documents(blobs, docs.TOKENS) is True
    assert has_documents(blobs) is False


class NoDocuments:
    """A blob store stand-in without documents (only what ``durable`` looks at)."""


def test_the_server_wraps_its_index_and_checks_it_at_start(
    blobs: MemoryBlobStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing lost: the server's index is the documented one, checked at start
    (app.py ``durable``); a store that keeps no documents leaves it plain, and says
    a lost index could not be rebuilt."""
    index = MemoryIndex()
    wrapped = durable(index, blobs)
    assert isinstance(wrapped, DurableIndex)
    assert wrapped.inner is index
    assert wrapped.store is blobs
    assert is_complete(index) is True

    unchecked = MemoryIndex()
    assert isinstance(durable(unchecked, blobs, at_start=False), DurableIndex)
    assert is_complete(unchecked) is False

    plain = MemoryIndex()
    with caplog.at_level(logging.WARNING, logger="neffcache.server"):
        assert durable(plain, NoDocuments()) is plain  # type: ignore[arg-type]
    assert any("rebuilt" in r.getMessage() for r in caplog.records)


def test_is_complete_follows_the_marker(pair: Pair) -> None:
    """Nothing lost: the marker, once gone (the index wiped), reads as incomplete."""
    assert is_complete(pair.index) is False
    mark_complete(pair.index, "test")
    assert is_complete(pair.index) is True
    assert pair.index.delete_record(META, "", "complete") is True
    assert is_complete(pair.index) is False


# --- restoring: recovery/reindex.py -------------------------------------------------


def test_restore_entry_puts_it_back_as_written_and_touched_now(pair: Pair) -> None:
    """Nothing lost: an entry whose blobs are all there comes back field for field
    (its first ``created_at`` kept: expiry by age counts from the first publish), with
    its manifest's aliases, and as last served at the restore with no hits: a rebuilt
    index is not a reason to expire every entry in it by idle time."""
    old = made(pair.blobs, 0, created_at=1_712_000_000.125)
    report = ReindexReport()
    before = time.time()
    restore_entry(pair.index, old, report, pair.blobs.size)
    after = time.time()
    assert (report.restored, report.present, report.conflicts) == (1, 0, [])
    assert pair.index.get_entry(NS, old.key) == old
    assert pair.index.resolve_alias(NS, direct_key(old)) == old.key
    last_access, hits = stats_of(pair.index, old)
    assert before <= last_access <= after
    assert hits == 0

    restore_entry(pair.index, old, report, pair.blobs.size)  # again: the row is there
    assert (report.restored, report.present) == (1, 1)
    assert pair.all_documents() == []  # the plain index: the documents are the source


def test_restore_entry_never_replaces_the_row_there(pair: Pair) -> None:
    """Nothing lost: where the index holds another manifest under the key, the index
    wins (a conflict, reported) and its row is untouched."""
    held = published(pair.index, pair.blobs, 0)
    other = made(pair.blobs, 0, created_at=1.5, build="another compile")
    report = ReindexReport()
    restore_entry(pair.index, other, report, pair.blobs.size)
    assert report.conflicts == [f"{NS}/{held.key}"]
    assert report.restored == 0
    assert pair.index.get_entry(NS, held.key) == held


def test_restore_entry_needs_every_blob_at_its_size(pair: Pair) -> None:
    """Nothing lost (nor half restored): an entry a blob of which is absent, or of
    another size, is reported and not restored; an entry document naming no file is
    reported damaged."""
    whole = made(pair.blobs, 0)
    gone = sorted(entry_digests(whole))[0]
    report = ReindexReport()
    restore_entry(pair.index, whole, report, lambda d: None if d == gone else pair.blobs.size(d))
    sizes = {d: pair.blobs.size(d) for d in entry_digests(whole)}
    restore_entry(
        pair.index, whole, report, lambda d: (sizes[d] or 0) + 1 if d == gone else sizes[d]
    )
    restore_entry(pair.index, entry(OTHER_KEY), report, pair.blobs.size)
    assert report.missing_blobs == [f"{NS}/{whole.key}", f"{NS}/{whole.key}"]
    assert report.damaged == [docs.entry_name(NS, OTHER_KEY)]
    assert report.restored == 0
    assert pair.index.get_entry(NS, whole.key) is None
    assert pair.index.get_entry(NS, OTHER_KEY) is None


def put_configuration_documents(store: DocumentStore, *items: Token | Record) -> None:
    for item in items:
        if isinstance(item, Token):
            store.put_document(docs.token_name(item.token_id), docs.token_document(item))
        else:
            name = docs.record_name(item.kind, item.namespace, item.name)
            store.put_document(name, docs.record_document(item))


def test_restore_configuration_restores_policies_and_pins_then_tokens(pair: Pair) -> None:
    """Nothing lost: every documented token (revoked ones revoked), policy and pin the
    index lacks comes back, policies and pins first (a token back before its
    namespace's trusted-writers rule could publish past it); each is counted once."""
    live = Token("t1", "12" * 32, "write", (NS,), "ci", 1_712_000_000.5, trusted=True)
    revoked = Token("t2", "34" * 32, "read", ("*",), "old", 1_712_000_001.5, revoked=True)
    policy = Record("policy", NS, "", '{"ttl_seconds":60}')
    pin = Record("pin", NS, "prod", '{"by":"admin"}')
    put_configuration_documents(pair.spy.inner, live, revoked, policy, pin)

    report = ReindexReport()
    restore_configuration(pair.index, pair.spy, report)
    assert (report.tokens, report.records, report.damaged) == (2, 2, [])
    assert pair.spy.listed == [docs.RECORDS, docs.TOKENS]
    assert sorted(pair.index.tokens(), key=lambda t: t.token_id) == [live, revoked]
    assert pair.index.records("policy") == [policy]
    assert pair.index.records("pin") == [pin]

    again = ReindexReport()
    restore_configuration(pair.index, pair.spy, again)  # idempotent
    assert (again.tokens, again.records) == (0, 0)


def test_restore_configuration_keeps_the_index_rows_and_every_revocation(pair: Pair) -> None:
    """Nothing lost: a policy the index holds stays as it is (the index wins); a token
    the index holds live whose document says revoked ends revoked; one the index holds
    revoked is never revived by a document that says live; a damaged document is
    reported and changes nothing."""
    to_revoke = Token("t1", "12" * 32, "write", (NS,), "ci", 1.5)
    stays_revoked = Token("t2", "34" * 32, "write", (NS,), "ci", 2.5, revoked=True)
    pair.index.put_token(to_revoke)
    pair.index.put_token(stays_revoked)
    held_policy = Record("policy", NS, "", '{"ttl_seconds":60}')
    pair.index.put_record(held_policy)
    put_configuration_documents(
        pair.spy.inner,
        dataclasses.replace(to_revoke, revoked=True),
        dataclasses.replace(stays_revoked, revoked=False),
        Record("policy", NS, "", '{"ttl_seconds":1}'),
    )
    pair.spy.inner.put_document(docs.token_name("t3"), b"damaged at rest")

    report = ReindexReport()
    restore_configuration(pair.index, pair.spy, report)
    assert (report.tokens, report.records) == (1, 0)
    assert report.damaged == [docs.token_name("t3")]
    assert [t.revoked for t in sorted(pair.index.tokens(), key=lambda t: t.token_id)] == [
        True,
        True,
    ]
    assert pair.index.get_record("policy", NS, "") == held_policy


def test_reindex_reports_complete_only_when_it_ran_to_the_end(pair: Pair) -> None:
    """Nothing lost: a reindex that is no longer leading when it ends (the lease lost
    to another replica) does not mark the index; run again, it finishes, restores
    every entry and says complete."""
    entries = [published(pair.durable, pair.blobs, n) for n in range(3)]
    wiped = pair.wipe()
    stopped = reindex(
        wiped, pair.blobs, pair.spy, progress=lambda line: None, leading=lambda: False
    )
    assert stopped.complete is False
    assert is_complete(wiped) is False
    assert stopped.as_json()["complete"] is False

    done = reindex(wiped, pair.blobs, pair.spy, progress=lambda line: None)
    assert done.complete is True
    assert done.as_json()["complete"] is True
    assert is_complete(wiped) is True
    assert [wiped.get_entry(NS, e.key) for e in entries] == entries
    if wiped is not pair.index:
        wiped.close()


def test_reconcile_restores_the_rows_a_marked_index_lost_and_reads_only_theirs(
    pair: Pair,
) -> None:
    """Nothing lost: the marker survived but rows did not (a backup restored, a Redis
    failover that lagged); reconcile puts back every documented entry the index lacks
    (touched now), reading only their documents, and leaves the rest alone."""
    mark_complete(pair.index, "test")
    entries = [
        published(pair.durable, pair.blobs, n, ns) for n in range(3) for ns in (NS, "team-b")
    ]
    lost = [entries[1], entries[4]]
    for stored in lost:
        assert pair.index.delete_entry(stored.namespace, stored.key, stored.created_at) is True
    pair.spy.reset()

    before = time.time()
    report = reconcile(pair.index, pair.blobs, pair.spy)
    assert (report.restored, report.present, report.missing_blobs, report.damaged) == (2, 0, [], [])
    assert sorted(pair.spy.gets) == sorted(docs.entry_name(e.namespace, e.key) for e in lost)
    assert pair.spy.puts == []
    assert pair.spy.deletes == []
    for stored in entries:
        assert pair.index.get_entry(stored.namespace, stored.key) == stored
    for stored in lost:
        last_access, hits = stats_of(pair.index, stored)
        assert last_access >= before
        assert hits == 0
    assert is_complete(pair.index) is True

    pair.spy.reset()
    assert reconcile(pair.index, pair.blobs, pair.spy).restored == 0  # nothing left to do
    assert pair.spy.gets == []


def test_reconcile_reports_what_it_cannot_restore(pair: Pair) -> None:
    """Nothing lost (nor half restored): a lost row whose blob is gone is reported,
    not restored; a damaged document of a lost row is reported; neither stops the
    others."""
    mark_complete(pair.index, "test")
    broken, damaged, fine = (published(pair.durable, pair.blobs, n) for n in range(3))
    for stored in (broken, damaged, fine):
        assert pair.index.delete_entry(NS, stored.key, stored.created_at) is True
    assert pair.blobs.delete(sorted(entry_digests(broken))[0]) is True
    pair.spy.inner.put_document(docs.entry_name(NS, damaged.key), b"damaged at rest")

    report = reconcile(pair.index, pair.blobs, pair.spy)
    assert report.restored == 1
    assert report.missing_blobs == [f"{NS}/{broken.key}"]
    assert report.damaged == [docs.entry_name(NS, damaged.key)]
    assert pair.index.get_entry(NS, fine.key) == fine
    assert pair.index.get_entry(NS, broken.key) is None
    assert pair.index.get_entry(NS, damaged.key) is None


# --- IndexRecovery: what the evicting replica runs ------------------------------------


def test_index_recovery_leaves_a_plain_index_alone(blobs: MemoryBlobStore) -> None:
    """Nothing lost: an index without documents (no DurableIndex) is never reindexed
    nor marked; collection runs as it always has."""
    index = MemoryIndex()
    recovery = IndexRecovery(index, blobs)
    assert recovery.intact() is True
    assert recovery.complete(lambda: True) is True
    assert recovery.reconciled(lambda: True) is True
    assert is_complete(index) is False


def test_index_recovery_is_intact_while_the_marker_is_there(pair: Pair) -> None:
    """Nothing lost: ``intact`` (asked every tick) reads the marker of the wrapped
    index, and only that: no document is listed or read for it."""
    recovery = IndexRecovery(pair.durable, pair.blobs)
    assert recovery.intact() is False
    mark_complete(pair.index, "test")
    assert recovery.intact() is True
    assert pair.spy.listed == []
    assert pair.spy.gets == []


def test_index_recovery_reindexes_an_unmarked_index(pair: Pair) -> None:
    """Nothing lost: before collecting, an unmarked index beside documents is rebuilt
    from them (every entry and alias back as written) and marked."""
    entries = [published(pair.durable, pair.blobs, n) for n in range(3)]
    wiped = pair.wipe()
    recovery = IndexRecovery(DurableIndex(wiped, pair.spy), pair.blobs)
    assert recovery.intact() is False
    assert recovery.complete(lambda: True) is True
    assert recovery.intact() is True
    assert is_complete(wiped) is True
    for stored in entries:
        assert wiped.get_entry(NS, stored.key) == stored
        assert wiped.resolve_alias(NS, direct_key(stored)) == stored.key
    if wiped is not pair.index:
        wiped.close()


def test_index_recovery_marks_an_unmarked_index_with_nothing_to_restore(pair: Pair) -> None:
    """Nothing lost: no documents and no blobs (a new cache started without the
    check): nothing to rebuild, so the index is marked at once."""
    recovery = IndexRecovery(pair.durable, pair.blobs)
    assert recovery.complete(lambda: True) is True
    assert is_complete(pair.index) is True


@pytest.mark.parametrize("with_blobs", [False, True], ids=["no-blobs", "blobs"])
def test_index_recovery_restores_the_configuration_of_an_index_wiped_before_any_entry(
    pair: Pair, with_blobs: bool
) -> None:
    """Nothing lost: an index wiped before any entry was published (no entry document;
    maybe blobs of a publish that never came) gets its tokens, policies and pins back
    in the evicting replica's tick. Only with nothing else to wait for is it marked;
    beside blobs it stays unmarked (collection waits), its configuration back anyway."""
    live = Token("t1", "12" * 32, "write", (NS,), "ci", 1_712_000_000.5)
    policy = Record("policy", NS, "", '{"trusted_writers_only":true}')
    pin = Record("pin", NS, "model:llama", '{"by":"admin"}')
    pair.durable.put_token(live)
    pair.durable.put_record(policy)
    pair.durable.put_record(pin)
    if with_blobs:
        blob(pair.blobs, b"an upload never published")
    # The memory pair's wipe keeps tokens and records: a new index loses them all.
    wiped = MemoryIndex() if pair.kind == "memory" else pair.wipe()
    recovery = IndexRecovery(DurableIndex(wiped, pair.spy), pair.blobs)
    assert recovery.complete(lambda: True) is (not with_blobs)
    assert is_complete(wiped) is (not with_blobs)
    assert wiped.tokens() == [live]
    assert wiped.get_record("policy", NS, "") == policy
    assert wiped.get_record("pin", NS, "model:llama") == pin
    if wiped is not pair.index:
        wiped.close()


def test_a_record_removed_whose_document_delete_failed_is_not_restored(pair: Pair) -> None:
    """Nothing resurrected: a pin removed while its document could not be deleted (a
    tombstone says so) is not put back by the configuration restore that every start
    and every collection runs: its removal is finished instead (the document and the
    tombstone deleted)."""
    mark_complete(pair.index, "test")
    pin = Record("pin", NS, "model:llama", '{"by":"admin"}')
    pair.durable.put_record(pin)
    pair.spy.fail_delete = True
    with pytest.raises(StoreError):
        pair.durable.delete_record("pin", NS, "model:llama")
    pair.spy.fail_delete = False
    name = docs.record_name("pin", NS, "model:llama")
    assert pair.document(name) is not None

    report = reconcile(pair.index, pair.blobs, pair.spy)
    assert (report.records, report.removed) == (0, 1)
    assert pair.index.get_record("pin", NS, "model:llama") is None
    assert pair.document(name) is None
    assert pair.index.records(TOMBSTONE) == []

    # Pinned again after a removal that left a tombstone: the pin is no longer
    # removed, and a later loss of its row restores it rather than its document going.
    pair.durable.put_record(pin)
    pair.spy.fail_delete = True
    with pytest.raises(StoreError):
        pair.durable.delete_record("pin", NS, "model:llama")
    pair.spy.fail_delete = False
    pair.durable.put_record(pin)
    assert pair.index.delete_record("pin", NS, "model:llama") is True  # the row lost
    report = reconcile(pair.index, pair.blobs, pair.spy)
    assert (report.records, report.removed) == (1, 0)
    assert pair.index.get_record("pin", NS, "model:llama") == pin
    assert pair.document(name) == docs.record_document(pin)


def test_index_recovery_on_a_store_error_reports_false_and_stays_unmarked(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing lost: when the documents cannot be listed or read, the index is not
    marked (so collection waits and the next pass tries again), and the pass is not
    failed."""
    published(pair.durable, pair.blobs, 0)
    wiped = pair.wipe()
    recovery = IndexRecovery(DurableIndex(wiped, pair.spy), pair.blobs)
    for failure in ("fail_list", "fail_get"):
        setattr(pair.spy, failure, True)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert recovery.complete(lambda: True) is False
            assert recovery.reconciled(lambda: True) is False
        assert is_complete(wiped) is False
        setattr(pair.spy, failure, False)
    assert recovery.complete(lambda: True) is True  # and recovers once it can
    assert is_complete(wiped) is True
    if wiped is not pair.index:
        wiped.close()


def test_index_recovery_that_stops_leading_leaves_the_index_unmarked(pair: Pair) -> None:
    """Nothing lost: a replica that lost the evictor lease mid-reindex does not mark
    the index (another replica's collector must not trust it); the next leader
    finishes."""
    entries = [published(pair.durable, pair.blobs, n) for n in range(2)]
    wiped = pair.wipe()
    recovery = IndexRecovery(DurableIndex(wiped, pair.spy), pair.blobs)
    assert recovery.complete(lambda: False) is False
    assert recovery.reconciled(lambda: False) is False
    assert is_complete(wiped) is False
    assert recovery.reconciled(lambda: True) is True
    assert [wiped.get_entry(NS, e.key) for e in entries] == entries
    if wiped is not pair.index:
        wiped.close()


def test_index_recovery_reconciles_a_marked_index_before_collection(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing lost: ``reconciled`` on a marked index that lost a row restores it (and
    says so) before answering True; when the documents cannot be listed it answers
    False (collection waits)."""
    mark_complete(pair.index, "test")
    kept, lost = (published(pair.durable, pair.blobs, n) for n in range(2))
    assert pair.index.delete_entry(NS, lost.key, lost.created_at) is True
    recovery = IndexRecovery(pair.durable, pair.blobs)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert recovery.reconciled(lambda: True) is True
    assert pair.index.get_entry(NS, lost.key) == lost
    assert pair.index.get_entry(NS, kept.key) == kept
    assert any("restored 1" in r.getMessage() for r in caplog.records)

    pair.spy.fail_list = True
    assert recovery.reconciled(lambda: True) is False
    assert is_complete(pair.index) is True  # a marked index stays marked


# --- maintenance: when the evicting replica recovers ----------------------------------


def backends_over(index: Index, blobs: BlobStore, tmp: Path, interval: float = 0) -> Backends:
    settings = ServerSettings(
        data_dir=tmp,
        eviction_interval_seconds=interval,
        blob_grace_seconds=0,
        default_ttl_seconds=None,
    )
    return Backends(settings, blobs, index, TokenPresence(index))


class FakeRecovery:
    """A ``Recovery`` (eviction/maintenance.py) that records what it is asked, with
    whom the maintenance leads as, and answers as told."""

    def __init__(self, *, intact: bool = True, reconciled: bool = True) -> None:
        self.answers = {"intact": intact, "complete": True, "reconciled": reconciled}
        self.calls: list[tuple[str, Callable[[], bool] | None]] = []

    def intact(self) -> bool:
        self.calls.append(("intact", None))
        return self.answers["intact"]

    def complete(self, leading: Callable[[], bool]) -> bool:
        self.calls.append(("complete", leading))
        return self.answers["complete"]

    def reconciled(self, leading: Callable[[], bool]) -> bool:
        self.calls.append(("reconciled", leading))
        return self.answers["reconciled"]

    def asked(self) -> list[str]:
        return [what for what, _ in self.calls]


def maintenance_with(recovery: FakeRecovery | None, blobs: BlobStore, tmp: Path) -> Maintenance:
    """A replica's maintenance over a new memory index, eviction off, no grace."""
    index = MemoryIndex()
    backends = backends_over(index, blobs, tmp)
    return Maintenance(index, backends.evictor, backends.access, backends.settings, recovery)


def test_with_eviction_off_an_intact_index_takes_no_lease(
    tmp_path: Path, blobs: MemoryBlobStore
) -> None:
    """Nothing lost: with background eviction off and the index intact, a tick leads
    nothing (no replica holds the evictor lease, none rebuilds); without a recovery
    at all the index counts as intact."""
    recovery = FakeRecovery(intact=True)
    maintenance = maintenance_with(recovery, blobs, tmp_path)
    maintenance.tick()
    assert maintenance.leader() is None
    assert recovery.asked() == ["intact"]

    plain = maintenance_with(None, blobs, tmp_path)
    plain.tick()
    assert plain.leader() is None


def test_with_eviction_off_a_lost_index_is_led_and_rebuilt(
    tmp_path: Path, blobs: MemoryBlobStore
) -> None:
    """Nothing lost: with background eviction off, a tick over an index that is not
    intact takes the evictor lease and rebuilds it (its tokens were lost with it:
    every client is refused until then), asking the lease as it goes; no eviction
    pass runs."""
    recovery = FakeRecovery(intact=False)
    maintenance = maintenance_with(recovery, blobs, tmp_path)
    maintenance.tick()
    assert maintenance.leader() == maintenance.actor
    assert recovery.asked() == ["intact", "complete"]
    assert recovery.calls[1][1] == maintenance.lead


@pytest.mark.parametrize("reconciled", [True, False], ids=["reconciled", "not-reconciled"])
def test_a_pass_collects_only_over_a_reconciled_index(
    tmp_path: Path, blobs: MemoryBlobStore, reconciled: bool
) -> None:
    """Nothing lost: a pass asks the recovery, with its own lease, whether the index
    names every documented entry right before it collects blobs; when not, the pass
    pauses collection and removes no blob, not even a plain orphan."""
    recovery = FakeRecovery(reconciled=reconciled)
    maintenance = maintenance_with(recovery, blobs, tmp_path)
    orphan = blob(blobs, b"an upload never published")
    done = maintenance.run("test")
    assert done is not None
    assert recovery.asked() == ["reconciled"]
    assert recovery.calls[0][1] == maintenance.lead
    assert done.paused is (not reconciled)
    assert done.collected.blobs == (1 if reconciled else 0)
    assert (blobs.size(orphan) is None) is reconciled


def test_the_server_recovers_through_index_recovery_within_a_tick(pair: Pair) -> None:
    """Nothing lost: the server's maintenance (deps.py) recovers through
    ``IndexRecovery`` over its documented index: with eviction off, an intact index
    takes no lease; once wiped (in place, or a new SQLite file at a restart), one tick
    takes the lease and brings every entry back."""
    index = started(pair.index, pair.spy, pair.blobs)
    backends = backends_over(index, pair.blobs, pair.tmp)
    recovery = backends.maintenance.recovery
    assert isinstance(recovery, IndexRecovery)
    assert recovery.index is index
    entries = [published(index, pair.blobs, n) for n in range(3)]
    backends.maintenance.tick()
    assert backends.maintenance.leader() is None

    wiped = pair.wipe()
    if wiped is not pair.index:
        backends = backends_over(started(wiped, pair.spy, pair.blobs), pair.blobs, pair.tmp)
    backends.maintenance.tick()
    assert is_complete(wiped) is True
    assert backends.maintenance.leader() == backends.maintenance.actor
    assert [wiped.get_entry(NS, e.key) for e in entries] == entries
    if wiped is not pair.index:
        wiped.close()


# --- the danger: collecting blobs on a lost or partly lost index ----------------------


def started(index: Index, store: Spy, blobs: BlobStore) -> DurableIndex:
    """The index as a starting server wraps it (app.py ``durable``)."""
    check_at_start(index, store, blobs)
    return DurableIndex(index, store)


@pytest.mark.parametrize("reindex_fails", [False, True], ids=["reindexed", "paused"])
def test_a_wiped_index_never_lets_collection_remove_a_referenced_blob(
    pair: Pair, reindex_fails: bool
) -> None:
    """Nothing lost: with no grace period, a pass over a complete index collects an
    orphan at once (the control); after the index is wiped (in place under the running
    server, or a new empty SQLite file at restart) a pass removes no blob at all:
    either it rebuilds the index first and every entry is back, or (documents
    unreadable) it pauses collection, and the next pass rebuilds."""
    spy = pair.spy
    index = started(pair.index, spy, pair.blobs)
    backends = backends_over(index, pair.blobs, pair.tmp)
    entries = [published(index, pair.blobs, n, ns) for n in range(3) for ns in (NS, "team-b")]
    orphan = blob(pair.blobs, b"an upload never published")

    control = backends.maintenance.run("test")
    assert control is not None
    assert control.collected.blobs == 1
    assert pair.blobs.size(orphan) is None
    referenced = {d for e in entries for d in entry_digests(e)}
    assert {b.digest for b in pair.blobs.blobs()} == referenced

    wiped = pair.wipe()
    if wiped is not pair.index:  # a restart: the server checks and wraps the new index
        backends = backends_over(started(wiped, spy, pair.blobs), pair.blobs, pair.tmp)
    assert wiped.namespaces() == [] or all(
        wiped.list_entries(ns, None, 10) == [] for ns in wiped.namespaces()
    )
    spy.fail_list = reindex_fails

    done = backends.maintenance.run("test")
    assert done is not None
    assert done.collected.blobs == 0
    assert done.paused is reindex_fails
    assert {b.digest for b in pair.blobs.blobs()} == referenced
    if reindex_fails:
        assert is_complete(wiped) is False
        spy.fail_list = False
        done = backends.maintenance.run("test")
        assert done is not None
        assert done.paused is False
        assert done.collected.blobs == 0
        assert {b.digest for b in pair.blobs.blobs()} == referenced
    assert is_complete(wiped) is True
    for stored in entries:
        assert wiped.get_entry(stored.namespace, stored.key) == stored
        assert wiped.resolve_alias(stored.namespace, direct_key(stored)) == stored.key
    if wiped is not pair.index:
        wiped.close()


@pytest.mark.parametrize("lost_namespace", [NS, "team-b"], ids=["beside-others", "its-own"])
def test_a_partly_lost_index_never_lets_collection_remove_a_lost_entrys_blobs(
    pair: Pair, lost_namespace: str
) -> None:
    """Nothing lost: a marked index loses one entry's row (a backup restored, a Redis
    replica that lagged: the marker survives, the row does not; here, the row deleted
    from the inner index, its document kept). With no grace period a pass would take
    its blobs as orphans; instead it restores the row from its document first
    (``reconcile``), collects a true orphan beside it (collection did run), and
    removes none of the lost entry's blobs."""
    index = started(pair.index, pair.spy, pair.blobs)
    backends = backends_over(index, pair.blobs, pair.tmp)
    entries = [published(index, pair.blobs, n) for n in range(3)]
    lost = published(index, pair.blobs, 7, lost_namespace)
    orphan = blob(pair.blobs, b"an upload never published")

    assert pair.index.delete_entry(lost.namespace, lost.key, lost.created_at) is True
    assert is_complete(pair.index) is True  # the marker survived the loss
    assert pair.document(docs.entry_name(lost.namespace, lost.key)) == docs.entry_document(lost)

    done = backends.maintenance.run("test")
    assert done is not None
    assert done.paused is False
    assert done.collected.blobs == 1
    assert pair.blobs.size(orphan) is None
    assert {d: pair.blobs.size(d) is not None for d in entry_digests(lost)} == {
        d: True for d in entry_digests(lost)
    }
    assert pair.index.get_entry(lost.namespace, lost.key) == lost
    assert pair.index.resolve_alias(lost.namespace, direct_key(lost)) == lost.key
    for stored in entries:
        assert pair.index.get_entry(NS, stored.key) == stored
    referenced = {d for e in [*entries, lost] for d in entry_digests(e)}
    assert {b.digest for b in pair.blobs.blobs()} == referenced


def test_a_delete_whose_document_delete_failed_stays_deleted_through_the_next_pass(
    pair: Pair,
) -> None:
    """Nothing resurrected: an entry removed (an admin retiring a bad compiler's
    NEFFs, an eviction) whose document delete failed is reported removed; the next
    pass must not serve it again."""
    index = started(pair.index, pair.spy, pair.blobs)
    backends = backends_over(index, pair.blobs, pair.tmp)
    removed = published(index, pair.blobs, 0)
    pair.spy.fail_delete = True
    assert index.delete_entry(NS, removed.key, removed.created_at) is True
    pair.spy.fail_delete = False
    assert pair.index.get_entry(NS, removed.key) is None

    done = backends.maintenance.run("test")
    assert done is not None
    assert pair.index.get_entry(NS, removed.key) is None


def test_fsck_repair_never_removes_a_blob_and_restores_lost_rows(pair: Pair) -> None:
    """Nothing lost: fsck reports an orphaned blob and leaves it to the collector
    (its one remover): not a problem, not repaired, not left; a lost row whose blobs
    are there is restored, one whose blob is gone has its document removed (the
    repairs counted by snake_case names); nothing is left to fix afterwards."""
    index = started(pair.index, pair.spy, pair.blobs)
    backends = backends_over(index, pair.blobs, pair.tmp)
    lost, broken, kept = (published(index, pair.blobs, n) for n in range(3))
    for stored in (lost, broken):
        assert pair.index.delete_entry(NS, stored.key, stored.created_at) is True
    gone = sorted(entry_digests(broken))[0]
    assert pair.blobs.delete(gone) is True
    orphan = blob(pair.blobs, b"an upload never published")

    report = fsck(backends, repair=True)
    assert report.orphaned == [orphan]
    assert sorted(report.unindexed) == sorted(f"{NS}/{e.key}" for e in (lost, broken))
    assert report.problems == 2  # the two unindexed documents; the orphan is none
    assert report.as_json()["problems"] == 2
    assert report.repaired == {"restored": 1, "unrestorable_removed": 1}
    assert report.left == 0
    assert pair.blobs.size(orphan) is not None
    assert pair.index.get_entry(NS, lost.key) == lost
    assert pair.index.get_entry(NS, kept.key) == kept
    assert pair.document(docs.entry_name(NS, broken.key)) is None

    again = fsck(backends)
    assert again.problems == 0
    assert orphan in again.orphaned
    before = {b.digest for b in pair.blobs.blobs()}
    fsck(backends, repair=True)
    assert {b.digest for b in pair.blobs.blobs()} == before
