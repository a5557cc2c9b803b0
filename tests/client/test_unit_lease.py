"""Compile leases in the client (lease.py, and their use in session.py and proxy.py):
bounded waits, pacing, probes that take no lease, the SDK's entry lock, renewals while
the server is skipped, releases at exit after the publishes, replaying only this
failure.

The server is a real ``neffcache serve`` whose leases live ``TTL`` seconds; each test
plays "another host" with plain HTTP requests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.client_units import ADDRESS, Clock, FakeStock, closing_remotes, delta, no_server_down
from support.lease_hosts import TTL

from neffcache.client.config import ClientConfig
from neffcache.client.lease import Leases
from neffcache.client.proxy import Core
from neffcache.client.remote import LeaseAnswer, Remote
from neffcache.client.session import Session
from neffcache.client.stats import STATS
from neffcache.client.wrapper import parse

TESTS = Path(__file__).resolve().parents[1]
GRAPH = TESTS / "fixtures" / "hlo" / "block_a.pb"
COMPILER = TESTS / "standins" / "neuronx-cc"
NS = "unit-lease"
KEY = "c" * 64


@pytest.fixture(autouse=True)
def _close_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with closing_remotes(monkeypatch):
        yield


def config(url: str, tmp_path: Path, **extra: str) -> ClientConfig:
    env = {
        "NEFFCACHE_URL": f"neffcache+{url}/{NS}",
        "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
        "NEFFCACHE_TIMEOUT": "5",
        **extra,
    }
    made = ClientConfig.from_env(env)
    assert made is not None
    return made


def other_host(url: str, name: str, **body: Any) -> dict[str, Any]:
    """A lease request from a process on another host."""
    body.setdefault("holder", "other-host pid 1")
    answer: dict[str, Any] = httpx.post(
        f"{url}/v1/ns/{NS}/leases/{name}", json=body, timeout=30, trust_env=False
    ).json()
    return answer


def session(url: str, tmp_path: Path) -> Session:
    out = tmp_path / "out" / "graph.neff"
    out.parent.mkdir(parents=True)
    call = parse(["compile", "--framework=XLA", "--target=trn1", str(GRAPH), "--output", str(out)])
    assert call is not None
    return Session(config(url, tmp_path), str(COMPILER), call)


# --- the waiter -------------------------------------------------------------------------


class AnswersAtOnce:
    """A server that answers ``held`` without holding the request: one configured with
    ``lease_wait_max_seconds=0`` (a valid setting), or a proxy that cannot long-poll."""

    def __init__(self) -> None:
        self.calls = 0

    def lease(self, name: str, wait: float, holder: str, **_: Any) -> LeaseAnswer:
        self.calls += 1
        return LeaseAnswer("held", "", 0.25, "other-host pid 1", 0.0, None, None)


def test_a_waiter_does_not_spin_when_the_server_answers_at_once(tmp_path: Path) -> None:
    remote = AnswersAtOnce()
    made = config("http://127.0.0.1:9", tmp_path)._replace(lease_wait=0.5)
    # bound = 2 * ttl + lease_wait = 1 s; the wait lasts up to twice that.
    wait = Leases(remote, made).acquire_or_wait(KEY)  # type: ignore[arg-type]
    assert wait.state == "compile"
    assert remote.calls < 50, f"{remote.calls} lease requests in 2 s: a busy loop"


class Squatter:
    """A holder that claims a month-long compile and renews for ever: the server tells
    every waiter the claim (an older server does, or one with a high maximum)."""

    def __init__(self) -> None:
        self.calls = 0

    def lease(self, name: str, wait: float, holder: str, **_: Any) -> LeaseAnswer:
        self.calls += 1
        return LeaseAnswer("held", "", 0.25, "squatter pid 1", 0.0, 30 * 86400.0, None)


def test_a_holders_claim_never_lengthens_the_waiters_own_bound(tmp_path: Path) -> None:
    made = config("http://127.0.0.1:9", tmp_path)._replace(lease_wait=0.5)
    # Each answer says the holder has held it 0 s: the bound is all the waiter has.
    done: list[str] = []
    waiter = threading.Thread(
        target=lambda: done.append(Leases(Squatter(), made).acquire_or_wait(KEY).state),  # type: ignore[arg-type]
        daemon=True,
    )
    waiter.start()
    waiter.join(timeout=120)  # the bound is 2 * 1 s + 0.5 s; a month with the claim
    assert done == ["compile"]


class HeldThenDone:
    """A long-polling server: ``held`` to the first question (asked without waiting),
    then the entry to the next, which waits."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def lease(self, name: str, wait: float, holder: str, **_: Any) -> LeaseAnswer:
        self.waits.append(wait)
        if len(self.waits) == 1:
            return LeaseAnswer("held", "", 30.0, "other-host pid 1", 5.0, None, None)
        return LeaseAnswer("done", "", 30.0, "", 0.0, None, {"key": KEY})


