"""The hook's lease is named by the stock address; its waiters answer ``done`` only
when that address resolves to an entry on the server. When the holder's compile ends
without the address naming an entry, ``release(outcome=done)`` hands the lease to the
next waiter, who compiles again, and everyone else waits for that compile: the fleet
compiles the graph one host after another (each waiter bounded only by 2 x TTL +
NEFFCACHE_LEASE_WAIT, an hour by default), which is far slower than no lease at all.

Two everyday ways to get there with the SDK's probe-before-writing-the-HLO order:

* the program is on the server already under another address (the same graph traced
  with other metadata: the case canonical keys exist for). The hook's publish gets 409
  (``publish`` treats it as success) and never adds its address as an alias, although
  ``PUT /aliases`` exists for exactly this;
* the graph cannot be keyed (no ``--target`` in compile_flags.json, docs/neuron-sdk.md#flags-hash):
  nothing is published at all.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.client_units import VERSION, FakeStock
from support.lease_hosts import A1, HLO, NS, make_config

from neffcache.client.proxy import Core, _flush_publishes

A2 = f"neuronxcc-{VERSION}/MODULE_222+abcdef01"  # an earlier trace of the same program


def host(url: str, l1: Path, address: str) -> tuple[Core, Path]:
    l1.mkdir(parents=True)
    entry = l1 / address
    entry.mkdir(parents=True)
    return Core(FakeStock(l1), make_config(url, l1)), entry


def write_inputs(entry: Path, flags: list[str]) -> None:
    (entry / "model.hlo_module.pb").write_bytes(HLO)
    (entry / "compile_flags.json").write_text(json.dumps(flags))


def waiter(url: str, name: str, who: str, wait: float, answers: dict[str, Any]) -> None:
    """Another host's hook: waits; when granted, it compiles (renewing) for 6 s."""
    answer = httpx.post(
        f"{url}/v1/ns/{NS}/leases/{name}",
        json={"holder": f"{who} pid 1", "wait": wait},
        timeout=wait + 10,
        trust_env=False,
    ).json()
    answers[who] = answer
    if answer["state"] == "granted":
        until = time.monotonic() + 6.0
        while time.monotonic() < until:
            time.sleep(0.3)
            httpx.put(
                f"{url}/v1/ns/{NS}/leases/{name}",
                params={"lease": answer["lease"]},
                timeout=10,
                trust_env=False,
            )


def holder_compiles(url: str, tmp_path: Path, flags: list[str]) -> dict[str, Any]:
    """Host P runs the SDK's sequence (probe, entry lock, probe, write HLO, compile,
    model.done) while hosts B and C wait on the same address."""
    core, entry = host(url, tmp_path / "host-p", A1)
    hlo = str(entry / "model.hlo_module.pb")
    done = entry / "model.done"
    assert core.exists(str(done)) is False  # first probe: nobody holds it
    core.acquire_entry(hlo)
    core.mark_entry(hlo)
    assert core.exists(str(done)) is False  # second probe, under the lock: granted
    assert core._holding, "the holder did not get the lease"
    answers: dict[str, Any] = {}
    threads = [threading.Thread(target=waiter, args=(url, A1, who, 5.0, answers)) for who in "BC"]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # both wait now
    write_inputs(entry, flags)
    (entry / "model.neff").write_bytes(b"the neff")
    done.write_text("")
    core.uploaded(str(done))
    _flush_publishes()  # publish, then release (outcome=done)
    core.release_entry(hlo)
    for thread in threads:
        thread.join(20)
    return answers


def test_a_program_already_published_under_another_address_is_not_compiled_in_turn(
    server: str, tmp_path: Path
) -> None:
    earlier, entry = host(server, tmp_path / "earlier-run", A2)
    flags = ["--target=trn1", "--model-type=transformer"]
    write_inputs(entry, flags)
    (entry / "model.neff").write_bytes(b"the neff")
    earlier._publish_entry(entry, 1.0, dict(os.environ))
    assert httpx.get(f"{server}/v1/ns/{NS}/aliases/{A2}", trust_env=False).status_code == 200

    answers = holder_compiles(server, tmp_path, flags)
    states = sorted(a["state"] for a in answers.values())
    # Today: ["granted", "held"]: B compiles the graph again, C waits for B's compile.
    assert states == ["done", "done"], answers


def test_an_unkeyable_graph_does_not_make_the_fleet_compile_one_host_at_a_time(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    answers = holder_compiles(server, tmp_path, ["--model-type=transformer"])
    # Today one waiter is granted and the other is still waiting for its compile.
    assert all(a["state"] != "held" for a in answers.values()), answers
