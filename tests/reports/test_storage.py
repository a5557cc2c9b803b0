"""The reports' storage figures (and the metrics' gauges) are remembered per namespace
for a while, so a dashboard that refreshes often does not list every entry each time."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from neffcache.server.eviction.evictor import Usage
from neffcache.server.eviction.usage import UsageMemo
from neffcache.server.reports.storage import storage_rows


class CountingEvictor:
    def __init__(self) -> None:
        self.scans: list[str] = []

    def usage(self, namespace: str) -> Usage:
        self.scans.append(namespace)
        return Usage(namespace, entries=len(self.scans), bytes=100 * len(self.scans))


def test_usage_is_scanned_once_per_namespace_within_the_ttl() -> None:
    now = [1000.0]
    evictor = CountingEvictor()
    policies: Any = SimpleNamespace(get=lambda ns: SimpleNamespace(quota_bytes=5000))
    memo = UsageMemo(evictor, ttl=60.0, clock=lambda: now[0])  # type: ignore[arg-type]

    def rows(namespaces: list[str]) -> list[dict[str, Any]]:
        return storage_rows(memo, policies, namespaces)

    first = rows(["team-a", "team-b", "team-a"])
    assert first == [
        {"namespace": "team-a", "entries": 1, "bytes": 100, "quota_bytes": 5000},
        {"namespace": "team-b", "entries": 2, "bytes": 200, "quota_bytes": 5000},
    ]
    now[0] += 59.0
    assert rows(["team-a"]) == first[:1]
    assert evictor.scans == ["team-a", "team-b"]
    now[0] += 2.0  # past the TTL: scanned again
    assert rows(["team-a"])[0]["entries"] == 3
    assert evictor.scans == ["team-a", "team-b", "team-a"]