def test_a_waiter_long_polls_at_once_after_its_first_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first question does not wait (its answer sets the bound); the second must
    follow at once as a long-poll, not after a pause meant for servers that do not
    hold requests (the herd would then hear of the entry up to TTL / 3 late)."""
    from neffcache.client import lease

    clock = Clock().install(monkeypatch, lease)
    remote = HeldThenDone()
    made = config("http://127.0.0.1:9", tmp_path)
    wait = Leases(remote, made).acquire_or_wait(KEY)  # type: ignore[arg-type]
    assert wait.state == "done"
    assert remote.waits[0] == 0.0
    assert remote.waits[1] > 0.0
    assert clock.now == 0.0  # no pacing pause: the client never slept


# --- the holder ---------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_live_holder_keeps_its_lease_while_the_server_is_marked_down(
    short_ttl_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One failed request by any process on the host (a timed-out download, say) marks
    the server down host-wide for NEFFCACHE_BACKOFF (60 s). Renewals go through the
    same gate, so the holder, alive and compiling, stops renewing: its lease runs out
    after one TTL (30 s) and another host compiles the graph too."""
    no_server_down(monkeypatch)
    made = config(short_ttl_server, tmp_path)
    remote = Remote(made)
    leases = Leases(remote, made)
    assert leases.acquire_or_wait(KEY).state == "granted"
    remote._mark_down("blob download", "timed out")  # another rank's request, say
    time.sleep(3 * TTL)
    answer = other_host(short_ttl_server, KEY)
    leases.release_all()
    assert answer["state"] == "held", "a second host was granted a live holder's lease"


