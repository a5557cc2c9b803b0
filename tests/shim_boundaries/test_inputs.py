"""What the shim reads as the compiler's input (client/inputs.py), on what
else decides the NEFF (the compiler version, the input's file name), and on the
shim's promise never to fail or hang a job.

Each test states a boundary the shim must keep (no false hit; never fail or hang a
job) and checks it end to end or at the unit that decides it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from shim_boundaries.support import executable, hosts, put_hlo, reference, same_outcome
from support.e2e import (
    BLOCK_A,
    BLOCK_B,
    COMPILER,
    OTHER,
    STANDIN_VERSION,
    STANDINS,
    Sandbox,
    Server,
    hlo,
    reference_neff,
    stock_address,
    wait_for,
)

BASE = [
    "compile",
    "in.pb",
    "--framework",
    "XLA",
    "--target",
    "trn1",
    "--output",
    "out.neff",
    "--model-type=transformer",
]
V = "2.20.9961.0+0acef03a"


def _ctx():  # type: ignore[no-untyped-def]
    from neffcache.client.keys import context

    return context(V, "trn1", ["--model-type=transformer"], {})


def _keys(path: Path) -> tuple[str, str | None]:
    from neffcache.client.inputs import read_input

    graph = read_input(path)
    canonical = graph.canonical(_ctx())
    return graph.direct(_ctx()).key, None if canonical is None else canonical.key


def _trace_folder(root: Path, graph: str = BLOCK_A, weights: bytes = b"w0") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(hlo(graph), root / "graph.hlo")
    (root / "weights").mkdir(exist_ok=True)
    (root / "weights" / "0.npy").write_bytes(weights)
    (root / "metadata.json").write_text(
        '{"model_files": "graph.hlo", "weights": {"0": "weights/0.npy"}}'
    )
    return root


# --- the input changes between keying and compiling ---------------------------

SWAPPER = (
    """
import os, shutil, sys
src, dst = os.environ.get("ATTACK_SWAP_FROM"), os.environ.get("ATTACK_SWAP_TO")
if src and dst and "compile" in sys.argv[1:]:
    # Another writer of the same path, between the shim's keying and the compile
    # (while the shim waited on the host's lock or another host's lease, say).
    shutil.copyfile(src, dst)
