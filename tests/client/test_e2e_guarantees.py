"""End to end: the client's guarantees (docs/client.md, "Never fail, never hang, never
serve wrong bytes" and "What each point cannot see"), black-box.

Like the other test_e2e_*.py files, nothing here imports ``neffcache.client``: the
wrapper runs as ``neffcache wrap``, the hook in train_like.py with the stand-in
``libneuronxla``, against the session's ``neffcache serve``.

* Ranks waiting on the lock of a compile that fails get its failure instead of
  repeating the compile, through the wrapper and through the hook; a later run
  compiles again.
* The back-off after a server error is shared by the processes on one host through
  L1 (the wrapper is a new process per graph), and only through L1.
* An entry found by its stock address is used only under the same compile-affecting
  environment (``XLA_FLAGS``).
* The wrapper never publishes under a stock address whose flags hash is not that of
  the call's own flags.
* An L1 directory that cannot be created is replaced by a private one, with a warning.
* ``--enable-internal-neff-wrapper`` compiles are never cached.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from support.e2e import (
    BLOCK_A,
    NEFFCACHE,
    OTHER,
    STANDIN_VERSION,
    VARIANT,
    Done,
    Running,
    Sandbox,
    Server,
    SilentServer,
    cache_url,
    hlo,
    read_run_manifest,
    reference_neff,
    stock_address,
)

pytestmark = pytest.mark.e2e

# The stand-in compiler's failure (tests/standins/neuronx-cc): its stderr and exit code.
COMPILER_ERROR = "[ERROR] [NCC_STANDIN001] Compilation of"
EXIT_COMPILE_FAILED = 70
# The stand-in libneuronxla's messages (tests/standins/libneuronxla/neuron_cc_wrapper.py).
CACHED_FAILURE = "Got a cached failed neff"
HOLDER_FAILURE = "Compilation failed for"
XLA_FLAGS = "--xla_cpu_enable_fast_math=false"


def _out(sandbox: Sandbox) -> Path:
    return sandbox.new_dir("out") / "model.neff"


def _all_done(running: list[Running], timeout: float = 60) -> list[Done]:
    return [r.wait(timeout) for r in running]


# --- waiters get the holder's failure ---------------------------------------------


def test_wrapper_waiters_replay_the_holders_failure(server: Server, sandbox: Sandbox) -> None:
    manifest = sandbox.root / "run-manifest.jsonl"
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=server.cache_url(sandbox.namespace),
        extra={
            "NEFFCACHE_STANDIN_FAIL": "1",
            "NEFFCACHE_STANDIN_DELAY": "1.5",
            "NEFFCACHE_RUN_MANIFEST": str(manifest),
        },
    )
    running = [sandbox.start(sandbox.wrap_argv(BLOCK_A, _out(sandbox)), env) for _ in range(3)]
    results = _all_done(running)

    for done in results:
        assert done.returncode == EXIT_COMPILE_FAILED, done.describe()
        # The holder's from its compiler, the waiters' replayed from the holder's.
        assert COMPILER_ERROR in done.stderr, done.describe()
    assert sandbox.compiles() == 1, sandbox.invocations()
    records = read_run_manifest(manifest)
    assert len(records) == 3, records
    replayed = [r for r in records if r["fallback"] is not None]
    assert len(replayed) == 2, records
    assert all(r["exit_code"] == EXIT_COMPILE_FAILED for r in records), records
    assert all(r["events"].get("failures_replayed") == 1 for r in replayed), records

    # After all of them: a failure is never served to a later run, which compiles.
    later = sandbox.wrap(env, BLOCK_A, _out(sandbox))
    assert later.returncode == EXIT_COMPILE_FAILED, later.describe()
    assert COMPILER_ERROR in later.stderr
    assert sandbox.compiles() == 2, sandbox.invocations()
    assert read_run_manifest(manifest)[-1]["fallback"] is None


def test_hook_waiters_replay_the_holders_failure(server: Server, sandbox: Sandbox) -> None:
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=server.cache_url(sandbox.namespace),
        hook=True,
        extra={"NEFFCACHE_STANDIN_FAIL": "1", "NEFFCACHE_STANDIN_DELAY": "1.5"},
    )
    running = [
        sandbox.start(sandbox.train_argv([BLOCK_A], sandbox.new_dir("neffs")), env)
        for _ in range(3)
    ]
    results = _all_done(running)

    for done in results:
        assert done.returncode not in (0, None), done.describe()
    assert sandbox.compiles() == 1, sandbox.invocations()
    holders = [d for d in results if HOLDER_FAILURE in d.stderr]
    waiters = [d for d in results if CACHED_FAILURE in d.stderr]
    assert len(holders) == 1, [d.describe() for d in results]
    assert len(waiters) == 2, [d.describe() for d in results]
    assert all(HOLDER_FAILURE not in d.stderr for d in waiters)

    # After all of them: the same L1, and the failure is not replayed.
    later = sandbox.train(env, [BLOCK_A])
    assert later.done.returncode not in (0, None), later.done.describe()
    assert CACHED_FAILURE not in later.done.stderr, later.done.describe()
    assert HOLDER_FAILURE in later.done.stderr, later.done.describe()
    assert sandbox.compiles() == 2, sandbox.invocations()


# --- the back-off is shared through L1 -----------------------------------------------


def test_back_off_is_shared_by_the_processes_of_one_l1(
    sandbox: Sandbox, silent_server: SilentServer
) -> None:
    timeout = 1.0
    url = cache_url(silent_server.port, sandbox.namespace)
    extra = {"NEFFCACHE_TIMEOUT": str(timeout), "NEFFCACHE_CONNECT_TIMEOUT": "0.5"}

    def run(l1: Path, name: str) -> Done:
        """One graph through the wrapper; another graph each time, so none is in L1."""
        out = _out(sandbox)
        done = sandbox.wrap(sandbox.env(l1=l1, url=url, extra=extra), name, out).check()
        assert out.read_bytes() == reference_neff(name)
        return done

    l1 = sandbox.new_dir("l1")
    first = run(l1, BLOCK_A)
    tried = silent_server.accepted
    assert tried >= 1, "the first run never tried the server"
    assert first.seconds >= timeout, first.describe()

    # Counted, not timed: the silent server's connections are the requests that waited.
    run(l1, VARIANT)
    assert silent_server.accepted == tried, "the second run asked the server again"

    run(sandbox.new_dir("l1"), OTHER)  # another L1: another host, as far as it knows
    assert silent_server.accepted > tried, "the run with another L1 did not ask the server"
    assert sandbox.compiles() == 3, sandbox.invocations()


# --- an address hit needs the same environment ---------------------------------------


def test_address_hits_need_the_same_compile_environment(server: Server, sandbox: Sandbox) -> None:
    url = server.cache_url(sandbox.namespace)
    neff = reference_neff(BLOCK_A)

    def run(xla_flags: str | None) -> None:
        env = sandbox.env(
            l1=sandbox.new_dir("l1"), url=url, hook=True, extra={"XLA_FLAGS": xla_flags}
        )
        training = sandbox.train(env, [BLOCK_A])
        training.done.check()
        assert training.neffs == [neff]

    run(XLA_FLAGS)
    assert sandbox.compiles() == 1
    published = server.alias(sandbox.namespace, stock_address(BLOCK_A))
    assert published is not None, "run 1 did not publish under the stock address"
    assert published["components"]["env"] == {"XLA_FLAGS": XLA_FLAGS}

    run(None)  # the same stock address, another environment: compiles
    assert sandbox.compiles() == 2

    run(XLA_FLAGS)  # the same environment as run 1: its entry serves
    assert sandbox.compiles() == 2


# --- the wrapper claims only addresses of its own flags -------------------------------


@pytest.mark.parametrize(
    ("flags", "claimed"),
    [
        (["--model-type=transformer", "--optlevel=1"], False),
        (["--model-type=transformer"], True),
    ],
    ids=["other-flags", "own-flags"],
)
def test_wrapper_claims_a_stock_address_only_with_its_own_flags_hash(
    server: Server, sandbox: Sandbox, flags: list[str], claimed: bool
) -> None:
    address = f"neuronxcc-{STANDIN_VERSION}/MODULE_77+3cc9a3cb"
    work = sandbox.new_dir("work")
    source = work / "model.MODULE_77+3cc9a3cb.hlo_module.pb"
    shutil.copyfile(hlo(BLOCK_A), source)
    out = _out(sandbox)
    manifest = sandbox.root / "run-manifest.jsonl"
    l1 = sandbox.new_dir("l1")
    # libneuronxla writes the HLO into its entry (the hook's L1) before it compiles:
    # that entry is what vouches for the address, not the file's name.
    (l1 / address).mkdir(parents=True)
    shutil.copyfile(source, l1 / address / "model.hlo_module.pb")
    env = sandbox.env(
        l1=l1,
        url=server.cache_url(sandbox.namespace),
        extra={"NEFFCACHE_RUN_MANIFEST": str(manifest)},
    )
    argv = [*NEFFCACHE, "wrap", "--", "neuronx-cc", "compile", "--framework=XLA", str(source)]
    argv += ["--output", str(out), "--target=trn1", *flags]
    sandbox.run(argv, env).check()
    assert sandbox.compiles() == 1
    (record,) = read_run_manifest(manifest)
    assert server.entry(sandbox.namespace, record["key"]) is not None, "nothing was published"

    status = server.get(f"/v1/ns/{sandbox.namespace}/aliases/{address}").status_code
    if claimed:
        assert status == 200
        assert record["neuron_address"] == address
    else:
        assert status == 404
        assert record["neuron_address"] is None


def test_a_name_alone_claims_no_stock_address(server: Server, sandbox: Sandbox) -> None:
    """An SDK-style name over other bytes (an HLO edited in the SDK's work directory and
    compiled again by hand) must not publish under the original graph's address: the
    hook, which looks addresses up first, would serve it to every job of that graph."""
    address = f"neuronxcc-{STANDIN_VERSION}/MODULE_77+3cc9a3cb"
    work = sandbox.new_dir("work")
    source = work / "model.MODULE_77+3cc9a3cb.hlo_module.pb"
    shutil.copyfile(hlo(OTHER), source)
    l1 = sandbox.new_dir("l1")
    (l1 / address).mkdir(parents=True)
    shutil.copyfile(hlo(BLOCK_A), l1 / address / "model.hlo_module.pb")  # the SDK's graph
    manifest = sandbox.root / "run-manifest.jsonl"
    env = sandbox.env(
        l1=l1,
        url=server.cache_url(sandbox.namespace),
        extra={"NEFFCACHE_RUN_MANIFEST": str(manifest)},
    )
    argv = [*NEFFCACHE, "wrap", "--", "neuronx-cc", "compile", "--framework=XLA", str(source)]
    argv += ["--output", str(_out(sandbox)), "--target=trn1", "--model-type=transformer"]
    sandbox.run(argv, env).check()
    (record,) = read_run_manifest(manifest)
    assert record["neuron_address"] is None
    assert server.get(f"/v1/ns/{sandbox.namespace}/aliases/{address}").status_code == 404


# --- an L1 that cannot be written ----------------------------------------------------


@pytest.mark.parametrize("shim", [False, True], ids=["hook", "hook+shim"])
def test_an_l1_that_cannot_be_created_is_read_only(
    server: Server, sandbox: Sandbox, shim: bool
) -> None:
    """The job compiles as without neffcache; the SDK's cache works in the process's
    staging directory, gone when it exits."""
    blocker = sandbox.root / "not-a-directory"
    blocker.write_text("a regular file: nothing can be created below it, even by root\n")
    env = sandbox.env(
        l1=blocker / "l1", url=server.cache_url(sandbox.namespace), hook=True, shim=shim
    )
    training = sandbox.train(env, [BLOCK_A])
    training.done.check()
    assert training.neffs == [reference_neff(BLOCK_A)]
    stderr = training.done.stderr
    found = re.search(r"is read-only: .* the SDK's cache works in (\S+) until", stderr)
    assert found is not None, training.done.describe()
    assert not Path(found[1]).exists(), "the staging directory outlived its process"
    assert [p.name for p in Path(env["TMPDIR"]).iterdir() if "neffcache" in p.name] == []
    assert sandbox.compiles() == 1


# --- --enable-internal-neff-wrapper is never cached ----------------------------------


def test_internal_neff_wrapper_compiles_are_never_cached(server: Server, sandbox: Sandbox) -> None:
    l1 = sandbox.new_dir("l1")
    env = sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace))
    outputs: list[bytes] = []
    for _ in range(2):
        out = _out(sandbox)
        argv = [*sandbox.wrap_argv(BLOCK_A, out), "--enable-internal-neff-wrapper"]
        sandbox.run(argv, env).check()
        outputs.append(out.read_bytes())
    assert sandbox.compiles() == 2, sandbox.invocations()
    assert outputs[0] == outputs[1]
    assert outputs[0].startswith(b"STANDIN-NEFF\n")
    assert not (l1 / ".neffcache" / "keys").exists(), "the wrapper kept the NEFF in L1"
    # Not even asked for its version: the call went to the compiler untouched.
    assert len(sandbox.invocations()) == 2, sandbox.invocations()


def test_the_same_compile_without_the_flag_is_cached(server: Server, sandbox: Sandbox) -> None:
    """The control for the test above: the same two runs without the flag compile once."""
    env = sandbox.env(l1=sandbox.new_dir("l1"), url=server.cache_url(sandbox.namespace))
    for _ in range(2):
        sandbox.wrap(env, BLOCK_A, _out(sandbox)).check()
    assert sandbox.compiles() == 1, sandbox.invocations()
