"""STAND-INS for PyTorch, TorchNeuron (``torch_neuronx``), torch-xla and vLLM Neuron:
what the packages of this folder share. NOT the real frameworks' code.

This folder holds just enough of ``torch``, ``torch_neuronx``, ``torch_xla`` and
``vllm_neuron`` for ``neffcache doctor --live``'s real drivers
(client/neffcache/client/doctor/live_drivers.py) to run here as on a trn host, so that
a test covers their code path and fails when a driver breaks: each call a driver makes
exists here with the real call's signature (keyword-only where the real one is), and
ends in the compile step that the stack's stand-in in tests/standins/ imitates
(docs/neuron-sdk.md#the-sdk-in-late-2026-torchneuron-vllm-neuron):

* ``torch.compile(f, backend="neuron")`` (torch_neuronx): StableHLO bytecode through
  torchneuron_like.py;
* ``torch.compile(f, backend="vllm_neuron")`` (vllm_neuron): an HloModuleProto as
  ``<wd>/graph.hlo`` through vllm_neuron_like.py;
* ``torch_neuronx.trace``: a model folder through trace_like.py;
* torch-xla's ``xm.mark_step()``: ``libneuronxla.neuron_xla_compile`` (the stand-in
  libneuronxla, its persistent cache: the hook).

Tensors are lazy: a tensor is its length, its device and the operations that made it.
Lowering knows one program, ``x * s + 1`` (the drivers' ``f``): it is
tests/fixtures' ``block_a`` with its scale constant (2.0) replaced by ``s``, so that
each scale is a graph new to the server. [GUESS] The length is not in the lowered
graph (block_a's shape is fixed): two programs that differ only in length lower alike.
Any other program raises NotImplementedError: the stand-ins' limit, not the stack's.

Put this folder on ``PYTHONPATH`` only where a test wants these packages importable:
elsewhere ``import torch`` must fail, as it does on a host without PyTorch.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

STANDINS = Path(__file__).resolve().parent.parent
FIXTURES = STANDINS.parent / "fixtures"
MLIR = FIXTURES / "mlir" / "block_a.mlirbc"
HLO = FIXTURES / "hlo" / "block_a.pb"
SCALE = struct.pack("<f", 2.0)  # block_a's one constant besides 0.0
HLO_SCALE = b"B\x04" + SCALE  # LiteralProto.f32s (field 8, packed): four bytes


def scale_of(ops: tuple[tuple[str, float], ...]) -> float:
    """``s`` of the program ``x * s + 1``; NotImplementedError for any other."""
    if len(ops) != 2 or ops[0][0] != "mul" or ops[1] != ("add", 1.0):
        raise NotImplementedError(f"the stand-in frameworks lower only x * s + 1, not {ops}")
    return ops[0][1]


def lowered(ops: tuple[tuple[str, float], ...], form: str) -> bytes:
    """The program as ``form`` (``mlir``: StableHLO bytecode; ``hlo``: HloModuleProto)."""
    fixture, pattern = (MLIR, SCALE) if form == "mlir" else (HLO, HLO_SCALE)
    data = fixture.read_bytes()
    assert data.count(pattern) == 1, f"{fixture.name}'s scale is not where the stand-in expects"
    return data.replace(pattern, pattern[: -len(SCALE)] + struct.pack("<f", scale_of(ops)))


def compile_step(module: str, argv: list[str]) -> None:
    """Run the stand-in compile step ``module`` (tests/standins/MODULE.py) in-process,
    as the stack runs its compiler: RuntimeError when it fails."""
    if str(STANDINS) not in sys.path:
        sys.path.insert(0, str(STANDINS))
    step: Any = __import__(module)
    code = step.main(argv)
    if code != 0:
        raise RuntimeError(f"{module} (stand-in) exited {code}")
