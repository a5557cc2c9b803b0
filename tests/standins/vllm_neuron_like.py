"""STAND-IN for vLLM Neuron's compile step (``libtorch-neuronx-lite``); NOT AWS's code.

Written only from docs/neuron-sdk.md#vllm-neuron, so tests can see what a ``neuronx-cc``
first on PATH gets from vLLM Neuron without vLLM, PyTorch or the Neuron SDK. It imitates
one compile of one graph:

* the graph is written to ``<wd>/graph.hlo``: an HloModuleProto under the name
  ``.hlo`` (copied here from the file given);
* the compiler runs as::

      subprocess.run(["neuronx-cc", "compile", f"{wd}/graph.hlo", "--framework", "XLA",
                      "--target", t, "--output", f"{wd}/graph_{key}.neff",
                      "--logfile", f"{wd}/log-neuron-cc.txt", *args])

  with no ``cwd`` argument: the compiler runs in this process's working directory;
* afterwards both ``<wd>/graph_<key>.neff`` and ``<wd>/log-neuron-cc.txt`` must exist,
  else the compile counts as failed here (exit 1).

``<key>`` imitates vLLM's cache key (#vllm-neuron: an MD5 over the graph, the versions
and the canonical compiler args): here the MD5 of the graph's bytes, the target and the
args. [GUESS] The exact key and how ``args`` are spelled are not in docs/neuron-sdk.md;
extra compiler args are given after ``--``.

Not imitated: vLLM's own two-tier cache (``.artifact_metadata_v0.json``,
``.compilation_complete``): every run is a miss of it, the only case in which the
compiler (or a shim in its place) is called.

Usage: ``python3 vllm_neuron_like.py GRAPH.pb --work-dir WD [--target trn2]
[--output-neff PATH] [-- COMPILER_ARGS...]``.

Exit code: the compiler's (its stderr printed on stderr when it is not 0); 1 when the
NEFF or the log file is missing after a compile that exited 0. On success it prints one
JSON line: ``{"key", "neff", "logfile", "bytes", "argv"}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys


def main(argv: list[str]) -> int:
    compiler_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, compiler_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(prog="vllm_neuron_like (stand-in)")
    parser.add_argument("graph", help="an HloModuleProto file")
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--output-neff", help="where to copy the NEFF as well")
    options = parser.parse_args(argv)

    wd = os.path.abspath(options.work_dir)
    os.makedirs(wd, exist_ok=True)
    with open(options.graph, "rb") as f:
        graph = f.read()
    with open(f"{wd}/graph.hlo", "wb") as f:
        f.write(graph)
    key = hashlib.md5(
        graph + b"\0" + json.dumps([options.target, compiler_args]).encode(),
        usedforsecurity=False,
    ).hexdigest()
    neff = f"{wd}/graph_{key}.neff"
    logfile = f"{wd}/log-neuron-cc.txt"
    cmd = [
        "neuronx-cc",
        "compile",
        f"{wd}/graph.hlo",
        "--framework",
        "XLA",
        "--target",
        options.target,
        "--output",
        neff,
        "--logfile",
        logfile,
        *compiler_args,
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        print("vllm_neuron_like (stand-in): neuronx-cc not found on PATH", file=sys.stderr)
        return 127
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    missing = [path for path in (neff, logfile) if not os.path.isfile(path)]
    if missing:
        print(
            f"vllm_neuron_like (stand-in): the compiler exited 0 but {missing} do not exist",
            file=sys.stderr,
        )
        return 1
    if options.output_neff:
        shutil.copyfile(neff, options.output_neff)
    summary = {
        "key": key,
        "neff": neff,
        "logfile": logfile,
        "bytes": os.path.getsize(neff),
        "argv": cmd,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
