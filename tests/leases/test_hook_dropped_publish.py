"""``Publisher.submit`` drops a job when its queue is full (counted as
``publishes_dropped``). For the hook the job is "publish, then release the lease"
(proxy.Core.uploaded): a dropped job leaves the lease in ``Leases._held``, renewed
every TTL / 3 until the process exits, for a graph that was compiled and will never
be published; every other host waits its full bound (an hour by default)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from support.client_units import FakeStock
from support.lease_hosts import A1, HLO, TTL, make_config, peek

from neffcache.client import proxy, publish
from neffcache.client.proxy import Core, _flush_publishes, _publisher


def test_a_dropped_publish_still_releases_the_lease(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proxy, "_the_publisher", [])
    monkeypatch.setattr(publish, "_QUEUE_SIZE", 1)
    root = tmp_path / "l1"
    entry = root / A1
    entry.mkdir(parents=True)
    config = make_config(server, root)
    core = Core(FakeStock(root), config)
    hlo = str(entry / "model.hlo_module.pb")
    done = entry / "model.done"
    assert core.exists(str(done)) is False
    core.acquire_entry(hlo)
    core.mark_entry(hlo)
    assert core.exists(str(done)) is False
    assert core._holding
    # The publisher is busy with earlier graphs' uploads and its queue is full.
    busy = threading.Event()
    _publisher(config).submit(busy.wait)
    time.sleep(0.1)
    _publisher(config).submit(lambda: None)
    (entry / "model.hlo_module.pb").write_bytes(HLO)
    (entry / "compile_flags.json").write_text(json.dumps(["--target=trn1"]))
    (entry / "model.neff").write_bytes(b"the neff")
    done.write_text("")
    core.uploaded(str(done))  # dropped: the queue is full
    core.release_entry(hlo)
    busy.set()
    _flush_publishes()
    time.sleep(2 * TTL)  # a lease nobody renews would have run out by now
    seen = peek(server, A1)
    assert core._leases is not None
    core._leases.release_all()
    assert seen["state"] != "held", f"other hosts wait for a publish that never comes: {seen}"
