"""``Core`` keys its per-entry state two ways: ``mark_entry``/``release_entry``/
``_failed_while_waiting`` by ``os.path.dirname(path)``, ``_fetch``/``_fleet``/``uploaded``
by ``str(Path(path).parent)``. ``Path`` drops ``./`` and collapses ``//``; dirname does
not. The SDK's paths are ``cache_path`` joined with the entry (the stand-in's
``os.path.join``), and ``cache_path`` is NEFFCACHE_LOCAL_DIR as written. With
``NEFFCACHE_LOCAL_DIR=./neuron-l1`` the second probe, under the SDK's entry lock, is
never seen as under it: the hook never takes the lease, and every host compiles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.client_units import FakeStock
from support.lease_hosts import A1, make_config, peek

from neffcache.client.proxy import Core


def test_a_relative_l1_still_takes_the_lease_under_the_entry_lock(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    root = "./neuron-l1"
    entry = os.path.join(root, A1)
    os.makedirs(entry)
    core = Core(FakeStock(root), make_config(server, root))  # type: ignore[arg-type]
    hlo = os.path.join(entry, "model.hlo_module.pb")
    done = os.path.join(entry, "model.done")
    assert core.exists(done) is False  # first probe: asks without taking
    core.acquire_entry(hlo)
    core.mark_entry(hlo)
    try:
        assert core.exists(done) is False  # second probe, under the entry lock
        seen = peek(server, A1)
    finally:
        core.release_entry(hlo)
    assert seen["state"] == "held", f"the compiling host holds no lease: {seen}"