os.execv(sys.executable, [sys.executable, COMPILER, *sys.argv[1:]])
"""
).replace("COMPILER", repr(str(COMPILER)), 1)


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["file", "trace-folder-weights"])
def test_input_rewritten_after_keying_poisons_the_old_key(
    server: Server, sandbox: Sandbox, tmp_path: Path, kind: str
) -> None:
    """The shim reads the input once, keys it, then (after the lock, the lease
    wait, the version probe) runs the compiler, which reads the path again. When the
    file is rewritten in between (two jobs sharing a work directory such as NxD's
    default ``/tmp/trace_compiler_workdir/``, a re-trace into the same folder), the
    NEFF of the NEW content is published under the key of the OLD content, and every
    host that later compiles the old content anywhere in the fleet is served it. The
    stock flow would only have confused the one job. Nothing re-checks the input
    after the compile (size, mtime or digest) before publishing."""
    source = tmp_path / "swapper.py"
    source.write_text(SWAPPER)
    swapper = executable(sandbox.new_dir("swapper"), source)
    h1, h2 = hosts(server, sandbox, 2)
    if kind == "file":
        argv = BASE
        layout = put_hlo(BLOCK_A)
        swapped, replacement = "in.pb", hlo(OTHER)
    else:
        argv = [
            "compile",
            "model",
            "--framework",
            "XLA",
            "--target",
            "trn1",
            "--output",
            "out.neff",
        ]

        def layout(cwd: Path) -> None:
            _trace_folder(cwd / "model")

        swapped = "model/weights/0.npy"
        replacement = tmp_path / "other-weights.npy"
        replacement.write_bytes(b"other weights")
    cwd1 = h1.cwd(layout)
    env1 = h1.env(
        NEFFCACHE_REAL_COMPILER=str(swapper),
        ATTACK_SWAP_FROM=str(replacement),
        ATTACK_SWAP_TO=str(cwd1 / swapped),
    )
    assert h1.shim(argv, cwd1, env=env1).returncode == 0
    cwd2 = h2.cwd(layout)
    probed = h2.shim(argv, cwd2)
    ref_cwd = sandbox.new_dir("reference-cwd")
    layout(ref_cwd)
    alone = reference(sandbox, argv, ref_cwd)
    ok, text = same_outcome((probed, cwd2), (alone, ref_cwd), ["out.neff"])
    assert ok, (
        "false hit: host 2's unchanged input was served the NEFF of the content that "
        f"replaced it on host 1\n{text}\nhost 2: {h2.last()}"
    )


# --- the compiler version -----------------------------------------------------


@pytest.mark.e2e
def test_compiler_version_is_remembered_per_entry_script_not_per_compiler(
    server: Server, sandbox: Sandbox
) -> None:
    """compiler.compiler_version() remembers ``neuronx-cc --version`` per
    (realpath, inode, size, mtime) of the ``neuronx-cc`` file. That file is a console
    script (or a launcher); which compiler it runs is decided elsewhere: PYTHONPATH, a
    ``#!/usr/bin/env python3`` shebang and PATH, a module system, a venv switched under
    the same path. On a host where the same script now runs another compiler (here
    the stand-in's NEFFCACHE_STANDIN_VERSION stands for that), the shim keys with the
    remembered old version and serves the old compiler's NEFF: a cross-version false
    hit, the one thing the version in the key is there to prevent."""
    (h1,) = hosts(server, sandbox, 1)
    layout = put_hlo(BLOCK_A)
    first = h1.shim(BASE, h1.cwd(layout), env=h1.env(NEFFCACHE_STANDIN_VERSION=STANDIN_VERSION))
    assert first.returncode == 0, first.describe()
    compiles = sandbox.compiles("in.pb")
    newer = "2.21.4242.0+1a2b3c4d"
    # What switches the compiler behind the same script in real life: another
    # PYTHONPATH (here an empty directory; the stand-in's variable plays the compiler
    # that PYTHONPATH would have loaded).
    other_packages = sandbox.new_dir("other-site-packages")
    second = h1.shim(
        BASE,
        h1.cwd(layout),
        env=h1.env(NEFFCACHE_STANDIN_VERSION=newer, PYTHONPATH=str(other_packages)),
    )
    assert second.returncode == 0, second.describe()
    record = h1.last() or {}
    why = (
        f"the compiler now reports {newer}; the shim keyed with "
        f"{record.get('compiler_version')} and the call was a {record.get('result')} "
        f"({record.get('source')})"
    )
    assert record.get("compiler_version") == newer, why
    assert sandbox.compiles("in.pb") == compiles + 1, why


# --- the stock address taken from the file name -------------------------------


@pytest.mark.e2e
def test_sdk_file_name_claims_a_stock_address_for_other_content(
    server: Server, sandbox: Sandbox
) -> None:
    """neuron_address_of() takes ``MODULE_<key>`` from the input's FILE NAME
    (checking only that ``+<flags8>`` is this call's flags hash) and publishes the NEFF
    under that stock address. A compile of a file that carries an SDK name but other
    bytes (an HLO edited in libneuronxla's work directory and recompiled with the
    command it logged; a tool that copies HLOs under their names) claims the address
    of the original graph, and the persistent-cache hook, which looks addresses up
    before anything else, serves that NEFF to every job compiling the original graph."""
    url = server.cache_url(sandbox.namespace)
    address = stock_address(BLOCK_A)
    module = address.split("/", 1)[1]
    cwd = sandbox.new_dir("work")
    name = f"model.{module}.hlo_module.pb"
    shutil.copyfile(hlo(OTHER), cwd / name)  # other bytes under BLOCK_A's SDK name
    shim_env = sandbox.env(l1=sandbox.new_dir("l1"), url=url, url_var="NEFFCACHE_URL", shim=True)
    argv = [
        "neuronx-cc",
        "compile",
        "--framework=XLA",
        name,
        "--output",
        "model.neff",
        "--target=trn1",
        "--model-type=transformer",
        "--verbose=35",
    ]
    sandbox.run(argv, shim_env, cwd=cwd).check()
    hook_env = sandbox.env(l1=sandbox.new_dir("l1"), url=url, hook=True)
    training = sandbox.train(hook_env, [BLOCK_A])
    training.done.check()
    assert training.neffs == [reference_neff(BLOCK_A)], (
        "false hit: the hook served BLOCK_A the NEFF of another graph published under "
        f"BLOCK_A's stock address ({address}) by a compile of a file named after it; "
        f"it got reference_neff(OTHER)? {training.neffs[:1] == [reference_neff(OTHER)]}"
    )


# --- never fail or hang a job -------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_the_shim_leaves_the_compiler_running(
    server: Server, sandbox: Sandbox, signum: int
) -> None:
    """A caller that stops the ``neuronx-cc`` it started (``proc.terminate()``,
    ``subprocess.run(timeout=...)``'s kill, a C++ launcher's ``kill(pid)``) stops the
    compiler. Through the shim it stops the shim only: the real compiler (its child,
    started with no death signal and no forwarding) keeps compiling for as long as it
    takes, keeps the caller's stdout open, and writes ``--output`` after the caller
    has given up and perhaps retried into the same path."""
    (h1,) = hosts(server, sandbox, 1)
    pids = sandbox.new_dir("pids")
    cwd = h1.cwd(put_hlo(BLOCK_A))
    env = h1.env(NEFFCACHE_STANDIN_DELAY="30", NEFFCACHE_STANDIN_PIDFILE_DIR=str(pids))
    running = sandbox.start(["neuronx-cc", *BASE], env, cwd=cwd)
    wait_for(lambda: any(pids.iterdir()), 30, "the compiler to start")
    compiler_pid = int(next(pids.iterdir()).name)
    os.kill(running.pid, signum)  # the caller stops what it started: the shim's pid
    running.process.wait(timeout=10)
    deadline = time.monotonic() + 10
    alive = True
    while time.monotonic() < deadline:
        try:
            os.kill(compiler_pid, 0)
        except ProcessLookupError:
            alive = False
            break
        time.sleep(0.1)
    if alive:
        os.kill(compiler_pid, signal.SIGKILL)  # a child of the shim this test started
    assert not alive, (
        f"the compiler (pid {compiler_pid}) outlived the shim killed by "
        f"{signal.Signals(signum).name} by 10 s"
    )


@pytest.mark.e2e
def test_a_broken_import_on_pythonpath_fails_the_job(
    server: Server, sandbox: Sandbox, tmp_path: Path
) -> None:
    """The shim is a Python script run with the caller's environment: a
    PYTHONPATH entry that shadows one of its imports with an incompatible build (a
    job's own site-packages for another Python version is enough) makes the shim die
    with a traceback before it reaches the compiler. The job then fails where the
    compiler alone would have compiled. ``blake3`` is imported at the top of main()
    (compiler.py imports local.py, which imports blake3), before the real compiler is
    even found, and nothing catches it: the shim script has no fallback that execs the
    compiler when neffcache itself cannot run."""
    shadow = tmp_path / "job-site-packages"
    (shadow / "blake3").mkdir(parents=True)
    (shadow / "blake3" / "__init__.py").write_text(
        "raise ImportError('blake3 built for another Python (simulated)')\n"
    )
    (h1,) = hosts(server, sandbox, 1)
    cwd = h1.cwd(put_hlo(BLOCK_A))
    done = h1.shim(BASE, cwd, env=h1.env(PYTHONPATH=str(shadow)))
    ref_cwd = sandbox.new_dir("reference-cwd")
    put_hlo(BLOCK_A)(ref_cwd)
    alone = reference(sandbox, BASE, ref_cwd)
    ok, text = same_outcome((done, cwd), (alone, ref_cwd), ["out.neff"])
    assert ok, f"the job failed because of the shim\n{text}\n{done.stderr[-1500:]}"


@pytest.mark.e2e
def test_a_broken_protobuf_on_pythonpath_falls_back_to_the_compiler(
    server: Server, sandbox: Sandbox, tmp_path: Path
) -> None:
    """protobuf is imported only after the direct-key miss, inside main()'s
    fallback: a shadowing ``google.protobuf`` that cannot import ends in compiling
    uncached, with the compiler's NEFF."""
    shadow = tmp_path / "job-site-packages"
    (shadow / "google" / "protobuf").mkdir(parents=True)
    (shadow / "google" / "__init__.py").write_text("")
    (shadow / "google" / "protobuf" / "__init__.py").write_text(
        "raise ImportError('protobuf built for another Python (simulated)')\n"
    )
    (h1,) = hosts(server, sandbox, 1)
    cwd = h1.cwd(put_hlo(BLOCK_A))
    done = h1.shim(BASE, cwd, env=h1.env(PYTHONPATH=str(shadow)))
    ref_cwd = sandbox.new_dir("reference-cwd")
    put_hlo(BLOCK_A)(ref_cwd)
    alone = reference(sandbox, BASE, ref_cwd)
    ok, text = same_outcome((done, cwd), (alone, ref_cwd), ["out.neff"])
    assert ok, f"{text}\n{done.stderr[-1500:]}"


# --- inputs keyed by content ------------------------------------------------------


def test_folder_and_file_with_the_same_bytes_have_other_keys(tmp_path: Path) -> None:
    """A folder holding only ``graph.hlo`` and the same bytes as a file: other
    direct keys (tree digest vs raw bytes) and other canonical keys."""
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copyfile(hlo(BLOCK_A), folder / "graph.hlo")
    single = tmp_path / "graph.hlo"
    shutil.copyfile(hlo(BLOCK_A), single)
    folder_keys, file_keys = _keys(folder), _keys(single)
    assert folder_keys[0] != file_keys[0]
    assert folder_keys[1] != file_keys[1]


@pytest.mark.parametrize(
    "change",
    ["weights", "hidden-file", "rename-weight", "empty-extra-file", "metadata", "graph-renamed"],
)
def test_every_file_of_a_trace_folder_is_in_both_keys(tmp_path: Path, change: str) -> None:
    """Other weights, a hidden file, a renamed weight file, an extra empty file,
    other metadata, the graph under another name: both keys change."""
    base = _trace_folder(tmp_path / "a")
    other = _trace_folder(tmp_path / "b")
    if change == "weights":
        (other / "weights" / "0.npy").write_bytes(b"w1")
    elif change == "hidden-file":
        (other / ".hidden").write_bytes(b"x")
    elif change == "rename-weight":
        (other / "weights" / "0.npy").rename(other / "weights" / "1.npy")
    elif change == "empty-extra-file":
        (other / "weights" / "extra.npy").write_bytes(b"")
    elif change == "metadata":
        (other / "metadata.json").write_text('{"model_files": "graph.hlo", "weights": {}}')
    else:
        (other / "graph.hlo").rename(other / "graph.pb")
    a, b = _keys(base), _keys(other)
    assert a[0] != b[0]
    assert a[1] != b[1]


def test_trace_folder_canonical_key_ignores_only_the_graphs_metadata(tmp_path: Path) -> None:
    """The same program traced under other names in ``graph.hlo``: same
    canonical key, other direct key."""
    a = _keys(_trace_folder(tmp_path / "a", BLOCK_A))
    b = _keys(_trace_folder(tmp_path / "b", BLOCK_B))
    assert a[0] != b[0]
    assert a[1] is not None
    assert a[1] == b[1]


def test_symlinked_file_in_a_folder_is_keyed_by_its_target(tmp_path: Path) -> None:
    """A weight that is a symlink is followed: changing the target's bytes
    changes the key."""
    target = tmp_path / "shared.npy"
    target.write_bytes(b"v1")
    folder = _trace_folder(tmp_path / "m")
    (folder / "weights" / "0.npy").unlink()
    (folder / "weights" / "0.npy").symlink_to(target)
    before = _keys(folder)
    target.write_bytes(b"v2")
    assert _keys(folder) != before


def test_folder_with_a_link_to_a_folder_or_a_fifo_is_not_keyed(tmp_path: Path) -> None:
    """A link to a folder (could loop, or escape) and a FIFO (would never end)
    make the input Unkeyable; a dangling link is an OSError (uncached as well)."""
    from neffcache.client.inputs import Unkeyable, read_input

    a = _trace_folder(tmp_path / "a")
    (a / "loop").symlink_to(a)
    with pytest.raises(Unkeyable):
        read_input(a)
    b = _trace_folder(tmp_path / "b")
    os.mkfifo(b / "pipe")
    with pytest.raises(Unkeyable):
        read_input(b)
    c = _trace_folder(tmp_path / "c")
    (c / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):
        read_input(c)
    fifo = tmp_path / "input-fifo"
    os.mkfifo(fifo)
    with pytest.raises(Unkeyable):
        read_input(fifo)


def test_graph_hlo_that_is_mlir_text_keys_by_bytes_only(tmp_path: Path) -> None:
    """A trace folder whose ``graph.hlo`` is MLIR text has no canonical key (its
    bytes are the key); an MLIR-text file likewise; an empty file is Unkeyable."""
    from neffcache.client.inputs import Unkeyable, read_input

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "graph.hlo").write_text(
        "module @jit_f {\n  func.func @main() {\n    return\n  }\n}\n"
    )
    assert _keys(folder)[1] is None
    text = tmp_path / "module.mlir"
    text.write_text("module @jit_f {\n}\n")
    assert _keys(text)[1] is None
    empty = tmp_path / "empty.pb"
    empty.write_bytes(b"")
    with pytest.raises(Unkeyable):
        read_input(empty).canonical(_ctx())


def test_non_utf8_names_in_a_folder_stay_apart(tmp_path: Path) -> None:
    """File names that are not UTF-8 are keyed injectively (surrogatepass)."""
    a = _trace_folder(tmp_path / "a")
    b = _trace_folder(tmp_path / "b")
    os.rename(bytes(a / "metadata.json"), bytes(a) + b"/meta\xffdata.json")
    os.rename(bytes(b / "metadata.json"), bytes(b) + b"/meta\xfedata.json")
    assert _keys(a) != _keys(b)


@pytest.mark.e2e
def test_same_bytes_other_name_is_the_same_input(server: Server, sandbox: Sandbox) -> None:
    """the name of an input file is not in
    its key (``module.hlo.pb``, ``graph.hlo``)."""
    h1, h2 = hosts(server, sandbox, 2)
    a = ["compile", "graph.hlo", "--framework", "XLA", "--target", "trn1", "--output", "o.neff"]
    b = ["compile", "module.hlo.pb", "--framework", "XLA", "--target", "trn1", "--output", "o.neff"]
    assert h1.shim(a, h1.cwd(put_hlo(BLOCK_A, "graph.hlo"))).returncode == 0
    cwd = h2.cwd(put_hlo(BLOCK_A, "module.hlo.pb"))
    probed = h2.shim(b, cwd)
    ref = sandbox.new_dir("ref")
    put_hlo(BLOCK_A, "module.hlo.pb")(ref)
    alone = reference(sandbox, b, ref)
    ok, text = same_outcome((probed, cwd), (alone, ref), ["o.neff"])
    assert ok, text
    assert (h2.last() or {}).get("result") == "hit"


@pytest.mark.e2e
def test_version_probe_is_redone_for_another_binary(server: Server, sandbox: Sandbox) -> None:
    """Another ``neuronx-cc`` file (an upgrade that rewrites the script) is asked
    its version again."""
    (h1,) = hosts(server, sandbox, 1)
    layout = put_hlo(BLOCK_A)
    assert h1.shim(BASE, h1.cwd(layout)).returncode == 0
    other = sandbox.new_dir("other-compiler") / "neuronx-cc"
    standin = str(STANDINS / "neuronx-cc")
    other.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        "os.environ['NEFFCACHE_STANDIN_VERSION'] = '2.21.4242.0+1a2b3c4d'\n"
        f"os.execv(sys.executable, [sys.executable, {standin!r}, *sys.argv[1:]])\n"
    )
    other.chmod(0o755)
    done = h1.shim(BASE, h1.cwd(layout), env=h1.env(NEFFCACHE_REAL_COMPILER=str(other)))
    assert done.returncode == 0
    assert (h1.last() or {}).get("compiler_version") == "2.21.4242.0+1a2b3c4d"


# --- a huge input is not held in the shim's memory while the compiler runs ------


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["mlir-text", "unkeyable-bytes"])
def test_a_huge_input_is_not_held_in_memory_while_it_compiles(
    server: Server, sandbox: Sandbox, kind: str
) -> None:
    """The shim drops the input it read for its keys before the compiler starts, also
    when the input could not be keyed and the compiler runs uncached: every rank's shim
    would otherwise hold a copy of its input beside a compiler that needs the host's
    memory (Neuron compiles are OOM-killed in practice).

    A sample counts only when the compiler's pid file is there both before and after
    it: the shim reads the input again once the compiler has exited (to check it was
    not rewritten meanwhile), and a sample taken across that exit would measure the
    second read, not the compile."""
    size = 256 << 20
    (h1,) = hosts(server, sandbox, 1)
    cwd = h1.cwd()
    with open(cwd / "in.pb", "wb") as f:
        if kind == "mlir-text":
            f.write(b"module @huge {\n")
            line = b"// " + b"x" * 1020 + b"\n"
        else:
            line = bytes(range(256)) * 4
        for _ in range(size // len(line)):
            f.write(line)
    pids = sandbox.new_dir("pids")
    env = h1.env(NEFFCACHE_STANDIN_DELAY="3", NEFFCACHE_STANDIN_PIDFILE_DIR=str(pids))
    running = sandbox.start(["neuronx-cc", *BASE], env, cwd=cwd)
    wait_for(lambda: any(pids.iterdir()), 60, "the compiler to start")
    compiling = set(pids.iterdir())
    samples: list[int] = []
    while running.poll() is None:
        try:
            rss = _rss_kib(running.pid)
        except OSError:
            break
        if not all(p.exists() for p in compiling):
            break  # the compiler exited around this sample: it may be the second read
        samples.append(rss)
        time.sleep(0.05)
    done = running.wait(60)
    assert done.returncode == 0, done.describe()
    assert samples, "no sample was taken while the compiler ran"
    assert max(samples) * 1024 < size // 2, (
        f"the shim's resident memory was {max(samples) // 1024} MiB while the compiler ran, "
        f"for a {size >> 20} MiB input"
    )


