"""STAND-IN for TorchNeuron's compile step (native ``torch-neuronx``); NOT AWS's code.

Written only from docs/neuron-sdk.md#torchneurons-compiler-call (TorchNeuron calls the
compiler as a subprocess found on PATH), so tests can see what a ``neuronx-cc`` first on
PATH gets from TorchNeuron without PyTorch or the Neuron SDK. It imitates one compile of
one graph, the way the Python path does it:

* a fresh ``tempfile.mkdtemp(prefix="neuron_compile_", dir=TMP_ROOT)`` per compile
  (``/tmp/neuron_compile_XXXXXX`` in TorchNeuron; ``--tmp-root`` moves it for tests),
  removed afterwards, whatever happened;
* the module copied to ``<tmp>/module.mlir`` (StableHLO MLIR bytecode in TorchNeuron),
  or to ``<tmp>/module.hlo.pb`` with ``--hlo-pb`` (an HloModuleProto: eager ops with
  collectives, or ``TORCH_NEURONX_ENABLE_STABLEHLO=0``);
* ``neuronx-cc`` found with ``shutil.which`` and run as::

      neuronx-cc compile <tmp>/module.mlir --framework XLA --target <T> --lnc <N> -O<L> \\
          --model-type transformer --auto-cast=none [NEURON_CC_FLAGS tokens...] \\
          --output <tmp>/module.neff

  options as separate words (``-O2`` for ``torch.compile``, ``-O1`` for eager ops),
  the ``NEURON_CC_FLAGS`` tokens split with ``shlex`` and appended as they are, stdout
  and stderr piped, no ``cwd`` argument. [GUESS] Where exactly the ``NEURON_CC_FLAGS``
  tokens go relative to ``--output``, and that they are split with shlex, are not in
  docs/neuron-sdk.md beyond the order shown in #torchneurons-compiler-call;
* the NEFF copied to ``--output-neff`` (where a test can read it).

Not imitated: TorchNeuron's own NEFF cache (docs/neuron-sdk.md#torchneurons-neff-cache):
every run is a miss of it, which is the only case in which the compiler (or a shim in
its place) is called.

Usage: ``python3 torchneuron_like.py MODULE --output-neff PATH [--target trn2]
[--lnc 2] [--opt-level 2] [--hlo-pb] [--tmp-root DIR]``.

Exit code: the compiler's (its stderr printed on stderr when it is not 0); 1 when the
compiler exits 0 but wrote no NEFF; 127 when no ``neuronx-cc`` is on PATH. On success
it prints one JSON line: ``{"neff": ..., "bytes": ..., "argv": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchneuron_like (stand-in)")
    parser.add_argument("module", help="the module's bytes (MLIR bytecode or HloModuleProto)")
    parser.add_argument("--output-neff", required=True, help="where to copy the NEFF")
    parser.add_argument("--target", default="trn2", choices=["trn2", "trn3"])
    parser.add_argument("--lnc", default="2", choices=["1", "2"])
    parser.add_argument("--opt-level", default="2", choices=["1", "2"])
    parser.add_argument("--hlo-pb", action="store_true", help="send module.hlo.pb")
    parser.add_argument("--tmp-root", default="/tmp")
    options = parser.parse_args(argv)

    compiler = shutil.which("neuronx-cc")
    if compiler is None:
        print("torchneuron_like (stand-in): neuronx-cc not found on PATH", file=sys.stderr)
        return 127
    tmp = tempfile.mkdtemp(prefix="neuron_compile_", dir=options.tmp_root)
    try:
        module = os.path.join(tmp, "module.hlo.pb" if options.hlo_pb else "module.mlir")
        shutil.copyfile(options.module, module)
        neff = os.path.join(tmp, "module.neff")
        cmd = [
            compiler,
            "compile",
            module,
            "--framework",
            "XLA",
            "--target",
            options.target,
            "--lnc",
            options.lnc,
            f"-O{options.opt_level}",
            "--model-type",
            "transformer",
            "--auto-cast=none",
            *shlex.split(os.environ.get("NEURON_CC_FLAGS", "")),
            "--output",
            neff,
        ]
        done = subprocess.run(cmd, capture_output=True, check=False)
        if done.returncode != 0:
            sys.stderr.buffer.write(done.stderr)
            sys.stderr.flush()
            return done.returncode
        if not os.path.isfile(neff):
            print(
                f"torchneuron_like (stand-in): the compiler exited 0 and wrote no {neff}",
                file=sys.stderr,
            )
            return 1
        shutil.copyfile(neff, options.output_neff)
        size = os.path.getsize(options.output_neff)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"neff": options.output_neff, "bytes": size, "argv": cmd}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
