"""Unit tests of the client's guarantees (docs/client.md, "Never fail, never hang,
never serve wrong bytes" and "What each point cannot see"), in-process or in small
child processes:

* the proxy's ``get_hlos`` lists a failed entry as still to compile, unless
  ``NEFFCACHE_STOCK_FAILURES`` asks for the stock behaviour;
* the wrapper dies of the signal its compiler died of;
* a helper process the compiler leaves holding stderr does not hold the wrapper;
* ``--enable-internal-neff-wrapper`` compiles pass through uncached;
* once the compiler ran or ``--output`` is written, a full L1 cannot start a compile;
* a full disk under a blob download is the client's trouble, not the server's.

Children get ``PYTHONPATH`` pointing at the ``neffcache`` sources this process imported,
so they run the same client code as the in-process tests.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import blake3
import pytest
from loopback import free_port
from support.client_units import CLEARED_ENV as _CLEARED
from support.client_units import delta, no_server_down, open_remote
from support.e2e import STANDINS, Server, clean_environ

import neffcache.client
import neffcache.keying
from neffcache.client import remote as remote_module
from neffcache.client.config import ClientConfig
from neffcache.client.proxy import Core
from neffcache.client.session import Session
from neffcache.client.stats import STATS
from neffcache.client.wrapper import main, parse

VERSION = "2.20.9961.0+0acef03a"
HLO_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hlo" / "block_a.pb"
NEFF_BYTES = b"FAKE-NEFF-BYTES\n" * 64


def source_roots() -> str:
    """The directories this process imports ``neffcache.client`` and ``neffcache.keying``
    from, for a child's PYTHONPATH."""
    roots = [
        Path(neffcache.client.__file__).resolve().parents[2],
        Path(neffcache.keying.__file__).resolve().parents[2],
    ]
    return os.pathsep.join(dict.fromkeys(str(r) for r in roots))


def child_env(**extra: str) -> dict[str, str]:
    env = clean_environ()
    env["PYTHONPATH"] = source_roots()
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    no_server_down(monkeypatch)


# --- a fake compiler --------------------------------------------------------------------

_FAKE = """#!{python} -S
import json, os, signal, sys
args = sys.argv[1:]
log = os.environ.get("FAKE_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps(args) + "\\n")
when, _, signum = os.environ.get("FAKE_KILL", "").partition(":")
if args == ["--version"]:
    if when == "all":
        os.kill(os.getpid(), int(signum))
    print("NeuronX Compiler version {version}")
    sys.exit(0)
if when:
    os.kill(os.getpid(), int(signum))
if "--output" in args:
    with open(args[args.index("--output") + 1], "wb") as out:
        out.write({neff!r})
if os.environ.get("FAKE_HELPER"):
    # A helper left running with the compiler's stderr (and stdout pointed at it).
    os.system("sleep 60 >&2 &")
print("fake compiler done", file=sys.stderr)
sys.exit(0)
"""


class FakeCompiler:
    def __init__(self, root: Path) -> None:
        directory = root / "fakebin"
        directory.mkdir()
        self.path = directory / "neuronx-cc"
        self.path.write_text(_FAKE.format(python=sys.executable, version=VERSION, neff=NEFF_BYTES))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)
        self.log = root / "fake-calls.jsonl"

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def compiles(self) -> int:
        return sum(1 for argv in self.calls() if "compile" in argv)


