"""The hook asks for the lease (``take``) only from an ``exists(model.done)`` probe made
while this process holds the SDK's entry lock. The stand-in SDK probes again after
taking its lock; whether the real one does is not public (docs/neuron-sdk.md,
"Hit detection" and "Per-entry compile lock": only ``neuron_parallel_compile``'s
re-check is seen). An SDK that probes once, then locks
and compiles, never gets a lease through the hook: every host compiles the graph
(only the compiler wrapper, when it is enabled too, still de-duplicates, by key).
Taking the lease in ``hlo_acquire_lock`` itself (and releasing it in
``hlo_release_lock`` when no model.done/model.log followed) does not depend on a
second probe."""

from __future__ import annotations

from pathlib import Path

from support.client_units import FakeStock
from support.lease_hosts import A1, make_config, peek

from neffcache.client.proxy import Core


def test_the_lease_is_held_once_the_sdk_holds_its_entry_lock(server: str, tmp_path: Path) -> None:
    root = tmp_path / "l1"
    entry = root / A1
    entry.mkdir(parents=True)
    core = Core(FakeStock(root), make_config(server, root))
    hlo = str(entry / "model.hlo_module.pb")
    assert core.exists(str(entry / "model.done")) is False  # the only probe
    core.acquire_entry(hlo)  # what the proxy's hlo_acquire_lock does
    core.mark_entry(hlo)
    try:
        # ... the SDK now writes the HLO and compiles, without probing again.
        seen = peek(server, A1)
    finally:
        core.release_entry(hlo)
        if core._leases is not None:
            core._leases.release_all()
    assert seen["state"] == "held", f"another host would compile too: {seen}"
