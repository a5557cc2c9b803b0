"""What a reindex (or fsck --repair) brings back, or loses.

Each test's docstring says the failure it guards against and what prevents it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from support.recovery import BOOT, NS, publish, service_backends

from neffcache.server.app import create_app
from neffcache.server.auth import hash_secret
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.errors import StoreError
from neffcache.server.eviction.pins import PIN
from neffcache.server.index import Token, Touch
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.recovery import documents as docs
from neffcache.server.recovery.durable import DurableIndex, mark_complete
from neffcache.server.recovery.fsck import fsck
from neffcache.server.recovery.reindex import reindex
from neffcache.server.services import durable
from neffcache.server.settings import ServerSettings

DAY = 86400.0


def test_a_reindexed_entry_in_daily_use_is_not_expired_by_the_next_pass(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: expiry is by last access (plan.py: "unused ... for longer than the
    TTL"), and reindex restores every entry with ``last_access = created_at``. So the
    first pass after a reindex (which the leader runs in the same tick) expires every
    entry published more than a TTL ago (30 days by default), however hot, and
    DurableIndex deletes its document: after an index loss, the oldest and most used
    part of the cache is gone for good. docs/operations.md presents "expiry counts
    from the first publish" as a feature.

    Fix: restored entries count as used at the reindex (``touch_entries`` with
    ``at=now, hits=0`` after a CREATED restore), or documents carry a coarse
    last-access time written now and then."""
    blobs, index = MemoryBlobStore(), MemoryIndex()
    to_close.append(blobs)
    wrapped = durable(index, blobs)
    now = time.time()
    hot = publish(wrapped, blobs, "in use every day", created_at=now - 40 * DAY)
    index.touch_entries([Touch(NS, hot.key, now - 60, 500)])
    ttl = {"default_ttl_seconds": 30 * DAY}
    assert [
        v
        for p in service_backends(wrapped, blobs, tmp_path, **ttl).evictor.plan()
        for v in p.victims
    ] == []

    wiped = MemoryIndex()  # Redis restarted without persistence
    assert reindex(wiped, blobs, blobs).restored == 1
    after = service_backends(DurableIndex(wiped, blobs), blobs, tmp_path, **ttl)
    victims = [(v.stats.key, v.reason) for p in after.evictor.plan() for v in p.victims]
    assert victims == [], f"a reindexed entry in daily use would be removed: {victims}"


