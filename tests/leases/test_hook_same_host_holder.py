"""A rank whose first probe finds the lease held by a live process on its own host
records the address in ``_no_lease`` (proxy.Core._fleet) and never asks again in that
process. If that holder is then killed, this rank's second probe, under the SDK's
entry lock (which acquire_entry just reclaimed from the dead holder), compiles without
the lease: it does not take the dead holder's lease over, so the other hosts keep
waiting for the dead holder until its TTL runs out, then one of them compiles the
graph a second time. Asking again under the lock would find the holder dead
(``dead_holder``) and take the lease at once."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from support.client_units import FakeStock
from support.lease_hosts import A1, NS, make_config, peek

from neffcache.client.lease import holder_name
from neffcache.client.proxy import Core

_HOLDER = """
import sys, time
from neffcache.client.config import ClientConfig
from neffcache.client.lease import Leases
from neffcache.client.remote import Remote
config = ClientConfig.from_env()
leases = Leases(Remote(config), config)
print(leases.acquire_or_wait(sys.argv[1]).state, flush=True)
time.sleep(30)
"""


def test_a_rank_takes_over_from_a_same_host_holder_that_died(server: str, tmp_path: Path) -> None:
    env = {"NEFFCACHE_URL": f"neffcache+{server}/{NS}", "NEFFCACHE_LOCAL_DIR": str(tmp_path / "x")}
    rank0 = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, A1], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert rank0.stdout is not None
        assert rank0.stdout.readline().split() == ["granted"]
        root = tmp_path / "l1"
        entry = root / A1
        entry.mkdir(parents=True)
        rank1 = Core(FakeStock(root), make_config(server, root))
        hlo = str(entry / "model.hlo_module.pb")
        done = str(entry / "model.done")
        assert rank1.exists(done) is False  # rank 0, alive on this host, compiles
        rank0.send_signal(signal.SIGKILL)  # an OOM kill, say
        rank0.wait(10)
        rank1.acquire_entry(hlo)
        rank1.mark_entry(hlo)
        try:
            assert rank1.exists(done) is False  # second probe, under the entry lock
            seen = peek(server, A1)
        finally:
            rank1.release_entry(hlo)
            if rank1._leases is not None:
                rank1._leases.release_all()
    finally:
        if rank0.poll() is None:
            rank0.kill()
            rank0.wait(10)
        if rank0.stdout is not None:
            rank0.stdout.close()
    assert seen.get("holder") == holder_name(), f"others still wait for the dead rank: {seen}"
