"""STAND-IN for ``vllm-neuron`` with ``libtorch-neuronx-lite``; NOT AWS's code. See
../_standin_lowering.py.

On import it registers the ``torch.compile`` backend ``vllm_neuron`` and the ``neuron``
device (libtorch-neuronx-lite's, not torch-neuronx's: docs/neuron-sdk.md#vllm-neuron).
The backend lowers the program to an HloModuleProto and compiles it as vLLM Neuron does
on a miss of its own cache: tests/standins/vllm_neuron_like.py, ``<wd>/graph.hlo`` in a
fresh ``mkdtemp`` under ``TMPDIR``. [GUESS] That the backend compiles a plain function
outside vLLM's engine is the doctor's guess (live_drivers.py), which this stand-in
takes as true.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import _standin_lowering as lowering
import torch


def _backend(graph: torch.Graph, example_inputs: list[Any]) -> Callable[..., Any]:
    where = tempfile.mkdtemp(prefix="vllm-neuron-standin-")
    hlo = os.path.join(where, "lowered.pb")
    with open(hlo, "wb") as f:
        f.write(lowering.lowered(graph.ops, "hlo"))
    lowering.compile_step("vllm_neuron_like", [hlo, "--work-dir", os.path.join(where, "wd")])
    return lambda *inputs: torch.Tensor(graph.length, torch.device("neuron"), graph.ops)


torch.register_device("neuron", lambda tensor: None)
torch.register_backend("vllm_neuron", _backend)
