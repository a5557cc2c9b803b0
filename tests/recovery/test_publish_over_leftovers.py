"""A publish over a document left without its row, through the documented catalogs
``DurableIndex`` writes entries through (recovery/documented.py): a publish that finds
such a document takes it for an acknowledged entry the index lost and puts it back. It
must not put back what reindex and fsck refuse to (recovery/reindex.py): a row removed
on purpose whose document delete failed (a tombstone says so: ``finish_removal``), nor
an entry whose writer the namespace no longer accepts (``restore_entry``'s
``refused``)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import redis
from support.recovery import NS, commit, publish

from neffcache.server.errors import StoreError
from neffcache.server.index import Entry, PutResult, Record, Token
from neffcache.server.manifest import canonical_json
from neffcache.server.namespaces import POLICY
from neffcache.server.recovery import documents as docs
from neffcache.server.recovery.documented import TOMBSTONE
from neffcache.server.recovery.durable import DurableIndex


@pytest.fixture
def durable(documented_index: DurableIndex) -> DurableIndex:
    return documented_index


def rebuilt(durable: DurableIndex, of: Entry, writer: str = "tok1") -> Entry:
    """Another build of ``of``'s key: other blobs (committed), so another manifest."""
    blobs = durable.blobs
    assert blobs is not None
    files = {}
    for part in ("model.neff", "model.hlo"):
        data = f"{part} rebuilt".encode() * 50
        files[part] = {"digest": commit(blobs, data), "size": len(data)}
    manifest = canonical_json({"key": of.key, "files": files, "compile_seconds": 60.0})
    return Entry(NS, of.key, manifest, time.time(), writer)


def test_a_publish_after_a_removal_whose_document_stayed_is_not_refused_by_it(
    durable: DurableIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a user loses: an entry removed on purpose (evicted, or taken back by the
    publish path because its writer may not write to the namespace) whose document
    delete failed comes back on the next publish of its key: the new build is
    refused (409 CONFLICT) and clients are served the removed entry again. The
    tombstone written for exactly this case says the document is a removal's
    leftover, so the publish must replace it (and finish the removal), not restore
    it."""
    blobs = durable.blobs
    assert blobs is not None
    removed = publish(durable, blobs, "removed on purpose", created_at=1_712_000_000.5)

    def cannot_delete(name: str) -> bool:
        raise StoreError(f"injected: cannot delete document {name}")

    monkeypatch.setattr(durable.store, "delete_document", cannot_delete)
    assert durable.delete_entry(NS, removed.key, removed.created_at) is True
    monkeypatch.undo()
    assert durable.get_entry(NS, removed.key) is None
    tomb = durable.get_record(TOMBSTONE, NS, removed.key)
    assert tomb is not None
    assert tomb.value == repr(removed.created_at)

    later = rebuilt(durable, removed)
    assert later.manifest != removed.manifest
    assert durable.put_entry(later, ()) is PutResult.CREATED
    assert durable.get_entry(NS, later.key) == later
    data = durable.store.get_document(docs.entry_name(NS, later.key))
    assert data == docs.entry_document(later)


def test_a_trusted_publish_never_puts_back_an_untrusted_leftover(durable: DurableIndex) -> None:
    """What a user loses: in a namespace that takes only trusted writers, an untrusted
    writer's entry whose document outlived its take-back (its tombstone lost with a
    wiped index; reindex refused it and left the document) is put back by the next
    trusted publish of its key: the trusted build is refused (409 CONFLICT) and
    clients are served the untrusted writer's binaries, which the namespace's rule
    exists to keep out. reindex and fsck refuse that document; the publish must too,
    and store the trusted build."""
    blobs = durable.blobs
    assert blobs is not None
    rule = Record(POLICY, NS, "", canonical_json({"trusted_writers_only": True}))
    assert durable.put_record(rule)
    trusted = Token("ci", "12" * 32, "write", (NS,), "ci", 1_712_000_000.5, trusted=True)
    durable.put_token(trusted)
    leftover = publish(durable.inner, blobs, "untrusted leftover", writer="untrusted-1")
    durable.inner.delete_entry(NS, leftover.key, leftover.created_at)  # the take-back
    name = docs.entry_name(NS, leftover.key)
    durable.store.put_document(name, docs.entry_document(leftover))  # its delete failed

    later = rebuilt(durable, leftover, writer=trusted.token_id)
    assert durable.put_entry(later, ()) is PutResult.CREATED
    assert durable.get_entry(NS, later.key) == later
    assert durable.store.get_document(name) == docs.entry_document(later)


# --- Redis tokens of an earlier layout ------------------------------------------------


def test_a_redis_token_of_an_earlier_layout_is_moved_before_its_revocation_is_documented(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing lost: the first call a fresh server makes through the durable index may
    be a revocation of a token an earlier server stored in the keys of before; the
    wrapper's tokens role waits for the move (``tokens_ready``) like the index's own,
    so the token is found, revoked, and its document says so."""
    from neffcache.server.blobs.memory import MemoryBlobStore
    from neffcache.server.index.redis import RedisIndex

    old = Token("t-old", "34" * 32, "write", (NS,), "ci", 1_712_000_000.5)
    with redis.Redis.from_url(redis_server, decode_responses=True) as client:
        client.flushdb()
        fields = {"secret_hash": old.secret_hash, "scope": old.scope, "name": old.name}
        fields |= {"namespaces": json.dumps(list(old.namespaces))}
        fields |= {"created_at": repr(old.created_at), "revoked": "0", "trusted": "0"}
        client.hset(f"neffcache:token:{old.token_id}", mapping=fields)
        client.set(f"neffcache:token-hash:{old.secret_hash}", old.token_id)
        client.zadd("neffcache:tokens", {old.token_id: old.created_at})
    index, store = RedisIndex.from_url(redis_server), MemoryBlobStore()
    try:
        durable = DurableIndex(index, store)
        assert durable.revoke_token(old.token_id) is True
        data = store.get_document(docs.token_name(old.token_id))
        assert data is not None
        assert docs.token_from(data) == dataclasses.replace(old, revoked=True)
        with pytest.raises(StoreError):
            durable.put_token(dataclasses.replace(old, secret_hash="56" * 32))
    finally:
        index.close()
        store.close()
