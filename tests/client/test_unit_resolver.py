"""The resolver's decisions (resolver.py), with its two policies side by side: what a
lease's answer becomes for the wrapper and for the hook, the lookup's order, the
failure notice a release gives, and the failures one host's ranks hand each other.

The lease answers are scripted (a stand-in for ``Leases``); lease.py's own tests and
tests/leases cover the answers a real server gives."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from neffcache.client import resolver as resolver_module
from neffcache.client.config import ClientConfig
from neffcache.client.lease import Wait
from neffcache.client.local import LocalStore
from neffcache.client.resolver import (
    HOOK,
    WRAPPER,
    Compile,
    Policy,
    Replay,
    Resolver,
    Served,
    failed_while_waiting,
    failure_notice,
    remember_failure,
)
from neffcache.client.stats import STATS

NAME = "c" * 64
ENTRY = {"key": NAME, "files": {}}
FAILURE = {"exit_code": 70, "log": "error: the graph\n"}


class ScriptedLeases:
    """Answers every question with ``wait``, and remembers what was asked."""

    def __init__(self, wait: Wait) -> None:
        self.wait = wait
        self.asked: list[tuple[str, bool]] = []
        self.released: list[tuple[str, bool]] = []

    def acquire_or_wait(self, name: str, began: float | None = None, take: bool = True) -> Wait:
        self.asked.append((name, take))
        return self.wait

    def release(self, name: str, failed: bool = False) -> None:
        self.released.append((name, failed))


class FakeRemote:
    def __init__(self, up: bool = True, **found: Any) -> None:
        self.up = up
        self.found = found  # "alias:NAME" / "entry:NAME" -> manifest
        self.asked: list[str] = []

    def available(self) -> bool:
        return self.up

    def alias(self, name: str) -> Any:
        self.asked.append(f"alias:{name}")
        return self.found.get(f"alias:{name}")

    def entry(self, key: str) -> Any:
        self.asked.append(f"entry:{key}")
        return self.found.get(f"entry:{key}")


def config(tmp_path: Path) -> ClientConfig:
    made = ClientConfig.from_env(
        {"NEFFCACHE_URL": "neffcache+http://127.0.0.1:9/ns", "NEFFCACHE_LOCAL_DIR": str(tmp_path)}
    )
    assert made is not None
    return made


def resolver(
    tmp_path: Path, policy: Policy, wait: Wait, remote: FakeRemote | None = None
) -> tuple[Resolver, ScriptedLeases]:
    leases = ScriptedLeases(wait)
    server = remote or FakeRemote()
    made = Resolver(config(tmp_path), policy, lambda: server, lambda: leases)  # type: ignore[arg-type, return-value]
    return made, leases


@pytest.mark.parametrize(
    ("wait", "wrapper", "hook"),
    [
        (Wait("granted"), Compile(held=True), Compile(held=True)),
        (Wait("done", entry=ENTRY), Served(ENTRY), Served(ENTRY)),
        (Wait("free"), Compile(held=False, again=True), Compile(held=False, again=True)),
        (
            Wait("local", reason="x"),
            Compile(held=False, reason="x", again=True),
            Compile(held=False, reason="x", again=True),
        ),
        (
            Wait("failed", reason="h failed", failure=FAILURE),
            Replay(70, "error: the graph\n", "h failed"),
            Compile(held=False, reason="h failed"),
        ),
        (
            Wait("failed", reason="h failed", failure={"exit_code": -9, "log": "killed"}),
            Compile(held=False),
            Compile(held=False, reason="h failed"),
        ),
        (
            Wait("failed", reason="h failed"),
            Compile(held=False, reason="h failed"),
            Compile(held=False, reason="h failed"),
        ),
        (
            Wait("compile", reason="waited 9 s"),
            Compile(held=False, reason="waited 9 s"),
            Compile(held=False, reason="waited 9 s"),
        ),
    ],
)
def test_each_lease_answer_is_one_outcome_per_policy(
    tmp_path: Path, wait: Wait, wrapper: object, hook: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("neffcache.client.resolver.same_environment", lambda m: m)
    assert resolver(tmp_path, WRAPPER, wait)[0].fleet(NAME, time.time()) == wrapper
    assert resolver(tmp_path, HOOK, wait)[0].fleet(NAME, time.time()) == hook


def test_the_hook_does_not_ask_again_after_a_failed_wait_and_the_wrapper_does(
    tmp_path: Path,
) -> None:
    wait = Wait("compile", reason="waited 9 s")
    hook, asked_by_hook = resolver(tmp_path, HOOK, wait)
    hook.fleet(NAME, time.time())
    assert hook.fleet(NAME, time.time()) == Compile(held=False)  # not asked, nothing to say
    assert len(asked_by_hook.asked) == 1
    wrapper, asked_by_wrapper = resolver(tmp_path, WRAPPER, wait)
    wrapper.fleet(NAME, time.time())
    assert wrapper.fleet(NAME, time.time()) == Compile(held=False, reason=wait.reason)
    assert len(asked_by_wrapper.asked) == 2


def test_the_hook_asks_for_no_lease_while_the_server_is_down(tmp_path: Path) -> None:
    down = FakeRemote(up=False)
    made, leases = resolver(tmp_path, HOOK, Wait("granted"), down)
    assert made.fleet(NAME, time.time()) == Compile(held=False)
    assert leases.asked == []
    made, leases = resolver(tmp_path, WRAPPER, Wait("compile", reason="no lease"), down)
    assert made.fleet(NAME, time.time()) == Compile(held=False, reason="no lease")
    assert len(leases.asked) == 1


def test_the_hook_waits_without_taking_when_asked_to(tmp_path: Path) -> None:
    made, leases = resolver(tmp_path, HOOK, Wait("free"))
    made.fleet(NAME, time.time(), take=False)
    assert leases.asked == [(NAME, False)]


def test_an_entry_found_by_address_in_another_environment_is_not_served_to_the_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    other = {**ENTRY, "components": {"env": {"XLA_FLAGS": "--another"}}}
    before = STATS.snapshot().get("address_env_mismatches", 0)
    hook, _ = resolver(tmp_path, HOOK, Wait("done", entry=other))
    assert hook.fleet(NAME, time.time()) == Compile(held=False)
    assert STATS.snapshot().get("address_env_mismatches", 0) == before + 1
    wrapper, _ = resolver(tmp_path, WRAPPER, Wait("done", entry=other))
    assert wrapper.fleet(NAME, time.time()) == Served(other)  # a key covers the environment


def test_lookup_asks_cheapest_first_and_stops_at_the_first_entry(tmp_path: Path) -> None:
    remote = FakeRemote(**{"entry:k": ENTRY})
    made, _ = resolver(tmp_path, WRAPPER, Wait("free"), remote)
    keyed: list[str] = []

    def canonical() -> str:
        keyed.append("k")
        return "k"

    assert made.lookup(address="a", direct="d", canonical=canonical) == ENTRY
    assert remote.asked == ["alias:a", "alias:d", "entry:k"]
    remote.found["alias:d"] = ENTRY
    remote.asked.clear()
    keyed.clear()
    assert made.lookup(direct="d", canonical=canonical) == ENTRY
    assert remote.asked == ["alias:d"]
    assert keyed == []  # the canonical key is not computed when the alias answers


def test_release_tells_waiters_to_stop_only_for_the_graphs_own_failure(tmp_path: Path) -> None:
    assert failure_notice(0, published=True) is False
    assert failure_notice(0, published=False) is True  # nothing to wait for
    assert failure_notice(70, published=False) is True  # the graph fails
    assert failure_notice(-9, published=False) is False  # this host's: a waiter takes over
    assert failure_notice(127, published=False) is False
    assert failure_notice(None, published=False) is True  # the SDK's failure
    made, leases = resolver(tmp_path, WRAPPER, Wait("granted"))
    made.release(NAME, failed=True)  # nothing asked yet: nothing held
    made.fleet(NAME, time.time())
    made.release(None, failed=True)
    made.release(NAME, failed=True)
    assert leases.released == [(NAME, True)]


def test_a_ranks_failure_is_replayed_only_to_those_that_waited_since(tmp_path: Path) -> None:
    local = LocalStore(tmp_path)
    began = time.time()
    remember_failure(local, NAME, 70, "x" * 10000)
    found = failed_while_waiting(local, NAME, began)
    assert found is not None
    assert (found.code, found.log) == (70, "x" * 8192)
    assert failed_while_waiting(local, NAME, time.time() + 60) is None  # an earlier failure
    remember_failure(local, "d" * 64, -9, "killed")  # this host's trouble: not recorded
    assert failed_while_waiting(local, "d" * 64, began) is None


@pytest.mark.parametrize("code", [256, 512, True, -9, 0, 126, 127, "1", 1.0])
def test_a_failure_record_is_replayed_only_with_an_exit_status_of_the_graph(code: object) -> None:
    # 256 would exit 0 (a replayed failure that succeeded with no NEFF); a bool is an
    # int; a signal, 126 and 127 are the failing host's, not the graph's.
    assert resolver_module._replay_of({"exit_code": code, "log": "x"}, "why") is None


@pytest.mark.parametrize("code", [1, 2, 70, 255])
def test_a_failure_with_an_exit_status_is_replayed(code: int) -> None:
    assert resolver_module._replay_of({"exit_code": code, "log": "x"}, "why") == Replay(
        code, "x", "why"
    )