def compile_argv(tmp_path: Path, output: Path, *extra: str) -> list[str]:
    hlo = tmp_path / "in.pb"
    if not hlo.exists():
        hlo.write_bytes(HLO_FIXTURE.read_bytes())
    argv = ["compile", "--framework=XLA", str(hlo), "--output", str(output), "--target=trn1"]
    return [*argv, *extra]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCompiler:
    """The fake as the real compiler, a neffcache URL nothing listens on, a private L1."""
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    compiler = FakeCompiler(tmp_path)
    monkeypatch.setenv("FAKE_LOG", str(compiler.log))
    monkeypatch.setenv("NEFFCACHE_LOCAL_DIR", str(tmp_path / "l1"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("NEFFCACHE_URL", f"neffcache+http://127.0.0.1:{free_port()}/team-a")
    monkeypatch.setenv("NEFFCACHE_REAL_COMPILER", str(compiler.path))
    monkeypatch.setenv("NEFFCACHE_CONNECT_TIMEOUT", "0.5")
    return compiler


# --- get_hlos through the proxy --------------------------------------------------------

_GET_HLOS = """
import json, os
from neffcache.client import hook
hook.install()
from libneuronxla import neuron_cc_cache as ncc

cache = ncc.create_compile_cache(ncc.CacheUrl.get_cache_url())
root = os.environ["NEFFCACHE_LOCAL_DIR"]
version = "neuronxcc-{version}"

def entry(name, *files):
    path = os.path.join(root, version, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model.hlo_module.pb"), "wb") as f:
        f.write(b"hlo")
    with open(os.path.join(path, "compile_flags.json"), "w") as f:
        f.write('["--target=trn1"]')
    for file in files:
        with open(os.path.join(path, file), "w") as f:
            f.write("")
    return os.path.join(path, "model.hlo_module.pb")

report = {{
    "type": type(cache).__name__,
    "failed": entry("MODULE_1+abcdef01", "model.log"),
    "todo": entry("MODULE_2+abcdef01"),
    "done": entry("MODULE_3+abcdef01", "model.neff", "model.done"),
}}
report["hlos"] = [sorted(x) for x in cache.get_hlos()]
print(json.dumps(report))
"""


@pytest.mark.parametrize(
    "stock_failures",
    [
        pytest.param("", id="default"),
        pytest.param("1", id="stock-failures"),
    ],
)
def test_get_hlos_through_the_proxy_lists_a_failed_entry_as_todo(
    tmp_path: Path, stock_failures: str
) -> None:
    env = child_env(
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "l1"),
        NEURON_COMPILE_CACHE_URL=f"neffcache+http://127.0.0.1:{free_port()}/team-a",
        NEFFCACHE_STOCK_FAILURES=stock_failures,
    )
    env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), env["PYTHONPATH"]])
    env["PATH"] = os.pathsep.join([str(STANDINS), env["PATH"]])
    done = subprocess.run(
        [sys.executable, "-c", _GET_HLOS.format(version=VERSION)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["type"] == "NeffcacheCompileCache"
    todo, locked, done_, failed = report["hlos"]
    assert locked == []
    assert done_ == [report["done"]]
    if stock_failures:
        assert todo == [report["todo"]]
        assert failed == [report["failed"]]
    else:
        assert todo == sorted([report["todo"], report["failed"]])
        assert failed == []


class _ScriptedStock:
    def __init__(self, root: Path) -> None:
        self.cache_path = str(root)

    def get_hlos(self, *args: Any, **kwargs: Any) -> tuple[list[str], ...]:
        return ["t.pb"], ["l.pb"], ["d.pb"], ["f.pb"]


@pytest.mark.parametrize(("stock_failures", "expected"), [("", 0), ("1", 1)])
def test_core_get_hlos_moves_failed_entries_to_todo(
    tmp_path: Path, stock_failures: str, expected: int
) -> None:
    config = ClientConfig.from_env(
        {
            "NEFFCACHE_URL": f"neffcache+http://127.0.0.1:{free_port()}/team-a",
            "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
            "NEFFCACHE_STOCK_FAILURES": stock_failures,
        }
    )
    assert config is not None
    todo, locked, done, failed = Core(_ScriptedStock(tmp_path), config).get_hlos()
    assert (locked, done) == (["l.pb"], ["d.pb"])
    if expected:
        assert (todo, failed) == (["t.pb"], ["f.pb"])
    else:
        assert (todo, failed) == (["t.pb", "f.pb"], [])


# --- the compiler's death by signal is the wrapper's ---------------------------------


@pytest.mark.parametrize(
    "signum",
    [
        pytest.param(signal.SIGKILL, id="SIGKILL"),
        pytest.param(signal.SIGTERM, id="SIGTERM"),
    ],
)
@pytest.mark.parametrize(
    ("kind", "when", "with_url"),
    [
        pytest.param("version", "all", True, id="pass-through"),
        pytest.param("compile", "compile", True, id="compile-through-the-cache"),
        pytest.param("compile", "compile", False, id="compile-without-a-url"),
    ],
)
def test_a_compiler_killed_by_a_signal_kills_the_wrapper_alike(
    tmp_path: Path, kind: str, when: str, with_url: bool, signum: signal.Signals
) -> None:
    compiler = FakeCompiler(tmp_path)
    output = tmp_path / "out.neff"
    args = ["--version"] if kind == "version" else compile_argv(tmp_path, output)
    env = child_env(
        NEFFCACHE_REAL_COMPILER=str(compiler.path),
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "l1"),
        NEFFCACHE_CONNECT_TIMEOUT="0.5",
        FAKE_LOG=str(compiler.log),
        FAKE_KILL=f"{when}:{int(signum)}",
    )
    if with_url:
        env["NEFFCACHE_URL"] = f"neffcache+http://127.0.0.1:{free_port()}/team-a"
    done = subprocess.run(
        [sys.executable, "-m", "neffcache.client.cli", "wrap", "--", "neuronx-cc", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signum, (done.returncode, done.stderr)
    ran = compiler.calls()
    assert ran[-1] == args, ran  # the compiler did run, and died
    assert not output.exists()


# --- a helper holding the compiler's stderr does not hold the wrapper ------------------


def test_a_helper_holding_stderr_does_not_hold_the_wrapper(tmp_path: Path) -> None:
    compiler = FakeCompiler(tmp_path)
    output = tmp_path / "out.neff"
    env = child_env(
        NEFFCACHE_REAL_COMPILER=str(compiler.path),
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "l1"),
        NEFFCACHE_URL=f"neffcache+http://127.0.0.1:{free_port()}/team-a",
        NEFFCACHE_CONNECT_TIMEOUT="0.5",
        FAKE_LOG=str(compiler.log),
        FAKE_HELPER="1",
    )
    argv = [sys.executable, "-m", "neffcache.client.cli", "wrap", "--", "neuronx-cc"]
    argv += compile_argv(tmp_path, output)
    with (tmp_path / "stdout").open("wb") as out, (tmp_path / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            argv, env=env, cwd=tmp_path, stdout=out, stderr=err, start_new_session=True
        )
    try:
        # The helper lives a minute: a wrapper that waited for it would not be done
        # when this wait ends (the wrapper itself takes about a second).
        code = proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the wrapper, if still there, and the helper
        proc.wait(timeout=10)
    stderr = (tmp_path / "stderr").read_text(errors="replace")
    assert code == 0, stderr
    assert output.read_bytes() == NEFF_BYTES
    assert compiler.compiles() == 1
    assert "fake compiler done" in stderr  # the compiler's own stderr still came through


# --- --enable-internal-neff-wrapper is not cached ------------------------------------


@pytest.mark.parametrize("where", ["end", "before-input", "first"])
def test_internal_neff_wrapper_compiles_pass_through(where: str) -> None:
    argv = ["compile", "--framework=XLA", "in.pb", "--output", "o.neff", "--target=trn1"]
    assert parse(argv) is not None  # the same call without the flag is cached
    flag = "--enable-internal-neff-wrapper"
    at = {"end": len(argv), "before-input": 2, "first": 1}[where]
    assert parse([*argv[:at], flag, *argv[at:]]) is None


# --- an outcome is final ------------------------------------------------------------


class DiskFull:
    """L1's small-file writes (``local.atomic_write``: manifests, staged files) on a
    full disk; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import neffcache.client.local as local_module

        def atomic_write(path: Path, data: bytes) -> None:
            self.calls += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(local_module, "atomic_write", atomic_write)


def test_a_full_l1_after_the_compile_does_not_compile_again(
    fake: FakeCompiler, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    full = DiskFull()
    full.install(monkeypatch)
    sessions: list[Session] = []
    real_init = Session.__init__

    def init(self: Session, *args: Any, **kwargs: Any) -> None:
        sessions.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(Session, "__init__", init)
    output = tmp_path / "out.neff"
    argv = compile_argv(tmp_path, output)
    before = STATS.snapshot()
    try:
        assert main(["neuronx-cc", *argv]) == 0
    finally:
        # _keep's staged directory, left to its finalizer when an L1 write fails, is
        # kept alive here by pytest's captured log record (its exception's frames): it
        # would be cleaned later with a ResourceWarning, in some other test.
        for session in sessions:
            staged = getattr(session, "_staged", None)
            if staged is not None:
                staged.cleanup()
    assert len(sessions) == 1
    assert full.calls >= 1, "the compile never wrote a manifest into L1"
    assert fake.compiles() == 1, fake.calls()
    assert output.read_bytes() == NEFF_BYTES
    assert delta(before, "local_errors") >= 1


def _hit_on_a_full_l1(
    fake: FakeCompiler, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[int, Path, list[dict[str, Any]], dict[str, int], DiskFull]:
    """Compile once; then, with only the canonical key's manifest left in L1 and every
    manifest write failing with ENOSPC, run the same compile again: it misses by direct
    key, hits by canonical key, and then fails to record the direct key. Returns the
    second call's exit code, output, the run manifest, the counters before it and the
    full disk."""
    run_log = tmp_path / "run.jsonl"
    monkeypatch.setenv("NEFFCACHE_RUN_MANIFEST", str(run_log))
    first = tmp_path / "first.neff"
    assert main(["neuronx-cc", *compile_argv(tmp_path, first)]) == 0
    assert fake.compiles() == 1
    (record,) = [json.loads(line) for line in run_log.read_text().splitlines()]
    direct = record["direct_key"]
    (tmp_path / "l1" / ".neffcache" / "keys" / direct[:2] / f"{direct}.json").unlink()

    full = DiskFull()
    full.install(monkeypatch)
    second = tmp_path / "second.neff"
    before = STATS.snapshot()
    code = main(["neuronx-cc", *compile_argv(tmp_path, second)])
    records = [json.loads(line) for line in run_log.read_text().splitlines()]
    return code, second, records, before, full


def test_a_full_l1_after_a_hit_does_not_compile(
    fake: FakeCompiler, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, second, _, _, full = _hit_on_a_full_l1(fake, monkeypatch, tmp_path)
    assert code == 0
    assert full.calls >= 1, "the hit never wrote a manifest into L1"
    assert fake.compiles() == 1, fake.calls()  # no second compile
    assert second.read_bytes() == NEFF_BYTES


def test_a_full_l1_after_a_hit_still_records_the_hit(
    fake: FakeCompiler, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, _, records, before, _ = _hit_on_a_full_l1(fake, monkeypatch, tmp_path)
    assert code == 0
    assert [(r["result"], r["source"]) for r in records] == [("miss", "compiler"), ("hit", "l1")]
    assert delta(before, "wrapper_errors") == 0


# --- a full disk under a blob download ---------------------------------------------


class _FullDisk:
    """A file object whose writes fail with ENOSPC; closes its descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.writes = 0

    def write(self, data: bytes) -> int:
        self.writes += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _OsWithAFullDisk:
    """``os`` as remote.py sees it, with ``fdopen`` giving :class:`_FullDisk` files."""

    def __init__(self) -> None:
        self.opened: list[_FullDisk] = []

    def fdopen(self, fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> _FullDisk:
        sink = _FullDisk(fd)
        self.opened.append(sink)
        return sink

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@pytest.mark.e2e
def test_a_full_disk_under_a_download_is_not_the_servers_fault(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(300_000)
    digest: str = blake3.blake3(data).hexdigest()
    source = tmp_path / "blob"
    source.write_bytes(data)
    dest = tmp_path / "l1" / "blobs" / digest
    with open_remote(server.url, tmp_path / "l1", timeout=5.0) as remote:
        assert remote.put_blob(digest, source)
        full = _OsWithAFullDisk()
        before = STATS.snapshot()
        with monkeypatch.context() as patched:
            patched.setattr(remote_module, "os", full)
            assert remote.fetch(digest, len(data), dest) is False
        assert full.opened, "the download never opened its file"
        assert full.opened[0].writes >= 1, "the download never wrote"
        assert delta(before, "local_errors") == 1
        assert delta(before, "server_errors") == 0
        assert remote.available(), "a full local disk marked the server down"
        assert not dest.exists()
        assert list(dest.parent.iterdir()) == []  # the partial download is gone
        # And the server still serves this process once there is room again.
        assert remote.fetch(digest, len(data), dest)
    assert dest.read_bytes() == data


def test_an_unwritable_l1_is_staged_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK asks for a cache per graph: every graph of a run must use the same
    # staging directory, or each would lose the ones before it (and litter /tmp).
    import tempfile

    from neffcache.client import hook, local

    monkeypatch.setattr(hook, "_l1_dirs", {})
    monkeypatch.setattr(local, "_staging", {})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    # Recorded, so that the value the hook sets is undone after the test.
    monkeypatch.setenv(local.SDK_CACHE_VARIABLE, "")
    (tmp_path / "tmp").mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = ClientConfig.from_env(
        {
            "NEFFCACHE_URL": "neffcache+http://127.0.0.1:1/team-a",
            "NEFFCACHE_LOCAL_DIR": str(blocker / "l1"),
        }
    )
    assert config is not None
    before = STATS.snapshot()
    first = hook._writable_l1(config)
    second = hook._writable_l1(config)
    assert first.local_dir == second.local_dir != config.local_dir
    assert Path(first.local_dir).is_dir()
    assert Path(first.local_dir).parent.parent == local.staging_parent()
    assert local.staging_parent().parent == tmp_path / "tmp"
    assert (first.local_max_size, first.local_read_only) == (0, False)
    assert os.environ[local.SDK_CACHE_VARIABLE] == first.local_dir  # for the shim it runs
    assert delta(before, "l1_unwritable") == 1
    writable = config._replace(local_dir=str(tmp_path / "ok"))
    assert hook._writable_l1(writable) is writable
