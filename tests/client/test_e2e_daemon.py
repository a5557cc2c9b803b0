"""End to end: the hit daemon (client/daemon.py) behind the shim on PATH.

A shim that finds no daemon does the whole call itself and starts one; the next
calls' hits are the daemon's (their run-manifest lines carry a daemon worker's pid),
and anything that is not a hit the daemon declines, having recorded nothing, and the
shim compiles as before. Each test has its own socket directory (``NEFFCACHE_DAEMON_DIR``)
and stops its daemons at the end.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.daemons import (
    children_states,
    daemon_env,
    daemons,
    is_daemon,
    out,
    socket_in,
    stop_daemons,
    until,
)
from support.e2e import (
    BLOCK_A,
    BLOCK_B,
    VARIANT,
    Sandbox,
    Server,
    hlo,
    read_run_manifest,
    reference_neff,
)

from neffcache.keying import ENV_ALLOWLIST

pytestmark = pytest.mark.e2e


def started(sandbox: Sandbox, server: Server, sockets: Path, l1: Path) -> None:
    """Compile BLOCK_A through the shim (a miss: the shim's own), and wait for the
    daemon it starts."""
    env = daemon_env(sandbox, server, sockets, l1)
    sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    until("no daemon started", lambda: socket_in(sockets) is not None and daemons(sockets))


def test_hits_after_the_first_call_are_the_daemons(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    l1 = sandbox.new_dir("l1")
    started(sandbox, server, sockets, l1)
    [miss] = read_run_manifest(sandbox.root / "run.jsonl")
    assert miss["result"] == "miss"
    assert not is_daemon(miss["pid"], sockets)
    env = daemon_env(sandbox, server, sockets, l1)
    for name in (BLOCK_A, BLOCK_B):  # the direct key, then the canonical one
        target = out(sandbox)
        sandbox.wrap(env, name, target, via_shim=True).check()
        assert target.read_bytes() == reference_neff(BLOCK_A)
        line = read_run_manifest(sandbox.root / "run.jsonl")[-1]
        assert (line["result"], line["source"]) == ("hit", "l1"), name
        assert is_daemon(line["pid"], sockets), f"{name}: served by the shim itself"
    assert sandbox.compiles() == 1
    assert len(read_run_manifest(sandbox.root / "run.jsonl")) == 3


def test_the_children_that_send_a_hits_events_are_collected(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    l1 = sandbox.new_dir("l1")
    env = daemon_env(sandbox, server, sockets, l1, NEFFCACHE_DAEMON_WORKERS="1")
    sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    until("no daemon started", lambda: socket_in(sockets) is not None and daemons(sockets))
    for _ in range(5):
        sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    served = read_run_manifest(sandbox.root / "run.jsonl")[1:]
    assert all(is_daemon(line["pid"], sockets) for line in served)
    zombies = children_states(sockets).count("Z")
    assert zombies <= 1, "the hits' telemetry children were left as zombies"


def test_a_server_hit_is_the_daemons_too(server: Server, sandbox: Sandbox, sockets: Path) -> None:
    started(sandbox, server, sockets, sandbox.new_dir("l1"))
    target = out(sandbox)
    env = daemon_env(sandbox, server, sockets, sandbox.new_dir("l1"))  # an empty L1
    sandbox.wrap(env, BLOCK_A, target, via_shim=True).check()
    assert target.read_bytes() == reference_neff(BLOCK_A)
    line = read_run_manifest(sandbox.root / "run.jsonl")[-1]
    assert (line["result"], line["source"]) == ("hit", "server")
    assert is_daemon(line["pid"], sockets)
    assert sandbox.compiles() == 1


def test_a_miss_is_declined_and_compiled_by_the_shim_once(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    l1 = sandbox.new_dir("l1")
    started(sandbox, server, sockets, l1)
    target = out(sandbox)
    sandbox.wrap(daemon_env(sandbox, server, sockets, l1), VARIANT, target, via_shim=True).check()
    assert target.read_bytes() == reference_neff(VARIANT)
    assert sandbox.compiles() == 2
    lines = read_run_manifest(sandbox.root / "run.jsonl")
    assert [line["result"] for line in lines] == ["miss", "miss"], "a declined call left a line"
    assert not is_daemon(lines[-1]["pid"], sockets)


def test_the_callers_compile_environment_keys_the_hit(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    """The daemon keys with the request's environment, not its own: a variable that
    changes the NEFF makes another key, so the entry compiled without it is not served."""
    l1 = sandbox.new_dir("l1")
    started(sandbox, server, sockets, l1)
    variable = sorted(ENV_ALLOWLIST)[0]
    env = daemon_env(sandbox, server, sockets, l1, **{variable: "1"})
    sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    assert sandbox.compiles() == 2, f"{variable}=1 was served the NEFF compiled without it"
    sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    assert sandbox.compiles() == 2
    assert is_daemon(read_run_manifest(sandbox.root / "run.jsonl")[-1]["pid"], sockets)


def test_relative_paths_are_the_callers(server: Server, sandbox: Sandbox, sockets: Path) -> None:
    l1 = sandbox.new_dir("l1")
    started(sandbox, server, sockets, l1)
    cwd = sandbox.new_dir("work")
    shutil.copy(hlo(BLOCK_A), cwd / "graph.pb")
    (cwd / "out").mkdir()
    args = ["compile", "--framework=XLA", "graph.pb", "--output", "out/model.neff"]
    done = sandbox.run(
        ["neuronx-cc", *args, "--target=trn1", "--model-type=transformer"],
        daemon_env(sandbox, server, sockets, l1),
        cwd=cwd,
    )
    done.check()
    assert (cwd / "out" / "model.neff").read_bytes() == reference_neff(BLOCK_A)
    assert is_daemon(read_run_manifest(sandbox.root / "run.jsonl")[-1]["pid"], sockets)


def test_a_directory_others_can_write_is_never_used(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    l1 = sandbox.new_dir("l1")
    started(sandbox, server, sockets, l1)
    sockets.chmod(0o770)
    sandbox.wrap(daemon_env(sandbox, server, sockets, l1), BLOCK_A, out(sandbox), via_shim=True)
    line = read_run_manifest(sandbox.root / "run.jsonl")[-1]
    assert line["result"] == "hit"
    assert not is_daemon(line["pid"], sockets)


def test_a_dead_daemons_socket_is_replaced(server: Server, sandbox: Sandbox, sockets: Path) -> None:
    l1 = sandbox.new_dir("l1")
    started(sandbox, server, sockets, l1)
    stop_daemons(sockets)
    dead = socket_in(sockets)
    assert dead is not None, "SIGKILL removed the socket"
    old = dead.stat().st_ino
    Path(f"{dead}.lock").write_text("0")  # started long ago: no back-off holds the start
    env = daemon_env(sandbox, server, sockets, l1)
    sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    line = read_run_manifest(sandbox.root / "run.jsonl")[-1]
    assert line["result"] == "hit"
    assert not is_daemon(line["pid"], sockets)
    until("no new daemon", lambda: dead.exists() and dead.stat().st_ino != old)
    sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    assert is_daemon(read_run_manifest(sandbox.root / "run.jsonl")[-1]["pid"], sockets)


def test_an_idle_daemon_leaves_and_removes_its_socket(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    env = daemon_env(sandbox, server, sockets, sandbox.new_dir("l1"), NEFFCACHE_DAEMON_IDLE="0.5")
    sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    until("no daemon started", lambda: bool(daemons(sockets)))
    until("the idle daemon stayed", lambda: not daemons(sockets))
    assert socket_in(sockets) is None


def test_off_starts_none(server: Server, sandbox: Sandbox, sockets: Path) -> None:
    env = daemon_env(sandbox, server, sockets, sandbox.new_dir("l1"), NEFFCACHE_DAEMON="0")
    for _ in range(2):
        sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    assert list(sockets.iterdir()) == []
    assert daemons(sockets) == []