# --- a trace folder's metadata names files outside the folder -----------------


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["relative-outside", "absolute"])
def test_weights_named_by_metadata_outside_the_folder_are_not_keyed(
    server: Server, sandbox: Sandbox, where: str
) -> None:
    """torch_neuronx.trace's ``metadata.json`` maps weights to paths that the
    compiler opens relative to the folder (``"weights": {"0": "weights/0.npy"}``).
    The key covers the folder's files, so it covers the weights only when they sit in
    the folder. A folder whose metadata names ``../shared/0.npy`` or an absolute path
    (a shared checkpoint, a tool that does not copy weights) is keyed with the path's
    TEXT only: other weights at that path are served the first weights' NEFF. The
    shim neither reads metadata.json's paths nor refuses such folders. (Oracle:
    tests/shim_boundaries/argparse_cc.py, which reads the weights metadata.json names.)"""
    from shim_boundaries.support import ARGPARSE_CC, argparse_compiler

    h1, h2 = hosts(server, sandbox, 2, NEFFCACHE_REAL_COMPILER=str(argparse_compiler(sandbox)))
    shared_root = sandbox.new_dir("shared-checkpoint")

    def layout_with(weights: bytes):  # type: ignore[no-untyped-def]
        def layout(cwd: Path) -> None:
            model = cwd / "model"
            model.mkdir()
            shutil.copyfile(hlo(BLOCK_A), model / "graph.hlo")
            if where == "relative-outside":
                (cwd / "shared").mkdir()
                (cwd / "shared" / "0.npy").write_bytes(weights)
                path = "../shared/0.npy"
            else:
                (shared_root / "0.npy").write_bytes(weights)
                path = str(shared_root / "0.npy")
            (model / "metadata.json").write_text(
                json.dumps({"model_files": "graph.hlo", "version": "1.0", "weights": {"0": path}})
            )

        return layout

    argv = ["compile", "model", "--framework", "XLA", "--target", "trn1", "--output", "out.neff"]
    assert h1.shim(argv, h1.cwd(layout_with(b"weights of job 1"))).returncode == 0
    cwd = h2.cwd(layout_with(b"weights of job 2"))
    probed = h2.shim(argv, cwd)
    ref_cwd = sandbox.new_dir("reference-cwd")
    layout_with(b"weights of job 2")(ref_cwd)
    alone = reference(sandbox, argv, ref_cwd, compiler=ARGPARSE_CC)
    ok, text = same_outcome((probed, cwd), (alone, ref_cwd), ["out.neff"])
    assert ok, f"false hit: other weights got the first job's NEFF\n{text}\n{h2.last()}"
