"""Compile leases on the server: races and edge cases (a lease's last millisecond on
Redis, wake-ups that land while a waiter reads, a publish between a look and a
grant, the event loop while SQLite waits, Python 3.10's TimeoutError)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
from support.api import KEY, LEASES, ask, make_client, publish

from neffcache.server.index import Lease, open_index
from neffcache.server.index.memory import MemoryIndex

SERVER_SRC = Path(__file__).resolve().parents[2] / "server"
# requires-python is >=3.10: wakeups.py must work there too (its TimeoutError differs).
PY310 = next(
    (
        path
        for path in [
            Path("/usr/bin/python3.10"),
            *Path.home().glob(".pyenv/versions/3.10*/bin/python"),
        ]
        if path.exists()
    ),
    Path("/nonexistent/python3.10"),
)


def test_redis_never_reports_a_grant_it_did_not_store(redis_server: str) -> None:
    """A lease in its last millisecond has PTTL 0: ``_lease_from`` calls it absent and
    ``acquire_lease`` then answers with the asker's lease, which was never stored.
    Nobody holds the name a moment later, so the next asker is granted it too."""
    redis.Redis.from_url(redis_server).flushdb()
    index = open_index(redis_server)
    raw = redis.Redis.from_url(redis_server)
    false_grants = 0
    for i in range(1500):
        name = f"{i:064x}"
        now = time.time()
        index.acquire_lease(Lease("ns", name, "a" * 32, "A", now, now + 0.001))
        now = time.time()
        got = index.acquire_lease(Lease("ns", name, "b" * 32, "B", now, now + 30))
        stored = raw.get(f"neffcache:lease:ns:{name}")
        if got.lease_id == "b" * 32 and not (stored or b"").startswith(b"b" * 32):
            false_grants += 1
    index.close()
    assert false_grants == 0


@pytest.mark.skipif(not PY310.exists(), reason="needs a Python 3.10 interpreter")
def test_a_long_poll_times_out_quietly_on_python_310() -> None:
    """requires-python is >=3.10; there asyncio.wait_for raises asyncio.TimeoutError,
    which is not the builtin TimeoutError that wakeups.py suppresses: every long-poll
    that is not woken ends in a 500 (and the client marks the server down)."""
    wakeups = SERVER_SRC / "neffcache" / "server" / "wakeups.py"
    script = (
        "import asyncio, importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('w', r'{wakeups}')\n"
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
        "print(asyncio.run(w.Wakeups().wait('ns', 'name', 0.05)))\n"
    )
    done = subprocess.run([str(PY310), "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-600:]
    assert done.stdout.strip() == "False"


class HookedIndex(MemoryIndex):
    """Read from worker threads, as the Redis index is (``local`` false); runs
    ``hook`` once, right after the next read of ``after``."""

    local = False

    def __init__(self) -> None:
        super().__init__()
        self.after = ""
        self.hook = None

    def _fire(self, method: str) -> None:
        hook = self.hook
        if hook is not None and self.after == method:
            self.hook = None
            hook()

    def get_lease(self, namespace: str, name: str, now: float) -> Lease | None:
        found = super().get_lease(namespace, name, now)
        self._fire("get_lease")
        return found

    def resolve_alias(self, namespace: str, alias: str) -> str | None:
        found = super().resolve_alias(namespace, alias)
        self._fire("resolve_alias")
        return found


def test_a_release_during_the_waiters_lease_read_still_wakes_it(tmp_path: Path) -> None:
    """The waiter registers its wake-up future only after ``_try`` returned: a release
    (or publish) handled while ``_try`` ran in a worker thread notifies nobody, and the
    waiter sleeps until ``lease_recheck_seconds`` or its wait ends."""
    index = HookedIndex()
    wait = 60.0  # half of it is far from the milliseconds a woken waiter takes
    settings = {"lease_recheck_seconds": 60.0, "lease_wait_max_seconds": wait}
    with make_client(index, tmp_path, **settings) as client:
        lease = ask(client)["lease"]
        index.after = "get_lease"
        index.hook = lambda: client.delete(f"{LEASES}/{KEY}", params={"lease": lease})
        started = time.monotonic()
        answer = ask(client, wait=wait)
        elapsed = time.monotonic() - started
    assert answer["state"] == "granted"
    assert elapsed < wait / 2, f"woken only by the end of its wait ({elapsed:.1f} s)"


def test_a_graph_published_before_its_lease_was_released_is_never_granted(
    tmp_path: Path,
) -> None:
    """``_try`` reads the entry, then the lease. A holder that publishes and releases
    between the two reads (another replica, or another worker thread) leaves the
    waiter with a free name: it is granted the lease and compiles a graph that is on
    the server already. Reading the lease first (a release follows its publish) or
    looking for the entry again after a grant closes the window."""
    index = HookedIndex()
    with make_client(index, tmp_path) as client:
        lease = ask(client)["lease"]

        def holder_finishes() -> None:
            publish(client)
            client.delete(f"{LEASES}/{KEY}", params={"lease": lease})

        index.after = "resolve_alias"  # the entry was just found missing
        index.hook = holder_finishes
        answer = ask(client, waited=1.0)
    assert answer["state"] == "done"


def test_a_lease_acquisition_does_not_block_the_event_loop(tmp_path: Path) -> None:
    """SQLite is ``local``, so ``_try`` runs on the event loop, and with it
    ``acquire_lease``'s BEGIN IMMEDIATE, which waits up to 5 s while another process
    sharing the file writes. Every other write (entries, failures, renew, release)
    takes a worker thread for exactly this reason; the lease grant does not, and the
    whole server (wake-ups, lookups, health) stalls meanwhile."""
    import sqlite3
    import threading

    # No clock: the other process keeps the write lock until /healthz has answered. A
    # grant that held the event loop would wait out SQLite's busy timeout behind that
    # lock (no /healthz answer can come first) and fail; one off the loop is granted
    # once the lock is let go.
    index = open_index(f"sqlite://{tmp_path / 'index.db'}")
    answers: list[int] = []
    with make_client(index, tmp_path) as client:
        other_process = sqlite3.connect(tmp_path / "index.db", isolation_level=None)
        other_process.execute("BEGIN IMMEDIATE")  # another server process writes

        def ask() -> None:
            answers.append(client.post(f"{LEASES}/{KEY}", json={}).status_code)

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        time.sleep(0.3)  # lets the lease request reach the write lock first
        health = client.get("/healthz")
        waiting = asking.is_alive()
        other_process.execute("COMMIT")
        asking.join(30)
        other_process.close()
    index.close()
    assert health.status_code == 200
    assert waiting, "the lease request was answered before the write lock was let go"
    assert answers == [201], f"the lease request, held behind /healthz, answered {answers}"