def test_a_revoked_bootstrap_token_stays_revoked_after_a_wipe_and_a_restart(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: a replica that starts on a wiped index runs ``ensure_bootstrap_token``
    before any reindex (app.py: ``durable`` then the bootstrap). The token's hash is
    not in the empty index, so it is created again, not revoked, through the
    DurableIndex, which overwrites its document (``revoked: true``) with
    ``revoked: false``. The reindex then keeps it. An admin token revoked because it
    leaked is valid again, on every namespace, for good. Replicas crash-loop while
    Redis is down (create_app needs the index), so the first start after Redis comes
    back empty is exactly this.

    Fix: never un-revoke through a document: ``DurableIndex.put_token`` (or
    ``ensure_bootstrap_token``) reads the token's document first and keeps
    ``revoked``; or restore tokens from documents before the bootstrap at start-up."""
    blobs = MemoryBlobStore()
    to_close.append(blobs)
    settings = ServerSettings(
        data_dir=tmp_path, bootstrap_admin_token=BOOT, eviction_interval_seconds=0
    )
    with TestClient(create_app(settings, blob_store=blobs, index=MemoryIndex())) as http:
        http.headers["Authorization"] = f"Bearer {BOOT}"
        other = http.post("/v1/admin/tokens", json={"scope": "admin", "namespaces": ["*"]})
        boot_id = next(
            t["token_id"]
            for t in http.get("/v1/admin/tokens").json()["tokens"]
            if t["name"] == "bootstrap"
        )
        http.headers["Authorization"] = f"Bearer {other.json()['token']}"
        assert http.delete(f"/v1/admin/tokens/{boot_id}").status_code == 204

    wiped = MemoryIndex()  # Redis restarted empty; a replica starts with the same settings
    with TestClient(create_app(settings, blob_store=blobs, index=wiped)):
        reindex(wiped, blobs, blobs)  # the leader's first tick, or the CLI
        token = wiped.token_by_hash(hash_secret(BOOT))
    assert token is not None
    assert token.revoked, "the revoked bootstrap admin token is valid again after a reindex"


def test_fsck_repair_never_un_revokes_a_token(tmp_path: Path, to_close: list[Any]) -> None:
    """Was broken: fsck compares token documents with the index and, on --repair, writes
    the index's row over the document (``sync_token``). After an index restored from
    a backup taken before a revocation (or a Redis snapshot), the index says "not
    revoked" and the document "revoked": fsck --repair, which docs/operations.md says
    to run after a restore, makes the revocation lost in both places. (``reindex``
    gets this right: it revokes when the document says so.)

    Fix: in fsck, a token is revoked if either side says so: revoke in the index,
    never write ``revoked: false`` over ``revoked: true``."""
    blobs = MemoryBlobStore()
    to_close.append(blobs)
    token = Token("tok-leaked", hash_secret("nfc_leaked"), "admin", ("*",), "ci", 1.7e9)
    live = DurableIndex(MemoryIndex(), blobs)
    live.put_token(token)
    assert live.revoke_token(token.token_id)

    from_backup = MemoryIndex()  # the index as it was before the revocation
    from_backup.put_token(token)
    mark_complete(from_backup, "restored from a backup")
    fsck(service_backends(DurableIndex(from_backup, blobs), blobs, tmp_path), repair=True)

    data = blobs.get_document(docs.token_name(token.token_id))
    assert data is not None
    assert docs.token_from(data).revoked, "fsck --repair wrote the revoked token back as valid"


class FlakyDeletes(MemoryBlobStore):
    """A store whose document deletes fail while ``failing`` (S3 answering 503)."""

    failing = False

    def delete_document(self, name: str) -> bool:
        if self.failing:
            raise StoreError(f"injected: cannot delete document {name}")
        return super().delete_document(name)


def test_a_removed_pin_whose_document_delete_failed_is_found_by_fsck(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: removing a pin deletes the row, then the document. When the document
    delete fails the admin gets 503, and the retry 404 (the row is gone), so the
    document stays for good. fsck only looks at token and record documents of rows
    the index holds (``_configuration``), so it reports the cluster clean, and the
    next reindex brings the removed pin back (the same holds for a namespace policy
    removed by ``_recount``).

    Fix: for removals write the durable side first (delete the document, then the
    row), so a failure leaves the row and a retry works; and have fsck list
    ``tokens/`` and ``records/`` and report documents without a row."""
    blobs = FlakyDeletes()
    to_close.append(blobs)
    settings = ServerSettings(
        data_dir=tmp_path, bootstrap_admin_token=BOOT, eviction_interval_seconds=0
    )
    app = create_app(settings, blob_store=blobs, index=MemoryIndex())
    pin = {"kind": "model", "value": "llama", "reason": "release"}
    where = f"/v1/admin/namespaces/{NS}/pins"
    with TestClient(app) as http:
        http.headers["Authorization"] = f"Bearer {BOOT}"
        assert http.post(f"/v1/admin/namespaces/{NS}", json={}).status_code == 201
        assert http.put(where, json=pin).status_code == 201
        blobs.failing = True
        assert http.delete(where, params={"kind": "model", "value": "llama"}).status_code == 503
        blobs.failing = False
        assert http.delete(where, params={"kind": "model", "value": "llama"}).status_code == 404
        report = fsck(app.state.backends)
        assert blobs.get_document(docs.record_name(PIN, NS, "model:llama")) is not None
        assert report.problems > 0, "fsck reports a clean cache; a reindex would bring it back"
        # The tombstone the failed removal left tells fsck the pin was removed.
        fsck(app.state.backends, repair=True)
        assert blobs.get_document(docs.record_name(PIN, NS, "model:llama")) is None
        assert http.get(where).json()["pins"] == []
        assert fsck(app.state.backends).problems == 0


def test_fsck_restores_a_pin_whose_row_the_index_lost(tmp_path: Path, to_close: list[Any]) -> None:
    """Nothing lost: a pin whose row is gone without a tombstone (an index restored
    from a backup older than the pin) is put back by fsck --repair, not taken for a
    removed one."""
    blobs = FlakyDeletes()
    to_close.append(blobs)
    settings = ServerSettings(
        data_dir=tmp_path, bootstrap_admin_token=BOOT, eviction_interval_seconds=0
    )
    index = MemoryIndex()
    app = create_app(settings, blob_store=blobs, index=index)
    pin = {"kind": "model", "value": "llama", "reason": "release"}
    where = f"/v1/admin/namespaces/{NS}/pins"
    with TestClient(app) as http:
        http.headers["Authorization"] = f"Bearer {BOOT}"
        assert http.post(f"/v1/admin/namespaces/{NS}", json={}).status_code == 201
        assert http.put(where, json=pin).status_code == 201
        assert index.delete_record(PIN, NS, "model:llama")  # lost, behind the server's back
        assert http.get(where).json()["pins"] == []
        report = fsck(app.state.backends, repair=True)
        assert report.configuration == [docs.record_name(PIN, NS, "model:llama")]
        assert [p["value"] for p in http.get(where).json()["pins"]] == ["llama"]


def test_fsck_never_restores_an_untrusted_entry_into_a_trusted_writers_only_namespace(
    tmp_path: Path, to_close: list[Any]
) -> None:
    """Was broken: a publish whose second ``check_writer`` fails (the namespace turned
    trusted-writers-only meanwhile, api/entries.py ``_publish``) takes its entry
    back, but its document was already written (``DurableIndex.put_entry``), and a
    failed document delete only logs. fsck --repair then finds an "unindexed
    document" whose blobs are there and restores it (``restore_entry`` knows no
    policy); a reindex after an index loss does the same. An untrusted writer's
    entry is served from a namespace that vouches for its writers.

    Fix: restores check the namespace's policy against the entry's ``writer`` (a
    trusted token id) and drop the document otherwise; and write an entry's document
    only once ``_publish`` has settled (after the second check), or delete the
    document before the row on a take-back."""
    blobs = FlakyDeletes()
    to_close.append(blobs)
    settings = ServerSettings(
        data_dir=tmp_path, bootstrap_admin_token=BOOT, eviction_interval_seconds=0
    )
    app = create_app(settings, blob_store=blobs, index=MemoryIndex())
    with TestClient(app) as http:
        http.headers["Authorization"] = f"Bearer {BOOT}"
        made = http.post("/v1/admin/tokens", json={"scope": "write", "namespaces": [NS]})
        untrusted = made.json()["token_id"]
        rule = {"trusted_writers_only": True}
        assert http.post(f"/v1/admin/namespaces/{NS}", json=rule).status_code == 201
        # What _publish leaves when its second check fails while S3 refuses a delete:
        index = app.state.backends.index
        entry = publish(index, blobs, "an untrusted compile", writer=untrusted)
        blobs.failing = True
        assert index.delete_entry(NS, entry.key, entry.created_at)  # the take-back
        blobs.failing = False
        assert http.get(f"/v1/ns/{NS}/entries/{entry.key}").status_code == 404

        fsck(app.state.backends, repair=True)
        answer = http.get(f"/v1/ns/{NS}/entries/{entry.key}")
    assert answer.status_code == 404, "an untrusted entry is served from a trusted-only namespace"
