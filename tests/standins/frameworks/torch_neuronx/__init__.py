"""STAND-IN for ``torch-neuronx`` (TorchNeuron); NOT AWS's code. See
../_standin_lowering.py.

On import it registers the ``neuron`` device and the ``torch.compile`` backend
``neuron`` with the stand-in torch. The backend lowers the program to StableHLO
bytecode and compiles it as TorchNeuron does on a miss of its NEFF cache
(docs/neuron-sdk.md#torchneurons-compiler-call): tests/standins/torchneuron_like.py,
``neuronx-cc`` by name from a fresh ``mkdtemp`` under ``TMPDIR``, ``-O2``.
``trace`` has ``torch_neuronx.trace``'s signature and builds the model folder
tests/standins/trace_like.py builds (docs/neuron-sdk.md#torch-neuronx-tracing).
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Callable
from typing import Any

import _standin_lowering as lowering
import torch


def _neuron_backend(graph: torch.Graph, example_inputs: list[Any]) -> Callable[..., Any]:
    where = tempfile.mkdtemp(prefix="torchneuron-standin-")
    module = os.path.join(where, "module.mlirbc")
    with open(module, "wb") as f:
        f.write(lowering.lowered(graph.ops, "mlir"))
    out = ["--output-neff", os.path.join(where, "module.neff")]
    lowering.compile_step("torchneuron_like", [module, *out, "--tmp-root", where])
    return lambda *inputs: torch.Tensor(graph.length, torch.device("neuron"), graph.ops)


def trace(
    func: Callable[..., Any],
    example_inputs: Any,
    *_: Any,
    input_output_aliases: dict[Any, Any] | None = None,
    compiler_workdir: str | os.PathLike[str] | None = None,
    compiler_args: str | list[str] | None = None,
    partitioner_config: Any = None,
    inline_weights_to_neff: bool = True,
) -> Callable[..., Any]:
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    traced = func(*inputs)
    workdir = os.fspath(compiler_workdir or tempfile.mkdtemp(prefix="trace-standin-"))
    os.makedirs(workdir, exist_ok=True)
    graph = os.path.join(workdir, "lowered.pb")
    with open(graph, "wb") as f:
        f.write(lowering.lowered(traced.ops, "hlo"))
    args = shlex.split(compiler_args) if isinstance(compiler_args, str) else compiler_args or []
    lowering.compile_step(
        "trace_like", [graph, "--workdir", workdir, *(["--", *args] if args else [])]
    )
    length, ops = traced.length, traced.ops
    return lambda *given: torch.Tensor(length, torch.device("cpu"), ops)


torch.register_device("neuron", lambda tensor: None)
torch.register_backend("neuron", _neuron_backend)
