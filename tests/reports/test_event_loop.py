"""Reports and the event loop: while a report is being computed, the server still
answers ``/healthz`` and cache hits, and reports are computed one at a time, with a
bounded queue behind them. A real uvicorn server in a thread on 127.0.0.1
(``loopback.InThread``); a report's aggregation is held inside ``CostReport.add_all``
on an event the test sets, so what is checked is behaviour, never timing."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import httpx
import pytest
from fastapi import FastAPI
from loopback import InThread
from reports.support import DAY, HOUR, key, miss

import neffcache.server.api.reports as reports_api
import neffcache.server.reports.collect as collect
from neffcache.server.app import create_app
from neffcache.server.auth import TokenPresence
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.deps import Backends
from neffcache.server.index.base import Event
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.reports.cost import CostReport
from neffcache.server.reports.pace import Pace, paced
from neffcache.server.settings import ServerSettings

# Long enough for any loaded machine to answer a request; on a blocked loop, the
# request that waits this long is the test's failure.
ANSWER_SECONDS = 10.0
MISS = {"kind": "graph", "namespace": "team-a", "result": "miss", "source": "compiler"}


@dataclass
class Held:
    """Reports held inside their aggregation until ``release`` is set."""

    entered: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    release: threading.Event = field(default_factory=threading.Event)
    inside: int = 0  # reports in add_all now
    most: int = 0  # most reports in add_all at once
    released: list[bool] = field(default_factory=list)  # False: the hold timed out
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self) -> None:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        self.entered.release()
        # If the event loop were the thread held here, nothing could set the event
        # until this wait ran out: the test reads that as a failure.
        self.released.append(self.release.wait(timeout=ANSWER_SECONDS * 2))
        with self.lock:
            self.inside -= 1


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[Held]:
    state = Held()
    add_all = CostReport.add_all

    def holding(self: CostReport, events: Iterable[Event]) -> None:
        state.hold()
        add_all(self, events)

    monkeypatch.setattr(CostReport, "add_all", holding)
    yield state
    state.release.set()


@dataclass(frozen=True)
class Server:
    app: FastAPI
    url: str
    entry: str  # the path of the published entry


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server with one miss event and one published entry."""
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0)
    blobs, index = MemoryBlobStore(), MemoryIndex()  # injected: closed here, not by the app
    app = create_app(settings, blob_store=blobs, index=index)
    with (
        contextlib.closing(blobs),
        contextlib.closing(index),
        InThread(app) as url,
        httpx.Client(base_url=url, timeout=ANSWER_SECONDS) as client,
    ):
        event = {**MISS, "key": key(1), "compile_seconds": HOUR, "outcome": "ok"}
        assert client.post("/v1/events", json={"events": [event]}).status_code == 202
        data = b"neff" * 64
        digest = blake3.blake3(data).hexdigest()
        assert client.put(f"/v1/blobs/{digest}", content=data).status_code in (200, 201)
        entry = {"key": key(2), "files": {"model.neff": {"digest": digest, "size": len(data)}}}
        path = f"/v1/ns/team-a/entries/{key(2)}"
        assert client.put(path, json=entry).status_code == 201
        yield Server(app, url, path)


def _report(url: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=ANSWER_SECONDS * 3) as client:
        return client.get("/v1/reports/cost", params={"since": "1d"})


def _entered(held: Held) -> None:
    assert held.entered.acquire(timeout=ANSWER_SECONDS), "no report reached its aggregation"


def test_healthz_and_hits_answer_while_a_report_is_computed(server: Server, held: Held) -> None:
    url, entry = server.url, server.entry
    with ThreadPoolExecutor(1) as pool:
        report = pool.submit(_report, url)
        try:
            _entered(held)
            with httpx.Client(base_url=url, timeout=ANSWER_SECONDS) as client:
                try:
                    health = client.get("/healthz")
                    hit = client.get(entry)
                except httpx.TimeoutException:
                    pytest.fail("the server did not answer while a report was computed")
        finally:
            held.release.set()
        answer = report.result(timeout=ANSWER_SECONDS * 3)
    assert health.status_code == 200
    assert hit.status_code == 200
    assert hit.json()["key"] == key(2)
    # The report was held until after both answers, and then completed.
    assert held.released == [True]
    assert answer.status_code == 200, answer.text
    assert answer.json()["totals"]["compiles"] == 1


def test_reports_are_computed_one_at_a_time_and_a_full_queue_is_refused(
    server: Server, held: Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two may wait here (instead of the shipped number): a fourth report is refused.
    monkeypatch.setattr(reports_api, "WAITING_REPORTS", 2)
    url = server.url
    with ThreadPoolExecutor(3) as pool:
        first: list[Future[httpx.Response]] = [pool.submit(_report, url)]
        try:
            _entered(held)
            waiting = [pool.submit(_report, url) for _ in range(2)]
            _wait_for_queue(server.app, 2)
            with httpx.Client(base_url=url, timeout=ANSWER_SECONDS) as client:
                refused = client.get("/v1/reports/upgrade", params={"to_compiler": "2.22.0"})
                also = client.get("/v1/reports/cost")
            assert held.inside == 1  # the two behind it wait outside their aggregation
        finally:
            held.release.set()  # the three run one after the other now, none held
        answers = [f.result(timeout=ANSWER_SECONDS * 3) for f in first + waiting]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert held.most == 1
    for answer in (refused, also):
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        assert "reports" in answer.json()["detail"]


def _wait_for_queue(app: FastAPI, count: int) -> None:
    """Until ``count`` reports wait for their turn (a waiting report never reaches the
    aggregation, so there is no hold to wait on; the app's gate counts them)."""
    pause = threading.Event()
    for _ in range(int(ANSWER_SECONDS / 0.01)):
        gate = getattr(app.state, "reports_gate", None)
        if gate is not None and gate.waiting >= count:
            return
        pause.wait(0.01)
    raise AssertionError(f"fewer than {count} reports waiting")


def test_folding_pauses_after_each_slice_of_work() -> None:
    now, pauses = [0.0], list[float]()
    pace = Pace(slice_seconds=1.0, pause_seconds=0.1, clock=lambda: now[0], sleep=pauses.append)
    handled = []
    for item in paced(range(10), pace):
        handled.append(item)
        now[0] += 0.25  # each item's work
    assert handled == list(range(10))
    assert pauses == [0.1, 0.1]  # after the 4th and the 8th item: a second of work each


def test_a_report_offers_a_pause_after_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    offered = [0]

    class Counted(Pace):
        def __call__(self) -> None:
            offered[0] += 1

    monkeypatch.setattr(collect, "Pace", Counted)
    index = MemoryIndex()
    index.append_events([miss(10.0 + i, 60.0, key=key(i)) for i in range(5)], 100, 0.0)
    blobs = MemoryBlobStore()
    with contextlib.closing(blobs), contextlib.closing(index):
        settings = ServerSettings(eviction_interval_seconds=0)
        backends = Backends(settings, blobs, index, TokenPresence(index))
        report = collect.build_cost_report(backends, 0.0, DAY, ("namespace",), None, 10)
    assert report["totals"]["compiles"] == 5
    assert offered[0] == 5