@pytest.mark.e2e
def test_an_exception_in_the_wrapper_is_not_reported_as_a_failed_compile(
    short_ttl_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session.run starts with ``code = 1``: when anything raises after the grant, the
    lease is released with outcome=failed. Hosts that were waiting are told the compile
    failed (the wrapper then replays whatever failure record is newest, or all of them
    compile at once), while this host's wrapper goes on to compile the graph without
    the cache (wrapper.main's fallback), successfully."""
    no_server_down(monkeypatch)
    holder = session(short_ttl_server, tmp_path)

    def a_bug(*_: Any) -> tuple[int, float]:
        raise RuntimeError("a bug in the wrapper, before the compiler ran")

    monkeypatch.setattr(Session, "_compile", a_bug)
    with pytest.raises(RuntimeError):
        holder.run()
    key = holder.report["key"]
    assert key is not None
    # A host that began waiting 5 s ago, before the holder gave up.
    assert other_host(short_ttl_server, key, waited=5.0)["state"] != "failed"


@pytest.mark.e2e
def test_a_waiter_does_not_replay_a_failure_from_before_its_wait(
    short_ttl_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On ``failed`` the wrapper replays the key's newest failure record, whatever its
    age (failure_ttl_seconds: an hour by default). When the holder left no record of
    its own (the exception path above, or its report was lost), a waiter replays the
    failure of an earlier run."""
    no_server_down(monkeypatch)
    earlier = {"compiler_version": "2.20.9961.0+0acef03a", "log": "an earlier run\n"}
    put = httpx.put(
        f"{short_ttl_server}/v1/ns/{NS}/failures/{KEY}",
        json={**earlier, "exit_code": 77},
        timeout=10,
        trust_env=False,
    )
    assert put.status_code == 201
    time.sleep(0.2)
    began = time.time()
    lease = other_host(short_ttl_server, KEY)["lease"]

    def holder_gives_up() -> None:
        time.sleep(0.5)
        httpx.delete(
            f"{short_ttl_server}/v1/ns/{NS}/leases/{KEY}",
            params={"lease": lease, "outcome": "failed"},
            timeout=10,
            trust_env=False,
        )

    threading.Thread(target=holder_gives_up, daemon=True).start()
    waiter = session(short_ttl_server, tmp_path)
    assert waiter._fleet(KEY, "d" * 64, began) is None, "replayed an earlier run's failure"


# --- the hook -----------------------------------------------------------------------------


def core(url: str, tmp_path: Path, **extra: str) -> tuple[Core, Path]:
    made = config(url, tmp_path, **extra)
    root = Path(made.local_dir)
    entry = root / ADDRESS
    entry.mkdir(parents=True)
    return Core(FakeStock(root), made), entry


@pytest.mark.e2e
def test_a_probe_that_compiles_nothing_does_not_hold_the_lease(
    short_ttl_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any miss of ``exists(model.done)`` takes the lease, but only an upload of
    model.done/model.log or the entry lock's release gives it back. A probe followed by
    no compile (NEURON_EXTRACT_GRAPHS_ONLY: the SDK probes, writes the HLO and returns;
    or the SDK raising before its entry lock) leaves the lease renewed until the
    process exits, and every other host waits its full bound (2 x TTL + 3600 s by
    default) for a compile that never happens."""
    no_server_down(monkeypatch)
    extracting, entry = core(short_ttl_server, tmp_path / "host-1")
    try:
        assert extracting.exists(str(entry / "model.done")) is False  # then no compile
        time.sleep(3 * TTL)
        other, entry = core(short_ttl_server, tmp_path / "host-2", NEFFCACHE_LEASE_WAIT="6")
        before = STATS.snapshot()
        assert other.exists(str(entry / "model.done")) is False
    finally:
        assert extracting._leases is not None
        extracting._leases.release_all()
    # A lease still held would keep host 2 waiting out its bound, then giving up.
    assert delta(before, "lease_waits_abandoned") == 0, "host 2 waited for a compile nobody runs"


# --- exit ---------------------------------------------------------------------------------

_EXIT_SCRIPT = """
import sys, time
from neffcache.client.config import ClientConfig
from neffcache.client.lease import Leases
from neffcache.client.proxy import _flush_publishes, _publisher
from neffcache.client.remote import Remote

config = ClientConfig.from_env()
_publisher(config)  # an earlier graph's publish made the process's Publisher
remote = Remote(config)
real_release = Remote.release
def release(self, name, lease_id, failed):
    print("released", time.time(), flush=True)
    return real_release(self, name, lease_id, failed)
Remote.release = release
leases = Leases(remote, config, before_exit=_flush_publishes)  # as the hook makes it
assert leases.acquire_or_wait(sys.argv[1]).state == "granted"
def publish_then_release():  # proxy.Core._publish: publish, then release
    time.sleep(1.0)
    print("published", time.time(), flush=True)
    leases.release(sys.argv[1])
_publisher(config).submit(publish_then_release)
# the training script ends; atexit runs the Publisher's flush and Leases.release_all
"""


@pytest.mark.e2e
def test_exit_releases_a_lease_only_after_its_publish(
    short_ttl_server: str, tmp_path: Path
) -> None:
    """atexit runs last-registered first. When the Publisher was made before the first
    lease (a graph compiled while the server was skipped, say), release_all runs
    before the Publisher's flush: the lease goes before its entry is published, and the
    woken waiters find nothing, take the lease and compile again."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(str(TESTS.parent / p) for p in ("keying", "client")),
        "NEFFCACHE_URL": f"neffcache+{short_ttl_server}/{NS}",
        "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
    }
    script = textwrap.dedent(_EXIT_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-c", script, KEY], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-800:]
    events = [line.split()[0] for line in done.stdout.splitlines()]
    assert events[:2] == ["published", "released"], done.stdout


# --- the SDK's entry lock -------------------------------------------------------------------


@pytest.mark.e2e
def test_a_probe_under_the_sdks_entry_lock_never_waits_for_a_lease_on_this_host(
    short_ttl_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank C's first probe finds the server skipped (marked down), so it asks for no
    lease and takes the SDK's entry lock. The back-off ends; rank A (same host) probes,
    is granted the lease and waits for the entry lock. C's second probe, under that
    lock, long-polls for A's lease: A waits for C, C for A, until C's bound (2 x TTL +
    NEFFCACHE_LEASE_WAIT, an hour by default) runs out."""
    no_server_down(monkeypatch)
    made = config(short_ttl_server, tmp_path, NEFFCACHE_BACKOFF="1", NEFFCACHE_LEASE_WAIT="6")
    root = Path(made.local_dir)
    entry = root / ADDRESS
    entry.mkdir(parents=True)
    rank_c, rank_a = Core(FakeStock(root), made), Core(FakeStock(root), made)
    hlo = str(entry / "model.hlo_module.pb")
    done = str(entry / "model.done")
    try:
        rank_c.remote._mark_down("alias lookup", "timed out")
        assert rank_c.exists(done) is False  # no lease asked: the server is skipped
        rank_c.acquire_entry(hlo)
        time.sleep(1.2)  # the back-off ends
        assert rank_a.exists(done) is False  # granted: A compiles once it has the lock
        before = STATS.snapshot()
        assert rank_c.exists(done) is False
    finally:
        rank_c.release_entry(hlo)
        if rank_a._leases is not None:
            rank_a._leases.release_all()
    # Waiting for A's lease, C would have held the entry lock until its bound ran out.
    assert delta(before, "lease_waits_abandoned") == 0, "rank C waited for rank A"
