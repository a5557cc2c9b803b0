"""The hit daemon (client/daemon.py) in trouble: a compile call comes out as the plain
shim's would whatever the daemon does. A call the shim gave up on (the daemon silent
past NEFFCACHE_DAEMON_WAIT, or the shim interrupted) is never served later; a caller
of another group has its own daemon; an earlier request's settings do not carry over;
a silent daemon is waited for once, not by every call; the code a hit may run is all
watched for an upgrade; a search path the import system tolerates does not stop the
shim. Every test has its own socket directory and stops its daemons at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemons import (
    daemon_env,
    daemons,
    is_daemon,
    out,
    socket_in,
    until,
)
from support.e2e import (
    BLOCK_A,
    Sandbox,
    Server,
    read_run_manifest,
    reference_neff,
)

pytestmark = pytest.mark.e2e


def start_daemon(sandbox: Sandbox, server: Server, sockets: Path, l1: Path, **extra: str) -> None:
    """Compile BLOCK_A through the shim (the shim's own miss) and wait for the daemon
    it starts, with ``extra`` in its environment."""
    env = daemon_env(sandbox, server, sockets, l1, **extra)
    sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
    until(
        "no daemon started",
        lambda: socket_in(sockets) is not None and len(daemons(sockets)) >= 2,
    )


def lines(sandbox: Sandbox) -> list[dict[str, object]]:
    path = sandbox.root / "run.jsonl"
    return read_run_manifest(path) if path.exists() else []


@contextlib.contextmanager
def stopped(sockets: Path) -> Iterator[list[int]]:
    """The daemon's processes SIGSTOPped (a frozen cgroup, a debugger, swap), resumed
    at the end."""
    pids = daemons(sockets)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def settle(sandbox: Sandbox, count: int, seconds: float = 5.0) -> None:
    """Wait (boundedly) for the run manifest to reach ``count`` lines: the daemon's late
    writes, if any, land by then."""
    deadline = time.monotonic() + seconds
    while len(lines(sandbox)) < count and time.monotonic() < deadline:
        time.sleep(0.05)


# -- (3) a request whose caller gave up is still served ------------------------------


def test_a_request_the_shim_gave_up_on_is_not_served_later(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    """A daemon silent past NEFFCACHE_DAEMON_WAIT (stopped, swapping): the shim serves
    itself and the caller goes on using --output. Resumed, the daemon does not serve
    the request it was sent: --output is not rewritten, no second line is written."""
    l1 = sandbox.new_dir("l1")
    start_daemon(sandbox, server, sockets, l1, NEFFCACHE_DAEMON_WORKERS="1")
    env = daemon_env(sandbox, server, sockets, l1, NEFFCACHE_DAEMON_WAIT="1")
    target = out(sandbox)
    with stopped(sockets):
        sandbox.wrap(env, BLOCK_A, target, via_shim=True).check()
        assert target.read_bytes() == reference_neff(BLOCK_A)
        assert len(lines(sandbox)) == 2  # the first miss, this call's hit (the shim's)
        target.write_bytes(b"the caller's next file at this path")
    settle(sandbox, 3)
    assert target.read_bytes() == b"the caller's next file at this path", (
        "the daemon rewrote --output after the call had ended"
    )
    assert len(lines(sandbox)) == 2, f"one call, two lines: {lines(sandbox)[1:]}"


def test_a_shim_interrupted_while_waiting_leaves_no_output(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    """The SDK interrupts a compile (SIGINT, its timeout) while the shim waits for the
    daemon: as for a plain process, nothing appears at --output after the call ended,
    and no hit is recorded for it."""
    l1 = sandbox.new_dir("l1")
    start_daemon(sandbox, server, sockets, l1, NEFFCACHE_DAEMON_WORKERS="1")
    env = daemon_env(sandbox, server, sockets, l1)
    target = out(sandbox)
    with stopped(sockets):
        shim = sandbox.start(sandbox.wrap_argv(BLOCK_A, target, via_shim=True), env)
        until("the shim never waited for the daemon", lambda: waits_on_socket(shim.pid))
        os.kill(shim.pid, signal.SIGINT)
        done = shim.wait(30)
        assert done.returncode != 0
        assert not target.exists()
    settle(sandbox, 2)
    assert not target.exists(), "--output appeared after the interrupted call ended"
    assert len(lines(sandbox)) == 1, f"a hit recorded for an interrupted call: {lines(sandbox)}"


def waits_on_socket(pid: int) -> bool:
    """Whether the shim ``pid`` holds a socket and sleeps in a poll (its answer's)."""
    try:
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
    return any(fd.startswith("socket:") for fd in fds) and "poll" in wchan


# -- (5) the caller's credentials ------------------------------------------------------


@pytest.mark.skipif(os.getuid() != 0, reason="changing the group needs root")
def test_output_is_owned_by_the_callers_group(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    """A caller of the same uid but another group (``sg``, ``newgrp``, a job started
    after the user joined a group): its --output belongs to its group, as the plain
    shim's does (a daemon of other groups is not its daemon: shimclient.named)."""
    l1 = sandbox.new_dir("l1")
    start_daemon(sandbox, server, sockets, l1)
    env = daemon_env(sandbox, server, sockets, l1)
    target = out(sandbox)
    as_group = [
        sys.executable,
        "-c",
        "import os, sys; os.setgroups([]); os.setgid(4242); os.execvp(sys.argv[1], sys.argv[1:])",
    ]
    sandbox.run([*as_group, *sandbox.wrap_argv(BLOCK_A, target, via_shim=True)], env).check()
    line = lines(sandbox)[-1]
    assert line["result"] == "hit"
    assert target.stat().st_gid == 4242, (
        f"--output owned by gid {target.stat().st_gid} (served by the daemon: "
        f"{is_daemon(int(str(line['pid'])), sockets)})"
    )


# -- (5) a worker's state from an earlier request ---------------------------------------


def test_an_earlier_read_only_request_does_not_refuse_a_writable_l1(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    """One job declares the host's L1 read-only (NEFFCACHE_LOCAL_READ_ONLY=1), another
    job of the user does not: the worker that served the first serves the second's
    hit with its --output in the SDK's cache directory (in L1), without a refusal."""
    l1 = sandbox.new_dir("l1")
    start_daemon(sandbox, server, sockets, l1, NEFFCACHE_DAEMON_WORKERS="1")
    read_only = daemon_env(sandbox, server, sockets, l1, NEFFCACHE_LOCAL_READ_ONLY="1")
    sandbox.wrap(read_only, BLOCK_A, out(sandbox), via_shim=True).check()
    assert is_daemon(int(str(lines(sandbox)[-1]["pid"])), sockets)
    writable = daemon_env(sandbox, server, sockets, l1)
    target = l1 / "neuronxcc-x" / "MODULE_1" / "model.neff"  # the SDK's, in its cache
    target.parent.mkdir(parents=True)
    done = sandbox.wrap(writable, BLOCK_A, target, via_shim=True).check()
    assert target.read_bytes() == reference_neff(BLOCK_A)
    assert "read-only" not in done.stderr, done.stderr
    assert is_daemon(int(str(lines(sandbox)[-1]["pid"])), sockets), "declined"


# -- (2) a daemon that does not answer ---------------------------------------------------


def test_a_silent_daemon_is_waited_for_once_not_by_every_call(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    """A daemon that accepts connections but never answers (stopped, deadlocked): the
    first shim waits NEFFCACHE_DAEMON_WAIT, serves itself and marks the daemon silent;
    the next ones do not ask it (shimclient.SILENT_FOR). The second call is given a
    wait longer than its process's time limit: had it asked, it would not finish."""
    l1 = sandbox.new_dir("l1")
    start_daemon(sandbox, server, sockets, l1, NEFFCACHE_DAEMON_WORKERS="1")
    with stopped(sockets):
        env = daemon_env(sandbox, server, sockets, l1, NEFFCACHE_DAEMON_WAIT="1")
        sandbox.wrap(env, BLOCK_A, out(sandbox), via_shim=True).check()
        path = socket_in(sockets)
        assert path is not None
        assert Path(f"{path}.silent").exists(), "the silent daemon was not marked"
        env = daemon_env(sandbox, server, sockets, l1, NEFFCACHE_DAEMON_WAIT="3600")
        second = out(sandbox)
        sandbox.wrap(env, BLOCK_A, second, via_shim=True, timeout=120).check()
        assert second.read_bytes() == reference_neff(BLOCK_A)
    assert sandbox.compiles() == 1


# -- (6) the daemon's code changing on disk ------------------------------------------------

_STAMP_PROBE = """
import json, sys
from pathlib import Path
from neffcache.client.daemon import HIT_PACKAGES, CodeStamp, _warm
stamp = CodeStamp.of_packages(HIT_PACKAGES)
_warm()
before = set(sys.modules)
from neffcache.client.compiler import find_real_compiler  # session._direct's, every hit
from neffcache.client.inputs import read_input
from neffcache.client.keys import context
graph = read_input(Path(sys.argv[1]))
ctx = context("2.20.9961.0+0acef03a", "trn1", ["--target=trn1"], {})
graph.direct(ctx)
graph.canonical(ctx)
loaded = {n: getattr(sys.modules[n], "__file__", None) for n in set(sys.modules) - before}
print(json.dumps({"stamped": sorted(stamp._seen), "loaded": loaded}))
"""


def test_the_code_stamp_covers_the_modules_a_hit_runs() -> None:
    """The daemon leaves when its code changed on disk (CodeStamp): every module a hit
    runs is watched, those it imports on demand too (the canonicalizer, the real
    compiler's version), so that no edit to them goes unnoticed."""
    import json
    import subprocess

    from support.e2e import hlo

    done = subprocess.run(
        [sys.executable, "-c", _STAMP_PROBE, str(hlo(BLOCK_A))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(done.stdout)
    stamped = set(found["stamped"])
    unstamped = sorted(
        name
        for name, where in found["loaded"].items()
        if name.startswith("neffcache") and where is not None and where not in stamped
    )
    assert unstamped == [], f"run by a hit, never checked for changes: {unstamped}"


# -- (1) the shim's own first lines ----------------------------------------------------------


def test_a_search_path_with_a_non_string_entry_still_compiles(
    server: Server, sandbox: Sandbox, sockets: Path
) -> None:
    """``sys.path`` may hold entries that are not strings (a .pth or sitecustomize that
    appends bytes or a Path: the import system ignores them): the shim still serves
    the call, as it does with NEFFCACHE_DAEMON=0."""
    site = sandbox.new_dir("site")
    (site / "sitecustomize.py").write_text("import sys\nsys.path.append(b'/opt/bytes-entry')\n")
    l1 = sandbox.new_dir("l1")
    plain = daemon_env(sandbox, server, sockets, l1, NEFFCACHE_DAEMON="0", PYTHONPATH=str(site))
    sandbox.wrap(plain, BLOCK_A, out(sandbox), via_shim=True).check()
    env = daemon_env(sandbox, server, sockets, l1, PYTHONPATH=str(site))
    target = out(sandbox)
    sandbox.wrap(env, BLOCK_A, target, via_shim=True).check()
    assert target.read_bytes() == reference_neff(BLOCK_A)
