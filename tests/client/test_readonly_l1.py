"""A read-only L1: an image baked with L1 entries by the normal client, then declared
read-only (``NEFFCACHE_LOCAL_READ_ONLY=1``) or made unwritable. Its entries are served
without a server, verified as any L1's; nothing is written to it; a miss compiles;
nothing is left in the temporary directory.

The end-to-end tests, like the other test_e2e_*.py files, drive real processes through
the stand-ins; the unit tests at the end call ``neffcache.client.local`` directly.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.e2e import (
    BLOCK_A,
    VARIANT,
    Sandbox,
    Server,
    cache_url,
    read_run_manifest,
    reference_neff,
)

from neffcache.client.config import ClientConfig
from neffcache.client.l1limit import grew
from neffcache.client.local import (
    LocalStore,
    atomic_write,
    copy_atomic,
    l1_read_only,
    link_entry,
    staging_dir,
    staging_parent,
)
from neffcache.client.stats import STATS

AS_ROOT = os.geteuid() == 0
ROOT_WRITES_ANYWAY = "root writes whatever the permissions say: the declared variant covers it"


def snapshot(top: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and directory under ``top``: (mode, size, modification time)."""
    found = {}
    for path in [top, *top.rglob("*")]:
        status = path.lstat()
        found[str(path.relative_to(top))] = (status.st_mode, status.st_size, status.st_mtime_ns)
    return found


def freeze(l1: Path, how: str) -> dict[str, str]:
    """Make ``l1`` read-only ``how``; the environment that says so."""
    if how == "declared":
        return {"NEFFCACHE_LOCAL_READ_ONLY": "1"}
    for path in [l1, *l1.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)
    return {}


@pytest.fixture
def thaw(sandbox: Sandbox) -> Iterator[None]:
    """Writable again at the end, so that the test's directories can be removed."""
    yield
    for path in sandbox.root.rglob("*"):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)


def run_graphs(sandbox: Sandbox, env: dict[str, str], point: str, names: list[str]) -> list[bytes]:
    """Each graph through the interception point; the NEFFs made."""
    if point == "shim":
        neffs = []
        for name in names:
            out = sandbox.new_dir("out") / "model.neff"
            sandbox.wrap(env, name, out).check()
            neffs.append(out.read_bytes())
        return neffs
    training = sandbox.train(env, names)
    training.done.check()
    return training.neffs


def left_in(tmpdir: str) -> list[str]:
    """What the run left in its temporary directory, but the SDK's own work directory
    (``<TMPDIR>/<user or no-user>/neuroncc_compile_workdir``,
    docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs)."""
    return sorted(p.name for p in Path(tmpdir).iterdir() if p.name != "no-user")


POINTS = [("hook", True, False), ("hook+shim", True, True), ("shim", False, True)]


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["declared", "unwritable"])
@pytest.mark.parametrize(("point", "hook", "shim"), POINTS, ids=[p[0] for p in POINTS])
def test_a_baked_read_only_l1_serves_its_entries_and_compiles_the_rest(
    server: Server,
    sandbox: Sandbox,
    thaw: None,
    unused_port: int,
    point: str,
    hook: bool,
    shim: bool,
    how: str,
) -> None:
    if how == "unwritable" and AS_ROOT:
        pytest.skip(ROOT_WRITES_ANYWAY)
    l1 = sandbox.new_dir("l1")
    baking = sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace), hook=hook, shim=shim)
    assert run_graphs(sandbox, baking, point, [BLOCK_A]) == [reference_neff(BLOCK_A)]
    assert sandbox.compiles() == 1
    declared = freeze(l1, how)
    before = snapshot(l1)

    # No server: nothing listens on the port, so a hit can only be L1's.
    manifest = sandbox.root / "run-manifest.jsonl"
    extra = {**declared, "NEFFCACHE_RUN_MANIFEST": str(manifest)}
    env = sandbox.env(
        l1=l1, url=cache_url(unused_port, sandbox.namespace), hook=hook, shim=shim, extra=extra
    )
    neffs = run_graphs(sandbox, env, point, [BLOCK_A, VARIANT])

    assert neffs == [reference_neff(BLOCK_A), reference_neff(VARIANT)]
    assert sandbox.compiles() == 2  # the baked graph served, the new one compiled
    lines = read_run_manifest(manifest)
    # One counted line per graph: with the shim under the hook too, the hook's line for
    # the graph the shim compiled is delegated (the shim found the SDK's entry).
    served = [(r["result"], r["source"]) for r in lines if r["result"] != "delegated"]
    assert served == [("hit", "l1"), ("miss", "compiler")], lines
    if hook and shim:
        assert [r["via"] for r in lines if r["result"] == "delegated"] == ["hook"], lines
        assert all(r["neuron_address"] for r in lines), lines
    assert snapshot(l1) == before, "the read-only L1 was written"
    assert left_in(env["TMPDIR"]) == []


