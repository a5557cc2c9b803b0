"""On ``failed`` the wrapper replays the holder's failure record on every host that
waited for it (session.Session._fleet). It replays whatever exit code the holder saw,
including a compiler killed by a signal (the kernel's OOM killer: neuronx-cc is the
biggest process on the host; docs/neuron-sdk.md#per-entry-compile-lock) or one that
could not be started (127 from run_teeing): failures of that host, not of the graph.
One host's OOM kill then fails the compile, and the training job, on every host that
was waiting, where each would have compiled the graph (or its own rank 0 would have)
without a lease."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.lease_hosts import make_config

from neffcache.client import lease as lease_module
from neffcache.client import session as session_module
from neffcache.client.session import Session
from neffcache.client.wrapper import parse

TESTS = Path(__file__).resolve().parents[1]
GRAPH = TESTS / "fixtures" / "hlo" / "block_a.pb"
COMPILER = TESTS / "standins" / "neuronx-cc"


def make_session(url: str, where: Path) -> Session:
    out = where / "out" / "graph.neff"
    out.parent.mkdir(parents=True)
    call = parse(["compile", "--framework=XLA", "--target=trn1", str(GRAPH), "--output", str(out)])
    assert call is not None
    return Session(make_config(url, where / "l1"), str(COMPILER), call)


# The holder's renewal thread keeps its own connection open (it is never closed).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_oom_killed_compile_is_not_replayed_to_other_hosts(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every "host" of this test is another host to every other one.
    monkeypatch.setattr(lease_module, "holder_name", lambda: "host-h pid 1")

    def oom_killed(real: str, args: list[str]) -> tuple[int, str]:
        time.sleep(1.5)  # compiling ... until the kernel kills it
        return -9, ""

    monkeypatch.setattr(session_module, "run_teeing", oom_killed)
    holder = make_session(server, tmp_path / "host-h")
    codes: dict[str, Any] = {}
    running = threading.Thread(target=lambda: codes.setdefault("h", holder.run()))
    running.start()
    deadline = time.monotonic() + 10
    while holder._leases is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert holder._leases is not None, "the holder did not get the lease"
    waiter = make_session(server, tmp_path / "host-w")
    key, direct = holder.report["key"], holder.report["direct_key"]
    served = waiter._fleet(key, direct, time.time())
    running.join(20)
    assert codes["h"] == -9
    assert served is None, f"host W fails its compile with the holder's OOM kill ({served})"
