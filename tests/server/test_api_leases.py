"""Compile leases over HTTP (docs/protocol.md, "Compile leases"): grant, hold, long-poll
wake-ups, take-over after expiry, failure notices, renew and release, scopes.

Waits use generous bounds (a waiter told to wait a minute must answer within half of
it, where a woken one takes milliseconds): they check that an event woke it, not how
fast this machine is."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.api import (
    ADDRESS,
    KEY,
    LEASES,
    admin_token,
    ask,
    make_client,
    make_token,
    publish,
)
from support.backends import backends, open_index_of

from neffcache.server.index import Index, Lease, open_index
from neffcache.server.index.memory import MemoryIndex

# A waiter told to wait this long that answers well before it was woken by an event.
LONG = 60.0


class CountingIndex(MemoryIndex):
    """Counts lease reads: a waiter that polls the index would show up here."""

    def __init__(self) -> None:
        super().__init__()
        self.lease_reads = 0

    def get_lease(self, namespace: str, name: str, now: float) -> Lease | None:
        self.lease_reads += 1
        return super().get_lease(namespace, name, now)


@pytest.fixture(params=backends("memory", "sqlite", "redis"))
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    # In memory, an index that counts its lease reads.
    opened = (
        CountingIndex()
        if request.param == "memory"
        else open_index_of(request.param, request, tmp_path)
    )
    yield opened
    opened.close()


@pytest.fixture
def client(index: Index, tmp_path: Path) -> Iterator[TestClient]:
    with make_client(index, tmp_path) as test_client:
        yield test_client


def in_background(fn: Any, *args: Any, **kwargs: Any) -> tuple[Future[Any], ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1)
    return pool.submit(fn, *args, **kwargs), pool


def test_the_first_asker_holds_and_the_next_is_told_who(client: TestClient) -> None:
    granted = ask(client, holder="node-1 pid 7", expected_seconds=600)
    assert granted["lease"]
    assert len(granted["lease"]) == 32
    assert granted["ttl"] == 30.0
    held = ask(client, holder="node-2 pid 9")
    assert held["holder"] == "node-1 pid 7"
    assert held["expected_seconds"] == 600
    assert 0 < held["expires_in"] <= 30
    assert held["held_for"] >= 0


def test_an_existing_entry_is_the_answer_by_key_or_address(client: TestClient) -> None:
    body = publish(client, neuron_address=ADDRESS)
    by_key = ask(client)
    assert by_key["state"] == "done"
    assert by_key["entry"]["files"] == body["files"]
    assert by_key["entry"]["namespace"] == "team-a"
    assert ask(client, ADDRESS)["entry"]["key"] == KEY


def test_a_waiter_is_woken_by_the_publish(client: TestClient, index: Index) -> None:
    ask(client)
    waiting, pool = in_background(ask, client, wait=LONG)
    # The holder's look and the waiter's first: then it waits (however late it began).
    deadline = time.monotonic() + LONG
    while getattr(index, "lease_reads", 2) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    reads_while_waiting = getattr(index, "lease_reads", 0)
    time.sleep(1.0)
    # Asleep, not polling: no index read during that second.
    assert getattr(index, "lease_reads", 0) == reads_while_waiting
    published_at = time.monotonic()
    publish(client)
    answer = waiting.result(timeout=LONG)
    assert answer["state"] == "done"
    assert time.monotonic() - published_at < LONG / 2
    pool.shutdown()


def test_a_waiter_on_an_address_is_woken_by_the_publish_of_its_entry(client: TestClient) -> None:
    ask(client, ADDRESS)
    waiting, pool = in_background(ask, client, ADDRESS, wait=LONG)
    time.sleep(0.5)
    publish(client, neuron_address=ADDRESS)
    assert waiting.result(timeout=LONG)["entry"]["key"] == KEY
    pool.shutdown()


def test_a_waiter_takes_over_when_the_holder_stops_renewing(index: Index, tmp_path: Path) -> None:
    with make_client(index, tmp_path, lease_ttl_seconds=1.0) as client:
        first = ask(client)
        started = time.monotonic()
        answer = ask(client, wait=LONG)
        assert answer["state"] == "granted"
        assert answer["lease"] != first["lease"]
        assert 0.9 <= time.monotonic() - started < LONG / 2
        # The first holder lost it: renewing and releasing say so.
        lost = client.put(f"{LEASES}/{KEY}", params={"lease": first["lease"]})
        assert lost.status_code == 409
        assert "expired" in lost.json()["detail"]


def test_renewing_keeps_waiters_waiting(index: Index, tmp_path: Path) -> None:
    with make_client(index, tmp_path, lease_ttl_seconds=1.0) as client:
        lease = ask(client)["lease"]
        waiting, pool = in_background(ask, client, wait=2.5)
        # Renewed until the waiter answers, each time well within the 1 s TTL.
        while not waiting.done():
            assert client.put(f"{LEASES}/{KEY}", params={"lease": lease}).status_code == 200
            time.sleep(0.1)
        assert waiting.result(timeout=LONG)["state"] == "held"
        pool.shutdown()


def test_release_wakes_a_waiter_who_takes_over(client: TestClient) -> None:
    lease = ask(client)["lease"]
    waiting, pool = in_background(ask, client, wait=LONG)
    time.sleep(0.5)
    released_at = time.monotonic()
    assert client.delete(f"{LEASES}/{KEY}", params={"lease": lease}).status_code == 204
    assert waiting.result(timeout=LONG)["state"] == "granted"
    assert time.monotonic() - released_at < LONG / 2
    pool.shutdown()


def test_a_failed_compile_tells_the_waiters_then_frees_the_name(
    index: Index, tmp_path: Path
) -> None:
    with make_client(index, tmp_path, lease_ttl_seconds=1.0) as client:
        lease = ask(client, holder="node-1")["lease"]
        waiting, pool = in_background(ask, client, wait=LONG)
        time.sleep(0.3)
        gone = client.delete(f"{LEASES}/{KEY}", params={"lease": lease, "outcome": "failed"})
        assert gone.status_code == 204
        notice = waiting.result(timeout=LONG)
        assert notice["state"] == "failed"
        assert notice["holder"] == "node-1"
        # Another waiter that began before the failure hears of it too...
        assert ask(client, waited=5)["state"] == "failed"
        # ...and the failed holder cannot renew or release a notice.
        assert client.put(f"{LEASES}/{KEY}", params={"lease": lease}).status_code == 409
        # An asker that came after the failure compiles again (never a replay).
        assert ask(client)["state"] == "granted"
        pool.shutdown()


def test_an_asker_may_replace_a_holder_it_knows_is_dead(client: TestClient) -> None:
    ask(client, holder="node-1 pid 7")
    assert ask(client, dead_holder="node-1 pid 8")["state"] == "held"
    assert ask(client, dead_holder="node-1 pid 7", holder="node-1 pid 9")["state"] == "granted"
    assert ask(client)["holder"] == "node-1 pid 9"


def test_only_the_holder_renews_or_releases(client: TestClient) -> None:
    ask(client)
    other = "0" * 32
    assert client.put(f"{LEASES}/{KEY}", params={"lease": other}).status_code == 409
    assert client.delete(f"{LEASES}/{KEY}", params={"lease": other}).status_code == 409
    assert ask(client)["state"] == "held"


def test_expected_seconds_come_from_the_graphs_failure_history(client: TestClient) -> None:
    report = {"compiler_version": "2.20.9961.0+0acef03a", "log": "boom", "compile_seconds": 321.5}
    assert client.put(f"/v1/ns/team-a/failures/{KEY}", json=report).status_code == 201
    ask(client)
    assert ask(client)["expected_seconds"] == 321.5


def test_a_holders_claim_is_told_no_further_than_the_server_allows(
    index: Index, tmp_path: Path
) -> None:
    with make_client(index, tmp_path, lease_expected_max_seconds=900) as client:
        ask(client, holder="squatter pid 1", expected_seconds=30 * 86400)
        assert ask(client)["expected_seconds"] == 900


def test_a_holders_claim_is_told_no_further_than_the_graphs_history(
    client: TestClient,
) -> None:
    report = {"compiler_version": "2.20.9961.0+0acef03a", "log": "boom", "compile_seconds": 100}
    assert client.put(f"/v1/ns/team-a/failures/{KEY}", json=report).status_code == 201
    ask(client, holder="squatter pid 1", expected_seconds=30 * 86400)
    assert ask(client)["expected_seconds"] == 200
    held = ask(client)
    assert held["holder"] == "squatter pid 1"


def test_the_wait_is_capped_by_the_server(index: Index, tmp_path: Path) -> None:
    with make_client(index, tmp_path, lease_wait_max_seconds=0.5) as client:
        ask(client)
        started = time.monotonic()
        assert ask(client, wait=LONG)["state"] == "held"
        assert time.monotonic() - started < LONG / 2


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (f"{LEASES}/not-a-key", {}, 400),
        (f"{LEASES}/{'A' * 64}", {}, 400),
        (f"{LEASES}/{ADDRESS}/../x", {}, 400),
        ("/v1/ns/Bad_NS/leases/" + KEY, {}, 400),
        (f"{LEASES}/{KEY}", {"wait": -1}, 400),
        (f"{LEASES}/{KEY}", {"wait": "soon"}, 400),
        (f"{LEASES}/{KEY}", {"holder": "x" * 201}, 400),
        (f"{LEASES}/{KEY}", {"surprise": 1}, 400),
    ],
)
def test_bad_requests_are_400(client: TestClient, path: str, body: Any, status: int) -> None:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["detail"]


def test_a_malformed_lease_id_is_400(client: TestClient) -> None:
    ask(client)
    assert client.put(f"{LEASES}/{KEY}", params={"lease": "xyz"}).status_code == 400
    assert client.delete(f"{LEASES}/{KEY}").status_code == 400


def test_leases_need_write_scope_in_their_namespace(client: TestClient) -> None:
    admin = admin_token(client)
    reader = make_token(client, admin, "read", ["team-a"])
    writer_b = make_token(client, admin, "write", ["team-b"])
    writer_a = make_token(client, admin, "write", ["team-a"])
    for token, status in ((None, 401), (reader, 403), (writer_b, 403), (writer_a, 201)):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        assert client.post(f"{LEASES}/{KEY}", json={}, headers=headers).status_code == status


def test_two_replicas_on_one_redis_agree_and_wake_each_others_waiters(
    redis_server: str, tmp_path: Path
) -> None:
    import redis

    redis.Redis.from_url(redis_server).flushdb()
    first, second = open_index(redis_server), open_index(redis_server)
    try:
        with (
            make_client(first, tmp_path / "a", lease_recheck_seconds=0.5) as replica_a,
            make_client(second, tmp_path / "b", lease_recheck_seconds=0.5) as replica_b,
        ):
            granted = ask(replica_a, holder="node-1")
            assert ask(replica_b)["holder"] == "node-1"
            waiting, pool = in_background(ask, replica_b, wait=LONG)
            time.sleep(0.5)
            # The blobs live in each replica's own memory store here: publish through
            # A needs them on A only; B answers from the shared index.
            publish(replica_a)
            answer = waiting.result(timeout=LONG)
            assert answer["state"] == "done"
            assert answer["entry"]["key"] == KEY
            pool.shutdown()
            release = replica_b.delete(f"{LEASES}/{KEY}", params={"lease": granted["lease"]})
            assert release.status_code == 204
    finally:
        first.close()
        second.close()
