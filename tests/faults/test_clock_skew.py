"""Clock skew of plus and minus one day on clients has no
effect on expiry.

Criterion (nothing lost, nothing kept by a wrong clock): a client whose clock is a day
ahead or a day behind changes nothing the server decides by time. The real client code
(``Remote``, ``publish``, the telemetry ``Sender``) runs in this process with its
clock (``time.time`` in every ``neffcache.client`` module that reads it) moved by
+86400 s or -86400 s, against a real ``neffcache serve`` on 127.0.0.1 whose clock is
left alone. Then:

- an entry the skewed client publishes gets the server's ``created_at``;
- its hits set the entry's ``last_access`` on the server's clock;
- expiry (an eviction dry run, ``POST /v1/admin/evict``, on a namespace whose
  ``ttl_seconds`` is 60) keeps the entry the skewed client just used and the one it
  just published, and lists as ``expired`` only the entry nobody used for longer than
  the TTL (written into the server's SQLite index with a ``created_at`` two TTLs ago
  by the server's clock: real time cannot pass a minute in this test);
- the events it sends are stored with the server's ``at`` (the client's kept as
  ``client_at``) and reported on the server's day (``GET /v1/reports/cost?by=day``).

A server that took any of these times from the client would, a day behind, expire what
was just published or used, or report it on yesterday; a day ahead, keep an idle entry
a day too long, or report it on tomorrow.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from faults.support import Server, running_server
from support.client_units import closing_remotes, open_remote

import neffcache.client
from neffcache.client import remote as remote_module
from neffcache.client import telemetry
from neffcache.client.keys import canonical_key, context
from neffcache.client.publish import make_manifest, publish
from neffcache.server.index import open_index
from neffcache.server.index.base import Entry

pytestmark = pytest.mark.e2e

DAY = 86400.0
TTL = 60.0  # the shortest a namespace takes
NAMESPACE = "team-a"  # the namespace of open_remote's client
VERSION = "2.20.9961.0+0acef03a"
HLO = Path(__file__).resolve().parents[1] / "fixtures" / "hlo" / "block_a.pb"


class _SkewedTime:
    """The ``time`` module with ``time()`` moved by ``skew`` seconds; the rest (sleep,
    monotonic, gmtime, ...) as it is."""

    def __init__(self, skew: float) -> None:
        self._skew = skew

    def time(self) -> float:
        return time.time() + self._skew

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def skew_client_clock(
    monkeypatch: pytest.MonkeyPatch, skew: float
) -> tuple[_SkewedTime, list[str]]:
    """Every loaded ``neffcache.client`` module that reads ``time`` reads a skewed one;
    returns it and the modules' names."""
    skewed = _SkewedTime(skew)
    prefix = neffcache.client.__name__ + "."
    patched = []
    for name, module in sorted(sys.modules.items()):
        if not name.startswith(prefix) or not isinstance(module, ModuleType):
            continue
        if getattr(module, "time", None) is time:
            monkeypatch.setattr(module, "time", skewed)
            patched.append(name)
    return skewed, patched


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server of its own per test: the report then holds that test's events alone."""
    with running_server(tmp_path / "data") as running:
        created = running.http.post(f"/v1/admin/namespaces/{NAMESPACE}", json={"ttl_seconds": TTL})
        assert created.status_code == 201, created.text
        yield running


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_module, "_down_until", {})


