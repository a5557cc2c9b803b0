"""Background work runs on one replica at a time, over Redis and S3: the evictor
lease (``_system``/``evictor`` in the index, see
server/neffcache/server/eviction/maintenance.py) has one holder while both replicas
live, and passes to the other when its holder dies or stops.

tests/eviction/test_eviction_serve.py has the same check over a filesystem store;
this one adds the S3 store, watches the lease itself, the replicas' metrics, and a
graceful stop (``SIGTERM`` releases the lease) besides a ``SIGKILL``.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from scaleout.replicas import Pair, Replica
from support.served import actor_pid, evictions, key, neff, publish, until

from neffcache.server.eviction.maintenance import LEADER, SYSTEM
from neffcache.server.index import Index, open_index

# A pass every second on whichever replica leads; the lease lives max(5, 3 ticks) = 5 s
# without renewal, so a killed leader is replaced within about 6 s. Blobs nothing
# references are collected 2 s after a pass first finds them so (each publish here puts
# its entry right after its blob, well within that).
REPLICA_SETTINGS = {
    "NEFFCACHE_EVICTION_INTERVAL_SECONDS": "1",
    "NEFFCACHE_BLOB_GRACE_SECONDS": "2",
}
LEASE_S = 5.0
TAKEOVER_BOUND_S = 20.0  # generous: a loaded machine may delay ticks


def holder_pid(index: Index) -> int | None:
    """The pid in the evictor lease's holder (``evictor@HOST pid N``), or None."""
    lease = index.get_lease(SYSTEM, LEADER, time.time())
    if lease is None:
        return None
    found = re.search(r" pid (\d+)$", lease.holder)
    assert found is not None, lease.holder
    return int(found[1])


def counted(replica: Replica, metric: str) -> float:
    """This replica's own count (``/metrics``), summed over labels."""
    with replica.client() as http:
        text = http.get("/metrics").text
    found = re.findall(rf"^{metric}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def evicted_by(replica: Replica) -> float:
    return counted(replica, "neffcache_evictions_total")


def collected_by(replica: Replica) -> float:
    return counted(replica, "neffcache_blobs_collected_total")


def quota_evictions(client: httpx.Client) -> list[str]:
    return [r["target"] for r in evictions(client) if r["namespace"] == "q"]


@pytest.fixture
def index(pair: Pair) -> Iterator[Index]:
    """The replicas' index, read directly: who holds the evictor lease."""
    opened = open_index(pair.index_url)
    yield opened
    opened.close()


def test_one_replica_evicts_at_a_time_and_the_other_takes_over(pair: Pair, index: Index) -> None:
    """Agree: while both replicas live, the evictor lease has one holder (sampled for
    2 s: always the same pid), that replica alone evicts (every audit record's actor is
    it; only its metrics count evictions and collected blobs; the other's pass is
    refused with 409 naming it), and each entry over the quota is evicted exactly once
    (no target twice in the audit log) although both run the loop every second. When
    the holder is killed (SIGKILL: no release) the other holds the lease within the
    lease's life, evicts what is then over the quota and collects those entries'
    blobs; restarted, the killed one stays a follower, and when the leader is stopped
    (SIGTERM: released) it takes over in turn."""
    by_pid = {pair.a.pid: pair.a, pair.b.pid: pair.b}
    with pair.a.client(pair.admin) as a, pair.b.client(pair.admin) as b:
        made = a.post("/v1/admin/namespaces/q", json={"quota_bytes": 3500})
        assert made.status_code == 201, made.text
        for i, client in enumerate((a, b, a, b)):
            done = publish(client, "q", key(i), neff(f"replica {i}", 1000), compile_seconds=60)
            assert done.status_code == 201, done.text
        until(lambda: len(quota_evictions(a)) >= 1, 20, "the quota was not applied")

        samples = []
        for _ in range(20):
            samples.append(holder_pid(index))
            time.sleep(0.1)
        assert len(set(samples)) == 1, samples
        leader_pid = samples[0]
        assert leader_pid in by_pid, (samples, by_pid)
        leader = by_pid[leader_pid]
        follower = pair.b if leader is pair.a else pair.a
        records = evictions(a)
        assert len(quota_evictions(a)) == 1, records
        assert {actor_pid(r) for r in records} == {leader_pid}
        assert (evicted_by(leader), evicted_by(follower)) == (1.0, 0.0)
        until(lambda: collected_by(leader) >= 1, 20, "the evicted entry's blob stayed")
        assert (collected_by(leader), collected_by(follower)) == (1.0, 0.0)
        with follower.client(pair.admin) as f:
            refused = f.post("/v1/admin/evict", json={"dry_run": False})
            assert refused.status_code == 409, refused.text
            assert f"pid {leader_pid}" in refused.json()["detail"]

    # SIGKILL: the lease is not released; it runs out.
    assert leader.kill() == -9
    killed_at = time.monotonic()
    with follower.client(pair.admin) as f:
        for i in range(4, 6):
            done = publish(f, "q", key(i), neff(f"replica {i}", 1000), compile_seconds=60)
            assert done.status_code == 201, done.text
        until(
            lambda: holder_pid(index) == follower.pid,
            TAKEOVER_BOUND_S,
            "the follower did not take the lease from the killed leader",
        )
        took = time.monotonic() - killed_at
        until(lambda: len(quota_evictions(f)) >= 3, 20, "the new leader did not evict")
        assert evicted_by(follower) == 2.0
        until(lambda: collected_by(follower) >= 2, 20, "the new leader collected no blob")
        assert collected_by(follower) == 2.0

    # Restarted, the old leader follows; SIGTERM on the new leader hands the lease over.
    leader.start()  # again, on its port
    time.sleep(2.5)  # a few ticks of both loops
    assert holder_pid(index) == follower.pid
    # uvicorn re-raises the SIGTERM once it has shut down: -15 is a clean exit too.
    assert follower.stop() in (0, -signal.SIGTERM), follower.tail()
    assert "Application shutdown complete" in follower.tail()
    stopped_at = time.monotonic()
    until(lambda: holder_pid(index) == leader.pid, TAKEOVER_BOUND_S, "no takeover after SIGTERM")
    handed = time.monotonic() - stopped_at
    with leader.client(pair.admin) as lead:
        targets = quota_evictions(lead)
        actors = {actor_pid(r) for r in evictions(lead)}
        left = lead.get("/v1/ns/q/entries").json()["entries"]
    counted = Counter(targets)
    assert len(targets) == 3
    assert max(counted.values()) == 1, counted
    assert actors == {leader_pid, follower.pid}
    assert sum(e["files"]["model.neff"]["size"] for e in left) == 3000
    # Printed with -s: how long each handover took here.
    print(f"takeover after SIGKILL {took:.1f} s (lease {LEASE_S} s), after SIGTERM {handed:.1f} s")
