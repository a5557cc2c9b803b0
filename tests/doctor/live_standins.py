"""The stand-ins playing the stacks for ``neffcache doctor --live``: the drivers file
the tests name in ``NEFFCACHE_DOCTOR_LIVE_DRIVERS`` (loaded by
``neffcache.client.doctor.live_child`` in its child process, in place of the real
stacks' ``live_drivers``).

Each makes the graph its stack would hand over, new to the server for each seed:

* ``torchneuron``: StableHLO bytecode (tests/fixtures/mlir/block_a.mlirbc, its scale
  2.0 replaced by the seed's) through tests/standins/torchneuron_like.py, which runs
  ``neuronx-cc`` by name from a fresh ``mkdtemp`` directory;
* ``vllm-neuron``: an HloModuleProto (tests/fixtures/hlo/block_a.pb, its scale
  replaced the same way) as ``<wd>/graph.hlo`` through vllm_neuron_like.py;
* ``trace``: the same module in a model folder through trace_like.py;
* ``libneuronxla``: the same module through the stand-in
  ``libneuronxla.neuron_xla_compile`` (its persistent cache: the hook), as
  tests/client/train_like.py calls it.

Two stacks that misbehave, for the doctor to name:

* ``NEFFCACHE_LIVE_STANDIN_UNSTABLE=1`` mixes the process id into the scale: a stack
  whose graph differs from one run to the next (the second run then compiles again);
* ``NEFFCACHE_LIVE_STANDIN_RETRACE=1``: the second run (the doctor's ``run-2``
  directory) hands over another trace of the same program (block_b_renamed.pb: other
  names and metadata), whose raw bytes, and so whose stock address, differ: the hook
  then misses, and the shim finds the program by its canonical key.

Not collected by pytest.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent
STANDINS = TESTS / "standins"
MLIR = TESTS / "fixtures" / "mlir" / "block_a.mlirbc"
HLO = TESTS / "fixtures" / "hlo" / "block_a.pb"
RETRACED = TESTS / "fixtures" / "hlo" / "block_b_renamed.pb"
SCALE = struct.pack("<f", 2.0)  # block_a's one constant besides 0.0
HLO_SCALE = b"B\x04" + SCALE  # LiteralProto.f32s (field 8, packed): four bytes


def _scale(seed: int) -> float:
    if os.environ.get("NEFFCACHE_LIVE_STANDIN_UNSTABLE") == "1":
        seed += os.getpid()
    return 1.0 + seed % 1_000_003 / 1_000_003


def _with_scale(data: bytes, pattern: bytes, scale: float) -> bytes:
    assert data.count(pattern) == 1, "the fixture's scale is not where this driver expects"
    return data.replace(pattern, pattern[: -len(SCALE)] + struct.pack("<f", scale))


def _run(module: str, argv: list[str]) -> None:
    sys.path.insert(0, str(STANDINS))
    code = __import__(module).main(argv)
    if code != 0:
        raise RuntimeError(f"{module} exited {code}")


def drive(stack: str, seed: int, work: str) -> dict[str, Any]:
    scale = _scale(seed)
    where = Path(work)
    hlo = where / "graph.pb"
    retraced = os.environ.get("NEFFCACHE_LIVE_STANDIN_RETRACE") == "1"
    source = RETRACED if retraced and where.parent.name == "run-2" else HLO
    hlo.write_bytes(_with_scale(source.read_bytes(), HLO_SCALE, scale))
    if stack == "torchneuron":
        mlir = where / "module.mlirbc"
        mlir.write_bytes(_with_scale(MLIR.read_bytes(), SCALE, scale))
        (where / "tmp").mkdir()
        out = ["--output-neff", str(where / "out.neff")]
        _run("torchneuron_like", [str(mlir), *out, "--tmp-root", str(where / "tmp")])
    elif stack == "vllm-neuron":
        _run("vllm_neuron_like", [str(hlo), "--work-dir", str(where / "vllm")])
    elif stack == "trace":
        _run("trace_like", [str(hlo), "--workdir", str(where / "trace")])
    elif stack == "libneuronxla":
        import libneuronxla

        libneuronxla.neuron_xla_compile(
            hlo.read_bytes(), ["--model-type=transformer"], platform_target="trn1"
        )
    else:
        raise ValueError(f"no stand-in plays {stack}")
    return {"graph": f"stand-in {stack}: block_a with its scale {scale!r}"}
