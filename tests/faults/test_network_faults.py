"""Network faults between the real client and a real
``neffcache serve``, injected by a loopback TCP proxy (``faults.proxy``) that drops
(FIN), resets (RST) or stalls a connection after a given number of bytes in either
direction, stalls it from the start (accepted, then silence), or delays every chunk.

The client is ``neffcache.client.remote.Remote`` as a training job configures it
(``support.client_units.open_remote``, ``NEFFCACHE_TIMEOUT`` 1 s, connect timeout 1 s),
and ``publish`` is the function the compiler wrapper's session publishes with. The
client's bounds (docs/client.md, "Never fail, never hang"): a request ends within its
deadline, ``NEFFCACHE_TIMEOUT`` plus one second per 8 MiB for a blob transfer, and
after a failed request the server is skipped (back-off). A stalled connection never
ends by itself, so a call that returns at all ended by its deadline; the wait for it
ends at ``HANG``, far beyond those bounds (a second or two), not at the bound itself,
which a loaded machine may overrun. The back-off is counted (the proxy's connections).

Nothing lost, for every fault and operation (entry lookup, blob fetch, publish):
the call returns (never raises); a lookup returns the stored manifest or None, a
fetch either writes exactly the right bytes or writes nothing; a publish that
returned True left a complete entry; and whatever the publish returned, the server
(asked directly, not through the proxy) holds either no entry for the key or a
complete one, every blob of which reads back with its digest, and keeps no upload
file in its staging area.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from faults.proxy import Fault, fault_proxy
from faults.support import Server, digest, running_server
from support.client_units import no_server_down, open_remote

from neffcache.client.publish import publish
from neffcache.client.remote import Remote

pytestmark = pytest.mark.e2e

TIMEOUT = 1.0  # NEFFCACHE_TIMEOUT of the client under test
# Its timeout where nothing goes wrong on the way, and success is asserted: a loaded
# machine may take longer than TIMEOUT, and nothing stalls there to wait one out.
AT_EASE = 15.0
HANG = 30.0  # seconds: a call still running then waits for what never comes
NAMESPACE = "team-a"  # open_remote's
VERSION = "2.20.9961.0+0acef03a"
BLOB = 1536 * 1024  # a NEFF-like blob: several socket buffers, several chunks


@dataclass
class Stored:
    """An entry on the server for lookups and fetches."""

    key: str
    manifest: dict[str, Any]
    blob: bytes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("network") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def stored(server: Server) -> Stored:
    blob = os.urandom(BLOB)
    assert server.http.put(f"/v1/blobs/{digest(blob)}", content=blob).status_code == 201
    key = os.urandom(32).hex()
    manifest = new_manifest(key, {"model.neff": blob})
    assert server.http.put(f"/v1/ns/{NAMESPACE}/entries/{key}", json=manifest).status_code == 201
    return Stored(key, manifest, blob)


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    no_server_down(monkeypatch)  # each case starts with the server not marked down


def new_manifest(key: str, files: dict[str, bytes]) -> dict[str, Any]:
    return {
        "key": key,
        "components": {"compiler_version": VERSION, "target": "trn2", "flags": [], "env": {}},
        "files": {
            name: {"digest": digest(data), "size": len(data)} for name, data in files.items()
        },
    }


# --- the operations


def lookup(remote: Remote, server: Server, stored: Stored, work: Path) -> bool:
    found = remote.entry(stored.key)
    if found is not None:
        assert {k: v for k, v in found.items() if k in stored.manifest} == stored.manifest
    return found is not None


def fetch(remote: Remote, server: Server, stored: Stored, work: Path) -> bool:
    dest = work / "fetched" / "model.neff"
    fetched = remote.fetch(digest(stored.blob), len(stored.blob), dest)
    if fetched:
        assert dest.read_bytes() == stored.blob
    else:
        assert not dest.exists()
        assert list(dest.parent.iterdir()) == [], "a partial download was left behind"
    return fetched


def publishing(remote: Remote, server: Server, stored: Stored, work: Path) -> bool:
    files = {"model.neff": os.urandom(BLOB), "model.hlo_module.pb": os.urandom(48 * 1024)}
    paths = {}
    for name, data in files.items():
        (work / name).write_bytes(data)
        paths[digest(data)] = work / name
    key = os.urandom(32).hex()
    manifest = new_manifest(key, files)
    published = publish(remote, manifest, paths)
    assert_never_partial(server, key, files, published)
    return published


def assert_never_partial(
    server: Server, key: str, files: dict[str, bytes], published: bool
) -> None:
    """No entry, or a complete one whose blobs all read back; True means complete."""
    got = server.http.get(f"/v1/ns/{NAMESPACE}/entries/{key}")
    assert got.status_code in (200, 404)
    if published:
        assert got.status_code == 200, "publish said True but the server has no entry"
    if got.status_code == 404:
        return
    refs = got.json()["files"]
    assert set(refs) == set(files)
    for name, data in files.items():
        assert refs[name] == {"digest": digest(data), "size": len(data)}
        blob = server.http.get(f"/v1/blobs/{digest(data)}")
        assert blob.status_code == 200, f"the entry names {name}, which the server lacks"
        assert digest(blob.content) == digest(data)


# An operation runs against a client, checks its own outcome, and returns whether it
# succeeded (found, fetched, published).
Operation = Callable[[Remote, Server, Stored, Path], bool]
OPERATIONS: dict[str, Operation] = {"lookup": lookup, "fetch": fetch, "publish": publishing}

# Where a fault strikes, as a share of the bytes the operation moves in that
# direction when nothing goes wrong (measured once per operation), or (a negative
# number) that many bytes before their end: inside the last request (a publish's
# manifest) or the last answer.
WHERE = {
    "first bytes": 0.0,
    "a third in": 0.33,
    "two thirds in": 0.67,
    "150 B before the end": -150,
    "10 B before the end": -10,
}


def faults() -> list[tuple[str, str, str]]:
    """(action, direction, where) of every case."""
    cases = [("pass", "", ""), ("delay", "", ""), ("stall", "", "at accept")]
    for action in ("drop", "reset", "stall"):
        for direction in ("up", "down"):
            for where in WHERE:
                # A stall costs a whole timeout: fewer places, the same requests hit.
                if action != "stall" or where != "10 B before the end":
                    cases.append((action, direction, where))
    return cases


@pytest.fixture(scope="module")
def traffic(
    server: Server, stored: Stored, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, int]]:
    """Bytes each operation moves up and down through a faultless proxy."""
    moved: dict[str, dict[str, int]] = {}
    for name, operation in OPERATIONS.items():
        work = tmp_path_factory.mktemp(f"measure-{name}")
        with (
            fault_proxy(server.url) as proxy,
            open_remote(proxy.url, work / "l1", AT_EASE) as remote,
        ):
            operation(remote, server, stored, work)
            remote.close()
            time.sleep(0.2)  # the link thread counts its last bytes
            moved[name] = {str(d): n for d, n in proxy.forwarded.items()}
    return moved


def fault_for(action: str, direction: str, where: str, moved: dict[str, int]) -> Fault:
    if action == "pass":
        return Fault()
    if action == "delay":
        return Fault(delay=0.02)
    if where == "at accept":
        return Fault("stall", "up", after=0)
    total, share = moved[direction], WHERE[where]
    after = total + int(share) if share < 0 else int(total * share)
    after = max(1, min(total - 1, after))
    return Fault(action, direction, after=after)  # type: ignore[arg-type]


def watched(
    operation: Operation, remote: Remote, server: Server, stored: Stored, work: Path
) -> bool:
    """Run ``operation`` in a thread; whether it succeeded. One still running after
    ``HANG`` fails here rather than hanging the suite (the proxy, closed on the way
    out, then resets what it still holds)."""
    outcome: list[bool] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(operation(remote, server, stored, work))
        except BaseException as exc:
            errors.append(exc)
        finally:
            remote.close()  # this thread's connection (the client keeps one per thread)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=HANG)
    if thread.is_alive():
        pytest.fail(f"the client hung: still running after {HANG:.0f} s")
    if errors:
        raise errors[0]
    return outcome[0]


@pytest.mark.parametrize("operation", list(OPERATIONS))
@pytest.mark.parametrize(
    ("action", "direction", "where"),
    faults(),
    ids=[" ".join(filter(None, case)) for case in faults()],
)
def test_the_client_never_hangs_and_never_publishes_a_partial_entry(
    server: Server,
    stored: Stored,
    traffic: dict[str, dict[str, int]],
    tmp_path: Path,
    operation: str,
    action: str,
    direction: str,
    where: str,
) -> None:
    """Nothing lost (module docstring): without hanging or raising, the operation
    returns the right bytes or nothing, and the server holds no partial entry and no
    staging file once the proxy is gone."""
    fault = fault_for(action, direction, where, traffic[operation])
    with fault_proxy(server.url) as proxy:
        proxy.fault = fault
        timeout = AT_EASE if action in ("pass", "delay") else TIMEOUT
        with open_remote(proxy.url, tmp_path / "l1", timeout) as remote:
            succeeded = watched(OPERATIONS[operation], remote, server, stored, tmp_path)
    if action in ("pass", "delay"):
        assert succeeded, f"{operation} failed with nothing wrong on the way ({fault})"
    # A stalled upload ends when the proxy resets it (the server's own limit is 60 s).
    assert server.wait_until_unstaged(timeout=10) == []


def test_a_stalled_server_costs_one_bound_then_the_client_skips_it(
    server: Server, stored: Stored, tmp_path: Path
) -> None:
    """Nothing lost: after one lookup that ran into a silent server (connection
    accepted, nothing answered) and returned None, the next calls of the job
    (lookups, a fetch, a publish) contact nothing, the publish False with nothing
    stored: the back-off keeps a job from paying the timeout per graph."""
    files = {"model.neff": os.urandom(64 * 1024)}
    (tmp_path / "model.neff").write_bytes(files["model.neff"])
    key = os.urandom(32).hex()
    with fault_proxy(server.url) as proxy:
        proxy.fault = Fault("stall", "up", after=0)
        with open_remote(proxy.url, tmp_path / "l1", TIMEOUT) as remote:
            assert remote.entry(stored.key) is None
            accepted = proxy.connections
            assert remote.entry(stored.key) is None
            assert not remote.fetch(digest(stored.blob), len(stored.blob), tmp_path / "blob")
            manifest = new_manifest(key, files)
            assert not publish(
                remote, manifest, {digest(files["model.neff"]): tmp_path / "model.neff"}
            )
            assert proxy.connections == accepted, "a skipped server was contacted"
    assert_never_partial(server, key, files, published=False)
