"""system_lease.py: the one-replica-at-a-time lease (``hold``) and the thread a
background job runs in (``LeasedThread``), as the evictor and the scrub use them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from neffcache.server.errors import StoreError
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.system_lease import SYSTEM, LeasedThread

log = logging.getLogger("neffcache.server.test-job")


class Job(LeasedThread):
    """Takes the lease each turn; the first turns fail as told, then it is done."""

    lease = "test-job"
    role = "test-job"
    what = "test job"
    log = log

    def __init__(self, index: MemoryIndex, failures: list[Exception] | None = None) -> None:
        super().__init__(index)
        self.failures = list(failures or [])
        self.turns = 0
        self.leading: list[bool] = []
        self.done = threading.Event()
        self.stops = 0

    def first_wait(self) -> float:
        return 0.0

    def idle(self) -> float:
        return 0.0

    def turn(self) -> float:
        self.turns += 1
        if self.failures:
            raise self.failures.pop(0)
        self.leading.append(self.hold_lease(time.time(), 60.0))
        self.done.set()
        return 3600.0

    def stopped(self) -> None:
        self.stops += 1


@pytest.fixture
def index() -> Iterator[MemoryIndex]:
    index = MemoryIndex()
    yield index
    index.close()


def holder(index: MemoryIndex) -> str | None:
    lease = index.get_lease(SYSTEM, Job.lease, time.time())
    return None if lease is None else lease.holder


def test_a_job_turns_holds_its_lease_and_gives_it_up_when_stopped(index: MemoryIndex) -> None:
    job = Job(index)
    job.start()
    assert job.done.wait(30)
    assert job.leading == [True]
    assert holder(index) == job.actor
    assert job.actor.startswith("test-job@")
    job.stop()
    assert job.stops == 1
    assert holder(index) is None
    assert job.turns == 1


def test_a_failed_turn_is_logged_and_the_thread_goes_on(
    index: MemoryIndex, caplog: pytest.LogCaptureFixture
) -> None:
    job = Job(index, [StoreError("the index is down"), RuntimeError("a bug")])
    with caplog.at_level(logging.WARNING, logger=log.name):
        job.start()
        assert job.done.wait(30)
        job.stop()
    assert job.turns == 3
    messages = [record.getMessage() for record in caplog.records]
    assert "test job failed (tried again in 0 s): the index is down" in messages
    assert "test job failed" in messages


def test_one_replica_holds_the_lease_and_the_other_leaves_it_alone(index: MemoryIndex) -> None:
    first, second = Job(index), Job(index)
    assert first.hold_lease(time.time(), 60.0)
    assert not second.hold_lease(time.time(), 60.0)
    second.stop()  # never held it: gives up nothing
    assert second.stops == 1
    assert not second.hold_lease(time.time(), 60.0)  # the first one's still
    first.stop()  # never started: still gives up the lease it took
    assert holder(index) is None
    assert second.hold_lease(time.time(), 60.0)


def test_running_says_stop_once_stopped(index: MemoryIndex) -> None:
    job = Job(index)
    assert job.running()
    job.stop()
    assert not job.running(3600.0)  # returns at once: the job is stopping


class Stuck(Job):
    """Takes the lease, then its turn waits until the test lets it go."""

    stop_wait = 0.05

    def __init__(self, index: MemoryIndex) -> None:
        super().__init__(index)
        self.let_go = threading.Event()

    def turn(self) -> float:
        self.leading.append(self.hold_lease(time.time(), 60.0))
        self.done.set()
        self.let_go.wait(60)
        return 3600.0


def test_a_turn_still_running_after_stop_keeps_its_lease(
    index: MemoryIndex, caplog: pytest.LogCaptureFixture
) -> None:
    job = Stuck(index)
    job.start()
    assert job.done.wait(30)
    with caplog.at_level(logging.WARNING, logger=log.name):
        job.stop()  # the turn goes on until let go, well past stop_wait
    try:
        # Given up, another replica would start the job beside the one still running.
        assert holder(index) == job.actor
        assert job.stops == 0
        assert any("still running" in record.getMessage() for record in caplog.records)
    finally:
        job.let_go.set()
