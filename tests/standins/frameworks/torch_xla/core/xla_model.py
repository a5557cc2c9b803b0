"""STAND-IN for ``torch_xla.core.xla_model``; NOT torch-xla's code. See
../../_standin_lowering.py.

``xla_device()`` loads the Neuron PJRT plugin, libneuronxla (the stand-in, whose
import arms neffcache's hook as a job's does), and registers the lazy ``xla`` device.
Operations on its tensors are recorded; ``mark_step()`` (or a tensor's ``.cpu()``)
lowers each live tensor's pending program to an HloModuleProto and hands it to
``libneuronxla.neuron_xla_compile``, which asks its persistent cache first
(docs/neuron-sdk.md#where-the-cache-sits). [GUESS] The flags: none from the caller,
``NEURON_CC_FLAGS`` read by libneuronxla itself; the target ``trn1``. Real torch-xla
fuses the live tensors into one graph; this compiles one per tensor.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

import _standin_lowering as lowering
import torch

_LIVE: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()


def _created(tensor: torch.Tensor) -> None:
    if tensor.ops:
        tensor.materialized = _sync
        _LIVE.add(tensor)


def _sync(tensor: torch.Tensor) -> None:
    if tensor in _LIVE:
        _LIVE.discard(tensor)
        libneuronxla: Any = importlib.import_module("libneuronxla")
        libneuronxla.neuron_xla_compile(
            lowering.lowered(tensor.ops, "hlo"), [], platform_target="trn1"
        )


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    importlib.import_module("libneuronxla")  # the PJRT plugin: no plugin, no device
    torch.register_device("xla", _created)
    return torch.device("xla", 0 if n is None else n)


def mark_step(wait: bool = False) -> None:
    for tensor in list(_LIVE):
        _sync(tensor)
