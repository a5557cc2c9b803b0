"""Two replicas over one Redis index and one S3 bucket agree: what is published
through one is served by the other, and leases, quotas, reports and tokens are the
same whichever replica is asked.

One pair of replicas serves the whole module (``pair`` in conftest.py); each test
works in a namespace of its own. No background eviction here (interval 0): the quota
test runs its pass itself; tests/scaleout/test_one_evictor.py covers the background.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

import httpx
from scaleout.replicas import Pair, create_token
from support.served import digest, evictions, key, neff, publish, until

REPLICA_SETTINGS = {"NEFFCACHE_EVICTION_INTERVAL_SECONDS": "0"}
KIB = 1024
# The lease tests' bound on a wake-up that crosses replicas: a publish through A wakes
# no one on B, whose waiters look again every lease_recheck_seconds (default 2 s). A
# waiter that never looked again would answer when its wait ends, WAIT_S (the
# server's default lease_wait_max_seconds): the bound is far from both.
CROSS_REPLICA_WAKEUP_S = 30.0
WAIT_S = 55
ADDRESS = "neuronxcc-2.20.9961.0+0acef03a/MODULE_{n}+3cc9a3cb"


def manifest(name: str, files: dict[str, bytes], **fields: Any) -> dict[str, Any]:
    """A manifest for ``key(name)`` naming ``files``, with both kinds of alias."""
    body: dict[str, Any] = {
        "key": key(name),
        "direct_key": key(f"direct {name}"),
        "neuron_address": ADDRESS.format(n=int(key(name)[:12], 16)),
        "components": {"compiler_version": "2.20.9961.0+0acef03a", "target": "trn2"},
        "files": {f: {"digest": digest(data), "size": len(data)} for f, data in files.items()},
        "compile_seconds": 812.4,
    }
    body.update(fields)
    return body


def upload(client: httpx.Client, *blobs: bytes) -> None:
    for data in blobs:
        stored = client.put(f"/v1/blobs/{digest(data)}", content=data)
        assert stored.status_code in (200, 201), stored.text


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json() if response.content else None


# --- 1. publish through one, hit through the other ---------------------------------------


def test_publish_through_a_is_served_identically_by_b(pair: Pair) -> None:
    """Agree: after a publish through A (blobs uploaded, entry put), B knows the blobs
    (``missing`` lists none), serves the same entry (the same JSON document, created_at
    and writer included) by key, by direct key and by Neuron address, lists it, and
    serves each blob's exact bytes (whole and a range). B refuses a different manifest
    for the key (409: entries are immutable everywhere) and takes the same one again
    (200). A key nobody published is a miss (404, reason absent) on B."""
    _, writer = create_token(pair.a, pair.admin, "write", ["pub"], "writer")
    _, reader = create_token(pair.a, pair.admin, "read", ["pub"], "reader")
    files = {"model.neff": os.urandom(300 * KIB), "model.hlo_module.pb": os.urandom(40 * KIB)}
    body = manifest("published", files)
    digests = sorted(digest(data) for data in files.values())
    with pair.a.client(writer) as a, pair.b.client(reader) as b, pair.b.client(writer) as bw:
        assert sorted(ok(bw.post("/v1/blobs/missing", json={"digests": digests}))["missing"]) == (
            digests
        )
        upload(a, *files.values())
        assert ok(bw.post("/v1/blobs/missing", json={"digests": digests}))["missing"] == []
        ok(a.put(f"/v1/ns/pub/entries/{key('published')}", json=body), 201)

        from_a = a.get(f"/v1/ns/pub/entries/{key('published')}")
        from_b = b.get(f"/v1/ns/pub/entries/{key('published')}")
        assert from_b.status_code == 200, from_b.text
        assert from_b.json() == from_a.json()
        assert from_b.json()["files"] == body["files"]
        assert from_b.json()["namespace"] == "pub"
        for alias in (body["direct_key"], body["neuron_address"]):
            assert ok(b.get(f"/v1/ns/pub/aliases/{alias}")) == from_a.json()
        listed = ok(b.get("/v1/ns/pub/entries"))
        assert listed["entries"] == [from_a.json()]

        for data in files.values():
            got = b.get(f"/v1/blobs/{digest(data)}")
            assert got.status_code == 200
            assert got.content == data
            assert got.headers["etag"] == f'"{digest(data)}"'
            head = b.head(f"/v1/blobs/{digest(data)}")
            assert int(head.headers["content-length"]) == len(data)
            part = b.get(f"/v1/blobs/{digest(data)}", headers={"Range": "bytes=1000-1999"})
            assert part.status_code == 206
            assert part.content == data[1000:2000]

        assert bw.put(f"/v1/ns/pub/entries/{key('published')}", json=body).status_code == 200
        other = manifest("published", files, compile_seconds=1.0)
        assert bw.put(f"/v1/ns/pub/entries/{key('published')}", json=other).status_code == 409
        assert ok(a.get(f"/v1/ns/pub/entries/{key('published')}")) == from_a.json()

        missed = b.get(f"/v1/ns/pub/entries/{key('never published')}")
        assert missed.status_code == 404
        assert missed.json()["reason"] == "absent"
        assert b.get(f"/v1/ns/pub/aliases/{key('no alias')}").status_code == 404
        assert b.get(f"/v1/blobs/{digest(b'never uploaded')}").status_code == 404


# --- 2. leases ---------------------------------------------------------------------------


class Waiter(threading.Thread):
    """A long-polling ``POST .../leases/{name}`` with ``wait``, in the background."""

    def __init__(self, client: httpx.Client, path: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.client, self.path, self.body = client, path, body
        self.answer: httpx.Response | None = None
        self.error: BaseException | None = None
        self.answered_at = 0.0

    def run(self) -> None:
        try:
            self.answer = self.client.post(self.path, json=self.body)
        except BaseException as exc:  # reported by result()
            self.error = exc
        self.answered_at = time.monotonic()

    def result(self, timeout: float) -> httpx.Response:
        self.join(timeout)
        assert not self.is_alive(), f"the waiter had no answer within {timeout} s"
        assert self.error is None, repr(self.error)
        assert self.answer is not None
        return self.answer


def test_a_lease_taken_through_a_holds_on_b_and_its_release_wakes_b(pair: Pair) -> None:
    """Agree: a lease granted through A is held for an asker through B (202 naming A's
    holder, also with ``take: false``), B renews it by its id, and A's publish and
    release end the wait of a long-poll on B with ``done`` and the entry A serves, within
    a bound of B's recheck interval (a release wakes only its own replica's waiters).
    The other way round, a compile that fails through B (failure record, release with
    ``outcome=failed``) answers A's waiter ``failed`` with B's failure record."""
    _, token = create_token(pair.a, pair.admin, "write", ["leases"], "leases")
    data = neff("leased", 2000)
    with pair.a.client(token) as a, pair.b.client(token, timeout=90) as b:
        path = f"/v1/ns/leases/leases/{key('leased')}"
        granted = ok(a.post(path, json={"holder": "host-a pid 1"}), 201)
        assert granted["state"] == "granted"
        lease = granted["lease"]
        held = ok(b.post(path, json={"holder": "host-b pid 2"}), 202)
        assert (held["state"], held["holder"]) == ("held", "host-a pid 1")
        assert ok(b.post(path, json={"take": False}), 202)["holder"] == "host-a pid 1"
        assert ok(b.put(path, params={"lease": lease}))["lease"] == lease

        waiter = Waiter(b, path, {"holder": "host-b pid 2", "wait": WAIT_S})
        asked_at = time.monotonic()
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive(), "B answered at once: it did not wait for the holder"
        upload(a, data)
        entry = {
            "key": key("leased"),
            "files": {"model.neff": {"digest": digest(data), "size": 2000}},
        }
        ok(a.put(f"/v1/ns/leases/entries/{key('leased')}", json=entry), 201)
        released = a.delete(path, params={"lease": lease, "outcome": "done"})
        assert released.status_code == 204, released.text
        released_at = time.monotonic()
        answer = waiter.result(timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["state"] == "done"
        assert answer.json()["entry"] == ok(a.get(f"/v1/ns/leases/entries/{key('leased')}"))
        assert waiter.answered_at - asked_at >= 0.5
        assert waiter.answered_at - released_at < CROSS_REPLICA_WAKEUP_S

        # A failed compile through B, heard by a waiter on A.
        path = f"/v1/ns/leases/leases/{key('failing')}"
        lease = ok(b.post(path, json={"holder": "host-b pid 3"}), 201)["lease"]
        with pair.a.client(token, timeout=90) as a_waiting:
            waiter = Waiter(a_waiting, path, {"holder": "host-a pid 4", "wait": WAIT_S})
            waiter.start()
            time.sleep(0.5)
            assert waiter.is_alive()
            failure = {"compiler_version": "2.20.9961.0+0acef03a", "exit_code": 70, "log": "boom"}
            ok(b.put(f"/v1/ns/leases/failures/{key('failing')}", json=failure), 201)
            assert b.delete(path, params={"lease": lease, "outcome": "failed"}).status_code == 204
            released_at = time.monotonic()
            answer = waiter.result(timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["state"] == "failed"
        assert answer.json()["holder"] == "host-b pid 3"
        assert answer.json()["failure"]["log"] == "boom"
        assert waiter.answered_at - released_at < CROSS_REPLICA_WAKEUP_S


# --- 3. quotas ---------------------------------------------------------------------------


def test_a_quota_set_through_a_is_enforced_by_b_over_entries_of_both(pair: Pair) -> None:
    """Agree: a namespace policy made through A's admin API (quota 3500 bytes) refuses,
    through B, an entry larger than the quota (413, nothing stored); the entries
    published through both (4 x 1000 bytes, alternately) count toward the same usage
    on both, so a dry run through either plans the same one removal (4000 -> 3000
    bytes, under the 90 % low-water mark); a pass removes it once (one audit record) and
    only the replica that ran it may run another meanwhile (409 naming it on the
    other). A quota lowered through B (2000) is then planned by A: 2 more to go."""
    with pair.a.client(pair.admin) as a, pair.b.client(pair.admin) as b:
        ok(a.post("/v1/admin/namespaces/quota", json={"quota_bytes": 3500}), 201)
        big = neff("too big", 4000)
        upload(b, big)
        too_big = {
            "key": key("too big"),
            "files": {"model.neff": {"digest": digest(big), "size": 4000}},
        }
        refused = b.put(f"/v1/ns/quota/entries/{key('too big')}", json=too_big)
        assert refused.status_code == 413, refused.text
        assert a.get(f"/v1/ns/quota/entries/{key('too big')}").status_code == 404

        for i, client in enumerate((a, b, a, b)):
            done = publish(client, "quota", key(f"quota {i}"), neff(f"quota {i}", 1000))
            assert done.status_code == 201, done.text
        shown = [ok(c.get("/v1/admin/namespaces/quota")) for c in (a, b)]
        assert shown[0]["usage"] == shown[1]["usage"]
        assert (shown[0]["usage"]["entries"], shown[0]["usage"]["bytes"]) == (4, 4000)
        assert shown[1]["quota_bytes"] == 3500

        plans = [ok(c.post("/v1/admin/evict", json={"namespaces": ["quota"]})) for c in (a, b)]
        assert plans[0] == plans[1]
        (plan,) = plans[0]["namespaces"]
        assert (plan["bytes"], plan["bytes_after"]) == (4000, 3000), plan
        (victim,) = plans[0]["entries"]
        assert victim["reason"] == "quota"

        swept = ok(a.post("/v1/admin/evict", json={"dry_run": False}))
        assert [e["key"] for e in swept["removed"]["entries"]] == [victim["key"]]
        refused = b.post("/v1/admin/evict", json={"dry_run": False})
        assert refused.status_code == 409, refused.text
        assert f"pid {pair.a.pid}" in refused.json()["detail"]
        records = [r for r in evictions(b) if r["namespace"] == "quota"]
        assert [r["target"] for r in records] == [victim["key"]]
        left = ok(b.get("/v1/ns/quota/entries"))["entries"]
        assert len(left) == 3
        assert sum(e["files"]["model.neff"]["size"] for e in left) == 3000

        ok(b.patch("/v1/admin/namespaces/quota", json={"quota_bytes": 2000}))

        def planned_by_a() -> bool:
            found = ok(a.post("/v1/admin/evict", json={"namespaces": ["quota"]}))
            return len(found["entries"]) == 2

        until(planned_by_a, 10, "A did not apply the quota set through B")


# --- 5. reports --------------------------------------------------------------------------


def test_cost_reports_agree_over_events_posted_to_both(pair: Pair) -> None:
    """Agree: telemetry events posted through A and through B land in one store, so
    ``GET /v1/reports/cost`` over the same window answers the same report from both
    replicas (every field but ``generated_at``, in JSON and in CSV), and that report
    counts the events of both (4 lookups, 2 hits) and the entry published through B."""
    _, reader = create_token(pair.a, pair.admin, "read", ["reports"], "reporter")
    common = {"kind": "graph", "namespace": "reports", "model": "llama", "job_id": "run-1"}
    through_a = [
        {**common, "instance_type": "trn1.32xlarge", "result": "hit", "source": "server"}
        | {"saved_seconds": 7200.0, "key": key("warm")},
        {**common, "instance_type": "trn1.32xlarge", "result": "miss", "source": "compiler"}
        | {"compile_seconds": 3600.0, "outcome": "ok", "reason": "compiler-changed"}
        | {"key": key("upgraded")},
    ]
    through_b = [
        {**common, "instance_type": "trn1.2xlarge", "result": "hit", "source": "l1"}
        | {"saved_seconds": 600.0, "key": key("warm"), "job_id": "run-2"},
        {**common, "instance_type": "trn1.2xlarge", "result": "miss", "source": "compiler"}
        | {"compile_seconds": 1800.0, "outcome": "failed", "reason": "new-graph"}
        | {"key": key("broken"), "job_id": "run-2"},
    ]
    since = int(time.time()) - 60
    with pair.a.client(reader) as a, pair.b.client(reader) as b:
        assert ok(a.post("/v1/events", json={"events": through_a}), 202)["accepted"] == 2
        assert ok(b.post("/v1/events", json={"events": through_b}), 202)["accepted"] == 2
        with pair.b.client(pair.admin) as admin:
            assert publish(admin, "reports", key("stored"), neff("stored", 500)).status_code == 201
        params = {
            "namespace": "reports",
            "since": str(since),
            "until": str(since + 3600),
            "by": "namespace,model,day,job",
            "top": "10",
        }
        reports = [ok(c.get("/v1/reports/cost", params=params)) for c in (a, b)]
        for report in reports:
            report.pop("generated_at")
        assert reports[0] == reports[1]
        totals = reports[0]["totals"]
        assert (totals["lookups"], totals["hits"], totals["misses"]) == (4, 2, 2)
        assert reports[0]["storage"][0]["entries"] == 1
        csvs = [c.get("/v1/reports/cost", params={**params, "format": "csv"}) for c in (a, b)]
        assert csvs[0].status_code == 200, csvs[0].text
        assert csvs[0].text == csvs[1].text


# --- 6. tokens ---------------------------------------------------------------------------


def test_tokens_made_or_revoked_through_one_replica_hold_on_the_other(pair: Pair) -> None:
    """Agree: a token created through A works on B at once (write: upload and publish;
    read: lookups) and is refused there for a namespace it does not cover (403); both
    replicas list the same tokens; one revoked through B is refused by A (401) on the
    next request: tokens are read from the index on every request, with no cache to
    wait out. Anonymous requests are refused by both (the bootstrap token exists)."""
    writer_id, writer = create_token(pair.a, pair.admin, "write", ["tok"], "tok writer")
    reader_id, reader = create_token(pair.b, pair.admin, "read", ["tok"], "tok reader")
    with pair.b.client(writer) as b, pair.a.client(reader) as a:
        assert publish(b, "tok", key("token"), neff("token", 300)).status_code == 201
        assert a.get(f"/v1/ns/tok/entries/{key('token')}").status_code == 200
        assert b.get("/v1/ns/other/entries").status_code == 403
        assert a.put(f"/v1/blobs/{digest(b'x')}", content=b"x").status_code == 403
    with pair.a.client(pair.admin) as admin_a, pair.b.client(pair.admin) as admin_b:
        listed = [ok(c.get("/v1/admin/tokens")) for c in (admin_a, admin_b)]
        assert listed[0] == listed[1]
        assert {writer_id, reader_id} <= {t["token_id"] for t in listed[0]["tokens"]}
        for token_id in (writer_id, reader_id):
            assert admin_b.delete(f"/v1/admin/tokens/{token_id}").status_code == 204
    with pair.a.client(writer) as a, pair.a.client(reader) as a_read:
        assert a.put(f"/v1/blobs/{digest(b'y')}", content=b"y").status_code == 401
        assert a_read.get(f"/v1/ns/tok/entries/{key('token')}").status_code == 401
    for replica in (pair.a, pair.b):
        with replica.client() as anonymous:
            assert anonymous.get(f"/v1/ns/tok/entries/{key('token')}").status_code == 401


def test_each_replica_runs_as_its_own_process(pair: Pair) -> None:
    """The premise of the module: two live processes, each ready, on its own port."""
    assert pair.a.pid != pair.b.pid
    for replica in (pair.a, pair.b):
        assert replica.alive()
        with replica.client() as http:
            assert ok(http.get("/readyz"))["status"] == "ready"
    assert re.fullmatch(r"s3://neffcache-scaleout-[0-9a-f]+/prefix", pair.blob_url)
    assert pair.index_url.startswith("redis://")