def entry_files(directory: Path, label: str) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "model.neff": f"neff of {label}".encode() * 50,
        "model.hlo_module.pb": HLO.read_bytes(),
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return {name: directory / name for name in files}


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("skew", [DAY, -DAY], ids=["client-a-day-ahead", "client-a-day-behind"])
def test_a_skewed_client_changes_nothing_the_server_decides_by_time(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    tag = "ahead" if skew > 0 else "behind"
    module = HLO.read_bytes()
    used, idle, stale = (
        canonical_key(module, context(VERSION, "trn1", [f"--skew-test={tag}-{n}"], {}))
        for n in ("used", "idle", "stale")
    )
    manifests = {}
    for name, key in (("used", used), ("idle", idle), ("stale", stale)):
        manifests[name] = make_manifest(key, None, None, entry_files(tmp_path / name, name), 30.0)

    client_clock, patched = skew_client_clock(monkeypatch, skew)
    for name in ("remote", "publish", "telemetry"):
        assert f"neffcache.client.{name}" in patched
    assert abs(client_clock.time() - time.time() - skew) < 1

    # closing_remotes: the telemetry sender's own Remote is closed at the end too.
    with closing_remotes(monkeypatch), open_remote(server.url, tmp_path / "l1") as remote:
        # The skewed client publishes two entries.
        published_from = time.time()
        for name in ("used", "idle"):
            assert publish(remote, *manifests[name])
        published_until = time.time()

        # One nobody used for two TTLs, by the server's clock.
        manifest, _ = manifests["stale"]
        index = open_index(f"sqlite://{server.data_dir / 'index.db'}")
        try:
            old = Entry(
                NAMESPACE, stale.key, canonical_json(manifest), time.time() - 2 * TTL, "anonymous"
            )
            index.put_entry(old, ())
        finally:
            index.close()

        # The skewed client hits one: the entry carries the server's created_at.
        hit_from = time.time()
        found = remote.entry(used.key)
        hit_until = time.time()
        assert found is not None
        assert published_from - 1 <= found["created_at"] <= published_until + 1

        # And reports the hit.
        at = client_clock.time()
        line = {"key": used.key, "result": "hit", "source": "server", "saved_seconds": 30.0}
        sender = telemetry.Sender(threaded=False)
        sender.enqueue(remote.config, telemetry.graph_event(remote.config, line, at))
        sent_from = time.time()
        assert sender.flush(timeout=5)
        sent_until = time.time()

    # Expiry: only the entry unused for longer than the TTL goes.
    plan = server.http.post("/v1/admin/evict", json={"dry_run": True, "namespaces": [NAMESPACE]})
    assert plan.status_code == 200, plan.text
    listed = {e["key"]: e for e in plan.json()["entries"] if e["namespace"] == NAMESPACE}
    ours = {used.key, idle.key, stale.key}
    assert {k for k in listed if k in ours} == {stale.key}, plan.text
    assert listed[stale.key]["reason"] == "expired"

    # The stamps, as the index holds them (the dry run flushed this replica's hits).
    index = open_index(f"sqlite://{server.data_dir / 'index.db'}")
    try:
        stats = {s.key: s for s in index.entry_stats(NAMESPACE, None, 1000)}
        events, _ = index.events(0.0, time.time() + 2 * DAY, [NAMESPACE], None, 100)
    finally:
        index.close()
    assert published_from - 1 <= stats[idle.key].created_at <= published_until + 1
    assert stats[idle.key].last_access == stats[idle.key].created_at  # never served
    assert stats[used.key].hits == 1
    assert hit_from - 1 <= stats[used.key].last_access <= hit_until + 1

    # The events (the graph, and the counters event the sender stamps itself): the
    # server's at, the client's kept as client_at.
    bodies = {e.kind: json.loads(e.body) for e in events}
    assert sorted(e.kind for e in events) == ["counters", "graph"], bodies
    assert bodies["graph"]["client_at"] == round(at, 3)
    for event in events:
        body = bodies[event.kind]
        assert sent_from - 1 <= event.at <= sent_until + 1
        assert body["at"] == event.at
        assert abs(body["client_at"] - event.at - skew) < 5

    # Reported on the server's day, and on no other.
    report = server.http.get(
        "/v1/reports/cost", params={"by": "day", "since": "7d", "format": "json"}
    )
    assert report.status_code == 200, report.text
    answer = report.json()
    assert answer["totals"]["lookups"] == 1, answer["totals"]
    days = {row["group"]["day"]: row["lookups"] for row in answer["rows"]}
    assert sum(days.values()) == 1, days
    assert set(days) <= {day_of(sent_from), day_of(sent_until)}, days  # midnight between


def day_of(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))
