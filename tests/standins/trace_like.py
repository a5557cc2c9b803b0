"""STAND-IN for ``torch_neuronx.trace``'s compile step; NOT AWS's code.

Written only from docs/neuron-sdk.md#torch-neuronx-tracing, so tests can see what a
``neuronx-cc`` first on PATH gets from tracing without PyTorch or the Neuron SDK. It
imitates one trace:

* it builds ``<workdir>/model/`` holding ``graph.hlo`` (an HloModuleProto, copied here
  from the file given), ``metadata.json`` and ``weights/*.npy``: the weights sit beside
  the graph, so the same graph with other weights is another compile;
* it runs ``neuronx-cc compile <workdir>/model --framework XLA --target trn1 --output
  <workdir>/graph.neff [COMPILER_ARGS...]`` as a subprocess (``neuronx-cc`` from PATH,
  no ``cwd`` argument, output captured);
* it copies ``graph.neff`` to ``--output-neff`` when asked.

The weights are small float32 arrays in the NPY format (version 1.0: magic, header
length, a Python-literal header padded to 64 bytes, then the raw little-endian data),
written with the standard library; their values come from ``--weights-seed``, so tests
can trace the same graph with other weights. [GUESS] The real files' names, shapes and
``metadata.json`` content are not in docs/neuron-sdk.md; the metadata here holds nothing
that depends on the host or the work directory.

Usage: ``python3 trace_like.py GRAPH.pb --workdir DIR [--weights-seed N]
[--target trn1] [--output-neff PATH] [-- COMPILER_ARGS...]``.

Exit code: the compiler's (its stderr printed on stderr when it is not 0); 1 when the
compiler exits 0 without writing ``graph.neff``. On success it prints one JSON line:
``{"neff", "bytes", "argv"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys

# (file name under weights/, shape) of the weights written.
WEIGHTS = (("w0.npy", (4, 4)), ("w1.npy", (4,)))


def npy_bytes(values: list[float], shape: tuple[int, ...]) -> bytes:
    """An NPY 1.0 file of little-endian float32 ``values`` with ``shape``."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape!r}, }}"
    # magic (6) + version (2) + header length (2) + header + "\n", padded to 64.
    pad = -(10 + len(header) + 1) % 64
    header_bytes = (header + " " * pad + "\n").encode("latin-1")
    data = struct.pack(f"<{len(values)}f", *values)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header_bytes)) + header_bytes + data


def build_model_dir(model: str, graph: bytes, seed: int) -> None:
    os.makedirs(os.path.join(model, "weights"), exist_ok=True)
    with open(os.path.join(model, "graph.hlo"), "wb") as f:
        f.write(graph)
    rng = random.Random(seed)
    for name, shape in WEIGHTS:
        count = 1
        for d in shape:
            count *= d
        values = [rng.uniform(-1.0, 1.0) for _ in range(count)]
        with open(os.path.join(model, "weights", name), "wb") as f:
            f.write(npy_bytes(values, shape))
    metadata = {
        "format": "neffcache-standin-trace",
        "weights": [{"file": f"weights/{name}", "shape": list(shape)} for name, shape in WEIGHTS],
    }
    with open(os.path.join(model, "metadata.json"), "w", encoding="utf-8") as f:
        json.dump(metadata, f, sort_keys=True)


def main(argv: list[str]) -> int:
    compiler_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, compiler_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(prog="trace_like (stand-in)")
    parser.add_argument("graph", help="an HloModuleProto file")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--weights-seed", type=int, default=0)
    parser.add_argument("--target", default="trn1")
    parser.add_argument("--output-neff", help="where to copy graph.neff as well")
    options = parser.parse_args(argv)

    workdir = os.path.abspath(options.workdir)
    model = os.path.join(workdir, "model")
    with open(options.graph, "rb") as f:
        build_model_dir(model, f.read(), options.weights_seed)
    neff = os.path.join(workdir, "graph.neff")
    cmd = [
        "neuronx-cc",
        "compile",
        model,
        "--framework",
        "XLA",
        "--target",
        options.target,
        "--output",
        neff,
        *compiler_args,
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        print("trace_like (stand-in): neuronx-cc not found on PATH", file=sys.stderr)
        return 127
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    if not os.path.isfile(neff):
        print(f"trace_like (stand-in): the compiler exited 0 and wrote no {neff}", file=sys.stderr)
        return 1
    if options.output_neff:
        shutil.copyfile(neff, options.output_neff)
    print(json.dumps({"neff": neff, "bytes": os.path.getsize(neff), "argv": cmd}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
