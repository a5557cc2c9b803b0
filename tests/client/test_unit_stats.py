"""Unit tests for ``neffcache.client.stats``."""

from __future__ import annotations

import threading

from neffcache.client.stats import Stats


def test_counts_and_snapshot() -> None:
    stats = Stats()
    assert stats.snapshot() == {}
    stats.count("server_errors")
    stats.count("hits_l1", 3)
    stats.count("server_errors")
    snapshot = stats.snapshot()
    assert snapshot == {"hits_l1": 3, "server_errors": 2}
    assert list(snapshot) == sorted(snapshot)
    snapshot["hits_l1"] = 100  # a copy
    assert stats.snapshot()["hits_l1"] == 3


def test_concurrent_counts_are_not_lost() -> None:
    stats = Stats()

    def work() -> None:
        for _ in range(2000):
            stats.count("n")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.snapshot() == {"n": 16000}
