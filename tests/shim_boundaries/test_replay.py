"""The replay of a compile failure to the ranks and hosts that waited for it
(resolver.failed_while_waiting and the lease's Replay outcome, handed back by
Session._replay).

A failure is replayed to every caller whose call has the same canonical key. The key
leaves out what does not change the NEFF (``--output``, ``--logfile``), but a compile
can fail because of exactly those, and a "failure" can be an exit 0 that wrote nothing.

Each test states a boundary the shim must keep and checks it end to end.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from shim_boundaries.support import (
    ARGPARSE_CC,
    COMPILER,
    executable,
    hosts,
    put_hlo,
    reference,
    same_outcome,
)
from support.e2e import BLOCK_A, Sandbox, Server, wait_for

pytestmark = pytest.mark.e2e

SLOW = """
import os, sys, time
if "compile" in sys.argv[1:]:
    started = os.environ.get("ATTACK_STARTED_DIR")
    if started:
        open(os.path.join(started, str(os.getpid())), "w").close()
    time.sleep(float(os.environ.get("ATTACK_SLEEP") or 0))
os.execv(sys.executable, [sys.executable, %r, *sys.argv[1:]])
"""

ARGV = ["compile", "in.pb", "--framework", "XLA", "--target", "trn1", "--model-type=transformer"]


def _slow_compiler(sandbox: Sandbox, tmp_path: Path, target: Path) -> Path:
    source = tmp_path / f"slow-{target.stem}.py"
    source.write_text(SLOW % str(target))
    return executable(sandbox.new_dir("slow"), source)


CASES = {
    "output-dir-missing-on-rank-1": (
        COMPILER,
        ["--output", "no-such-dir/out.neff"],
        ["--output", "out.neff"],
        ["out.neff"],
    ),
    "logfile-dir-missing-on-rank-1": (
        COMPILER,
        ["--output", "out.neff", "--logfile", "no-such-dir/log.txt"],
        ["--output", "out.neff", "--logfile", "log.txt"],
        ["out.neff"],
    ),
    "exit-0-without-output": (
        ARGPARSE_CC,
        ["--output", "out.neff", "--out", "real.neff"],
        ["--output", "out.neff", "--out", "real.neff"],
        ["out.neff", "real.neff"],
    ),
}


@pytest.mark.parametrize(
    ("where", "case"),
    [
        ("same-host", "output-dir-missing-on-rank-1"),
        ("same-host", "logfile-dir-missing-on-rank-1"),
        ("same-host", "exit-0-without-output"),
        ("other-host", "output-dir-missing-on-rank-1"),
        ("other-host", "logfile-dir-missing-on-rank-1"),
    ],
)
def test_a_failure_outside_the_key_is_replayed_to_other_ranks(
    server: Server, sandbox: Sandbox, tmp_path: Path, where: str, case: str
) -> None:
    """Rank 1's compile fails for a reason that is not the graph's: its own
    ``--output`` or ``--logfile`` directory is missing (the stand-in: usage error,
    exit 2), or it exits 0 without writing ``--output`` (an argparse compiler given
    ``--out``). Neither ``--output`` nor ``--logfile`` is in the key, so rank 2 (same
    host: it waited on L1's lock; other host: on the server's lease), with a command
    the compiler runs fine, must not be handed rank 1's outcome (exit 2 and no NEFF,
    or exit 0 and no NEFF): it ends as the same command run alone does."""
    _two_ranks(server, sandbox, tmp_path, where, *CASES[case])


def test_exit_0_without_output_is_not_replayed_across_hosts(
    server: Server, sandbox: Sandbox, tmp_path: Path
) -> None:
    """Across hosts the failure notice of an exit 0 is not replayed (replayable()
    refuses 0): the other host compiles and gets its NEFF."""
    _two_ranks(server, sandbox, tmp_path, "other-host", *CASES["exit-0-without-output"])


def _two_ranks(
    server: Server,
    sandbox: Sandbox,
    tmp_path: Path,
    where: str,
    oracle: Path,
    first: list[str],
    second: list[str],
    names: list[str],
) -> None:
    if (
        where == "other-host"
        and subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"], check=False
        ).returncode
        != 0
    ):
        pytest.skip("needs unshare (a pid namespace) to look like another host")
    slow = _slow_compiler(sandbox, tmp_path, oracle)
    h1, h2 = hosts(server, sandbox, 2, NEFFCACHE_REAL_COMPILER=str(slow))
    started = sandbox.new_dir("started")
    cwd1 = h1.cwd(put_hlo(BLOCK_A))
    rank1 = sandbox.start(
        ["neuronx-cc", *ARGV, *first],
        h1.env(ATTACK_SLEEP="4", ATTACK_STARTED_DIR=str(started)),
        cwd=cwd1,
    )
    wait_for(lambda: any(started.iterdir()), 30, "rank 1's compile to start")
    second_host = h1 if where == "same-host" else h2
    cwd2 = second_host.cwd(put_hlo(BLOCK_A))
    argv2 = ["neuronx-cc", *ARGV, *second]
    if where == "other-host":
        argv2 = ["unshare", "--pid", "--fork", "--mount-proc", *argv2]
    rank2 = sandbox.start(argv2, second_host.env(), cwd=cwd2)
    done1 = rank1.wait(60)
    done2 = rank2.wait(60)
    assert done1.returncode is not None, done1.describe()
    assert done2.returncode is not None, done2.describe()
    ref_cwd = sandbox.new_dir("reference-cwd")
    put_hlo(BLOCK_A)(ref_cwd)
    alone = reference(sandbox, [*ARGV, *second], ref_cwd, compiler=oracle)
    ok, text = same_outcome((done2, cwd2), (alone, ref_cwd), names)
    record = second_host.last() or {}
    assert ok, (
        "rank 2 was given rank 1's outcome for a command the compiler runs fine\n"
        f"{text}\nrank 1 exit {done1.returncode}; rank 2's record: result="
        f"{record.get('result')} fallback={record.get('fallback')} reason={record.get('reason')}"
    )
    shutil.rmtree(started, ignore_errors=True)