@pytest.mark.e2e
def test_a_read_only_l1_publishes_its_compiles_and_takes_server_hits_to_output(
    server: Server, sandbox: Sandbox
) -> None:
    """Through the shim: the compile of a read-only host still reaches the server (its
    upload read from --output), and the next host's hit goes from the server straight
    to --output: L1 is never a step on the way."""
    l1 = sandbox.new_dir("l1")
    env = sandbox.env(
        l1=l1, url=server.cache_url(sandbox.namespace), extra={"NEFFCACHE_LOCAL_READ_ONLY": "1"}
    )
    before = snapshot(l1)
    first = sandbox.new_dir("out") / "model.neff"
    sandbox.wrap(env, VARIANT, first).check()
    assert sandbox.compiles() == 1
    second = sandbox.new_dir("out") / "model.neff"
    done = sandbox.wrap(env, VARIANT, second).check()
    assert sandbox.compiles() == 1, done.describe()  # the server's entry served it
    assert first.read_bytes() == second.read_bytes() == reference_neff(VARIANT)
    assert sorted(p.name for p in second.parent.iterdir()) == ["model.neff"]  # no temporaries
    assert snapshot(l1) == before
    assert left_in(env["TMPDIR"]) == []


# --- units ------------------------------------------------------------------------------


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary directory, and a fresh staging state."""
    from neffcache.client import l1access, local

    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    monkeypatch.setattr(local, "_staging", {})
    monkeypatch.setattr(l1access, "_DECLARED_READ_ONLY", set())
    return where


def test_read_only_is_declared_or_found(tmp_path: Path, private_tmp: Path) -> None:
    writable = tmp_path / "l1"
    assert not l1_read_only(writable, declared=False)
    assert writable.is_dir()  # made, as its first write would
    blocker = tmp_path / "file"
    blocker.write_text("nothing can be made below a regular file, even by root")
    assert l1_read_only(blocker / "l1", declared=False)
    assert l1_read_only(writable, declared=True)


@pytest.mark.skipif(AS_ROOT, reason=ROOT_WRITES_ANYWAY)
def test_a_directory_without_write_permission_is_read_only(tmp_path: Path) -> None:
    l1 = tmp_path / "l1"
    (l1 / ".neffcache").mkdir(parents=True)
    (l1 / ".neffcache").chmod(0o555)
    try:
        assert l1_read_only(l1, declared=False)
    finally:
        (l1 / ".neffcache").chmod(0o755)


def test_a_declared_read_only_l1_refuses_writes_as_a_read_only_mount(
    tmp_path: Path, private_tmp: Path
) -> None:
    l1 = tmp_path / "l1"
    (l1 / ".neffcache").mkdir(parents=True)
    source = tmp_path / "source"
    source.write_bytes(b"neff")
    assert l1_read_only(l1, declared=True)
    before = snapshot(l1)
    for write in (
        lambda: atomic_write(l1 / ".neffcache" / "down" / "mark", b"1"),
        lambda: copy_atomic(source, l1 / "neuronxcc-1" / "MODULE_1+2" / "model.neff"),
    ):
        with pytest.raises(OSError, match="read-only") as raised:
            write()
        assert raised.value.errno == errno.EROFS
    atomic_write(tmp_path / "elsewhere" / "file", b"fine")  # outside L1, writes go on
    assert snapshot(l1) == before


def test_a_read_only_store_serves_verified_blobs_and_writes_nothing(tmp_path: Path) -> None:
    import blake3

    l1 = tmp_path / "l1"
    baking = LocalStore(l1)
    good, bad = b"a good neff", b"a neff damaged after it was baked"
    digests = []
    for data in (good, bad):
        source = tmp_path / "source"
        source.write_bytes(data)
        digest = blake3.blake3(data).hexdigest()
        baking.add_blob(source, digest)
        assert baking.put_manifest(digest, {"files": {}})
        digests.append(digest)
    baking.blob_path(digests[1]).write_bytes(b"x" * len(bad))
    old = 1_000_000_000
    for path in l1.rglob("*"):
        os.utime(path, (old, old))
    before = snapshot(l1)

    store = LocalStore(l1, read_only=True)
    before_stats = STATS.snapshot()
    assert store.has_blob(digests[0], len(good))
    assert not store.has_blob(digests[1], len(bad))  # never served, and left as it is
    assert STATS.snapshot().get("bad_local_blobs", 0) == before_stats.get("bad_local_blobs", 0) + 1
    assert not store.put_manifest(digests[0], {"files": {}})
    assert store.acquire("a-key", "a test") is None
    store.note_wrapped("neuronxcc-1/MODULE_1+2")
    with pytest.raises(OSError, match="read-only"):
        store.add_blob(tmp_path / "source", digests[0])
    assert snapshot(l1) == before  # no hit marked, nothing removed or made


def test_a_read_only_l1_is_never_evicted_from(tmp_path: Path) -> None:
    l1 = tmp_path / "l1"
    entry = l1 / "neuronxcc-2.20.9961.0+0acef03a" / "MODULE_1+3cc9a3cb"
    entry.mkdir(parents=True)
    (entry / "model.neff").write_bytes(b"n" * 4096)
    (entry / "model.done").write_bytes(b"")
    (l1 / ".neffcache").mkdir()
    for path in [entry / "model.neff", entry / "model.done", entry]:
        os.utime(path, (1, 1))  # long unused, and over the limit below
    before = snapshot(l1)
    config = ClientConfig.from_env(
        {
            "NEFFCACHE_URL": "neffcache+http://127.0.0.1:1/team-a",
            "NEFFCACHE_LOCAL_DIR": str(l1),
            "NEFFCACHE_LOCAL_MAX_SIZE": "1",
            "NEFFCACHE_LOCAL_READ_ONLY": "1",
        }
    )
    assert config is not None
    assert config.local_read_only
    grew(config)
    assert snapshot(l1) == before
    grew(config._replace(local_read_only=False))  # the control: a writable one is
    assert not (entry / "model.done").exists()


def test_only_a_complete_entry_of_regular_files_is_linked(tmp_path: Path) -> None:
    lower = tmp_path / "lower" / "MODULE_1+2"
    lower.mkdir(parents=True)
    (lower / "model.neff").write_bytes(b"neff")
    (lower / "model.hlo_module.pb").write_bytes(b"hlo")
    (lower / "model.hlo_module.pb.lock").write_bytes(b"")
    (tmp_path / "secret").write_text("not a NEFF")
    (lower / "wrapped_neff.hlo").symlink_to(tmp_path / "secret")
    upper = tmp_path / "upper" / "MODULE_1+2"
    assert not link_entry(lower, upper)  # no model.done: not complete
    assert not upper.exists()
    (lower / "model.done").write_bytes(b"")
    upper.mkdir(parents=True)
    (upper / "model.hlo_module.pb").write_bytes(b"the SDK's own")
    assert link_entry(lower, upper)
    assert sorted(p.name for p in upper.iterdir()) == [
        "model.done",
        "model.hlo_module.pb",
        "model.neff",
    ]
    assert (upper / "model.neff").read_bytes() == b"neff"
    assert (upper / "model.hlo_module.pb").read_bytes() == b"the SDK's own"
    assert os.readlink(upper / "model.done") == str(lower / "model.done")


@pytest.mark.e2e
def test_staging_is_one_directory_per_process_gone_with_it(private_tmp: Path) -> None:
    made = staging_dir()
    assert staging_dir() == made
    assert made.parent == staging_parent()
    assert made.parent.parent == private_tmp
    # A process that ends cleanly takes its own with it (the parent too, once empty
    # but for ours); one that is killed leaves it, and the next process that stages
    # removes it, its flock being free.
    script = (
        "import os, sys; from neffcache.client.local import staging_dir; "
        "print(staging_dir(), flush=True); os._exit(0) if sys.argv[1] == 'killed' else None"
    )
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    for how in ("clean", "killed"):
        run = subprocess.run(
            [sys.executable, "-c", script, how], env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        theirs = Path(run.stdout.strip())
        assert theirs.parent == made.parent
        assert theirs.exists() == (how == "killed"), how
    from neffcache.client import local

    local._staging.clear()
    again = staging_dir()  # this process's next one sweeps the killed one's
    assert sorted(p.name for p in made.parent.iterdir()) == sorted([made.name, again.name])


def test_the_doctor_passes_a_declared_read_only_l1_without_writing_to_it(tmp_path: Path) -> None:
    from neffcache.client.doctor.context import Context
    from neffcache.client.doctor.l1_checks import writable
    from neffcache.client.doctor.model import Status

    l1 = tmp_path / "l1"
    l1.mkdir()
    before = snapshot(l1)
    env = {"NEFFCACHE_LOCAL_DIR": str(l1), "NEFFCACHE_LOCAL_READ_ONLY": "1"}
    result = writable(Context(env))
    assert result.status == Status.PASS
    assert "declared read-only" in result.evidence
    assert snapshot(l1) == before
