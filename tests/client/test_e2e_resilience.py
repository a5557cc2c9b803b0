"""End to end: never fail, never hang, never serve wrong bytes (black-box).

A server that never answers costs each process of a host at most one request, then
the back-off skips it: that is counted (the connections a silent server accepted),
not timed, since a loaded machine makes every run slower. Times are checked only
against ``HANG``, far from a correct run (a few seconds) and close to none: a run
that waits for an answer that never comes.

Readings of the specification these tests commit to (beyond its letter):

* After a failed request the server counts as down for ``NEFFCACHE_BACKOFF`` (default
  60 s) in that process, so the publish after a local compile is not attempted and adds
  nothing to the bound; a run's exit waits at most ``NEFFCACHE_PUBLISH_WAIT``.
* Bytes are checked on the client, not only on the server: a proxy that flips a byte
  in every blob it forwards must not get its bytes served (the server itself refuses
  to serve a corrupted blob file, so the file test alone would not show that).
* A failed compile through the hook is not replayed from the same L1 directory either
  (a failure never blocks a later compile).
* Eight wrappers racing for one graph on one host: one compile, and the run manifest
  they share has one miss and seven hits.
* A killed lock holder blocks nobody, through the hook as through the wrapper.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.e2e import (
    BLOCK_A,
    OTHER,
    VARIANT,
    CorruptingProxy,
    Running,
    Sandbox,
    Server,
    SilentServer,
    blake3_hex,
    cache_url,
    kill_pid,
    read_run_manifest,
    read_training,
    reference_neff,
    stock_address,
    wait_for,
)

pytestmark = pytest.mark.e2e

CONNECT_TIMEOUT = 0.5
REQUEST_TIMEOUT = 1.0
HANG = 60.0


def _out(sandbox: Sandbox) -> Path:
    return sandbox.new_dir("out") / "model.neff"


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.chmod(0o644)
    with path.open("r+b") as f:
        f.write(bytes(data))


@pytest.fixture
def proxy(server: Server) -> Iterator[CorruptingProxy]:
    running = CorruptingProxy(server.url)
    yield running
    running.close()


# --- an unreachable, silent or dying server -------------------------------------------


def test_unreachable_server_wrapper_compiles_within_bound(
    sandbox: Sandbox, unused_port: int
) -> None:
    delay = 0.5
    extra = {
        "NEFFCACHE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        "NEFFCACHE_STANDIN_DELAY": str(delay),
    }
    url = cache_url(unused_port, sandbox.namespace)
    for name in (BLOCK_A, VARIANT):
        out = _out(sandbox)
        done = sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url, extra=extra), name, out)
        done.check()
        assert done.seconds < HANG, done.describe()
        assert out.read_bytes() == reference_neff(name)
    assert sandbox.compiles() == 2


def test_unreachable_server_training_run_compiles_within_bound(
    sandbox: Sandbox, unused_port: int
) -> None:
    delay = 0.5
    names = [BLOCK_A, VARIANT]
    extra = {
        "NEFFCACHE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        "NEFFCACHE_STANDIN_DELAY": str(delay),
        "NEFFCACHE_PUBLISH_WAIT": "2",
    }
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=cache_url(unused_port, sandbox.namespace),
        hook=True,
        shim=True,
        extra=extra,
    )
    run = sandbox.train(env, names)
    run.done.check()
    assert run.neffs == [reference_neff(name) for name in names]
    assert sandbox.compiles() == 2
    assert run.done.seconds < HANG, run.done.describe()


def test_silent_server_wrapper_is_bounded_by_the_request_timeout(
    sandbox: Sandbox, silent_server: SilentServer
) -> None:
    delay = 0.3
    extra = {
        "NEFFCACHE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        "NEFFCACHE_TIMEOUT": str(REQUEST_TIMEOUT),
        "NEFFCACHE_STANDIN_DELAY": str(delay),
    }
    url = cache_url(silent_server.port, sandbox.namespace)
    out = _out(sandbox)
    done = sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url, extra=extra), BLOCK_A, out)
    done.check()
    # One request waited for the silent server; then it was skipped.
    assert silent_server.accepted == 1, done.describe()
    assert done.seconds < HANG, done.describe()
    assert out.read_bytes() == reference_neff(BLOCK_A)
    assert sandbox.compiles() == 1


def test_silent_server_training_run_is_bounded_by_the_request_timeout(
    sandbox: Sandbox, silent_server: SilentServer
) -> None:
    delay = 0.3
    names = [BLOCK_A, VARIANT]
    extra = {
        "NEFFCACHE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        "NEFFCACHE_TIMEOUT": str(REQUEST_TIMEOUT),
        "NEFFCACHE_STANDIN_DELAY": str(delay),
        "NEFFCACHE_PUBLISH_WAIT": "2",
    }
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=cache_url(silent_server.port, sandbox.namespace),
        hook=True,
        shim=True,
        extra=extra,
    )
    run = sandbox.train(env, names)
    run.done.check()
    # At most one request per process (the hook's and the wrapper's) waited for the
    # silent server; then both skipped it, for every graph after.
    assert 1 <= silent_server.accepted <= 2, run.done.describe()
    assert run.neffs == [reference_neff(name) for name in names]
    assert sandbox.compiles() == 2
    assert run.done.seconds < HANG, run.done.describe()


def test_server_killed_between_graphs_the_run_completes_by_compiling(
    private_server: Server, sandbox: Sandbox
) -> None:
    delay = 0.3
    names = [BLOCK_A, VARIANT, OTHER]
    publish_wait = 2.0
    extra = {
        "NEFFCACHE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        "NEFFCACHE_STANDIN_DELAY": str(delay),
        "NEFFCACHE_PUBLISH_WAIT": str(publish_wait),
    }
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=private_server.cache_url(sandbox.namespace),
        hook=True,
        shim=True,
        extra=extra,
    )
    out = sandbox.new_dir("neffs")
    ready, resume = sandbox.root / "ready", sandbox.root / "resume"
    argv = sandbox.train_argv(
        names, out, "--pause-after", "1", "--ready", str(ready), "--resume", str(resume)
    )
    running = sandbox.start(argv, env)
    wait_for(lambda: ready.exists() or running.poll() is not None, 60, "the first graph")
    assert ready.exists(), running.wait(0).describe()

    private_server.kill()
    resumed = time.monotonic()
    resume.touch()
    done = running.wait(60)
    finished = running.started + done.seconds
    run = read_training(done, out, names)

    done.check()
    assert run.neffs == [reference_neff(name) for name in names]
    assert sandbox.compiles() == 3
    # The last two graphs, then at most the publish wait at exit: nothing waits for
    # the dead server.
    assert finished - resumed < HANG, done.describe()


# --- wrong bytes ----------------------------------------------------------------------


@pytest.mark.parametrize("via", ["wrapper", "hook"])
def test_corrupted_blob_on_the_server_is_recompiled_not_served(
    private_server: Server, sandbox: Sandbox, via: str
) -> None:
    url = private_server.cache_url(sandbox.namespace)
    neff = reference_neff(BLOCK_A)

    def run(l1: Path) -> bytes:
        if via == "wrapper":
            out = _out(sandbox)
            sandbox.wrap(sandbox.env(l1=l1, url=url), BLOCK_A, out).check()
            return out.read_bytes()
        training = sandbox.train(sandbox.env(l1=l1, url=url, hook=True), [BLOCK_A])
        training.done.check()
        return training.neffs[0]

    assert run(sandbox.new_dir("l1")) == neff
    assert sandbox.compiles() == 1
    blob = private_server.blob_path(blake3_hex(neff))
    assert blob.is_file(), f"the NEFF was not published as blob {blob.name}"
    flip_a_byte(blob)

    l1 = sandbox.new_dir("l1")
    assert run(l1) == neff, "corrupted bytes were served"
    assert sandbox.compiles() == 2
    if via == "hook":
        assert (l1 / stock_address(BLOCK_A) / "model.neff").read_bytes() == neff


def test_bytes_corrupted_in_transit_are_recompiled_not_served(
    server: Server, proxy: CorruptingProxy, sandbox: Sandbox
) -> None:
    neff = reference_neff(BLOCK_A)
    direct = server.cache_url(sandbox.namespace)
    sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=direct), BLOCK_A, _out(sandbox)).check()
    assert sandbox.compiles() == 1

    through_proxy = cache_url(proxy.port, sandbox.namespace)
    out = _out(sandbox)
    sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=through_proxy), BLOCK_A, out).check()
    assert proxy.corrupted >= 1, "the client never fetched the blob through the proxy"
    assert out.read_bytes() == neff, "bytes that fail their BLAKE3 check were served"
    assert sandbox.compiles() == 2


# --- failures -------------------------------------------------------------------------


def test_failed_compile_through_the_hook_is_not_replayed(server: Server, sandbox: Sandbox) -> None:
    url = server.cache_url(sandbox.namespace)
    l1 = sandbox.new_dir("l1")
    failing = sandbox.env(l1=l1, url=url, hook=True, extra={"NEFFCACHE_STANDIN_FAIL": "1"})
    failed = sandbox.train(failing, [BLOCK_A])
    assert failed.done.returncode not in (0, None), failed.done.describe()
    assert sandbox.compiles() == 1

    # The same L1 directory, the failure cleared: it compiles again.
    ok = sandbox.train(sandbox.env(l1=l1, url=url, hook=True), [BLOCK_A])
    ok.done.check()
    assert sandbox.compiles() == 2
    assert ok.neffs == [reference_neff(BLOCK_A)]

    # A fresh host gets the success.
    again = sandbox.train(sandbox.env(l1=sandbox.new_dir("l1"), url=url, hook=True), [BLOCK_A])
    again.done.check()
    assert sandbox.compiles() == 2
    assert again.neffs == [reference_neff(BLOCK_A)]


# --- concurrency on one host ----------------------------------------------------------


def test_eight_processes_one_graph_one_compile(server: Server, sandbox: Sandbox) -> None:
    delay = 2.0
    manifest = sandbox.root / "run-manifest.jsonl"
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=server.cache_url(sandbox.namespace),
        extra={"NEFFCACHE_STANDIN_DELAY": str(delay), "NEFFCACHE_RUN_MANIFEST": str(manifest)},
    )
    outs = [_out(sandbox) for _ in range(8)]
    running = [sandbox.start(sandbox.wrap_argv(BLOCK_A, out), env) for out in outs]
    results = [r.wait(60) for r in running]

    for done in results:
        done.check()
    assert sandbox.compiles() == 1, sandbox.invocations()
    neff = reference_neff(BLOCK_A)
    assert all(out.read_bytes() == neff for out in outs)
    records = read_run_manifest(manifest)
    assert len(records) == 8, records
    assert sorted(r["result"] for r in records) == ["hit"] * 7 + ["miss"]


@pytest.mark.parametrize("via", ["wrapper", "hook"])
def test_killed_lock_holder_does_not_block_the_next_process(
    server: Server, sandbox: Sandbox, via: str
) -> None:
    url = server.cache_url(sandbox.namespace)
    l1 = sandbox.new_dir("l1")
    pids = sandbox.new_dir("compiler-pids")
    slow = {"NEFFCACHE_STANDIN_DELAY": "30", "NEFFCACHE_STANDIN_PIDFILE_DIR": str(pids)}

    holder: Running
    if via == "wrapper":
        holder = sandbox.start(
            sandbox.wrap_argv(BLOCK_A, _out(sandbox)), sandbox.env(l1=l1, url=url, extra=slow)
        )
    else:
        holder = sandbox.start(
            sandbox.train_argv([BLOCK_A], sandbox.new_dir("neffs")),
            sandbox.env(l1=l1, url=url, hook=True, extra=slow),
        )
    wait_for(lambda: any(pids.iterdir()) or holder.poll() is not None, 30, "the compiler to start")
    assert any(pids.iterdir()), holder.wait(0).describe()
    compiler_pid = int(next(pids.iterdir()).name)
    kill_pid(holder.pid)
    kill_pid(compiler_pid)
    holder.wait(10)

    # A stock entry lock left behind fails the run after 12 s instead of 20.
    lock_timeout = {"NEFFCACHE_STANDIN_LOCK_TIMEOUT": "12"}
    if via == "wrapper":
        out = _out(sandbox)
        done = sandbox.wrap(sandbox.env(l1=l1, url=url), BLOCK_A, out, timeout=30)
        assert done.returncode == 0, done.describe()
        neff = out.read_bytes()
    else:
        env = sandbox.env(l1=l1, url=url, hook=True, extra=lock_timeout)
        run = sandbox.train(env, [BLOCK_A], timeout=30)
        done = run.done
        assert done.returncode == 0, done.describe()
        neff = run.neffs[0]
    # Finished at all (within its 30 s wait): a lock the killed holder kept would
    # hold it for ever, and a stock lock left behind fails the run after 12 s.
    assert neff == reference_neff(BLOCK_A)
    assert sandbox.compiles() == 2
