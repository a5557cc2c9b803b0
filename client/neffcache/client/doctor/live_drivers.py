"""The tiny compiles ``neffcache doctor --live`` makes, one per child process
(``live_child``), each through a stack's own public API as a job calls it:

* ``torchneuron``: ``torch.compile(f, backend="neuron", fullgraph=True)`` on the
  ``neuron`` device, after ``import torch_neuronx`` (TorchNeuron, PyTorch >= 2.10),
  which lowers ``f`` to StableHLO and runs ``neuronx-cc`` by name: the shim;
* ``vllm-neuron``: the same ``f`` under ``torch.compile(backend="vllm_neuron")``, the
  backend vLLM Neuron compiles its models with (``libtorch-neuronx-lite``), which
  lowers to HLO and runs ``neuronx-cc`` by name. [GUESS] That the backend compiles a
  plain function outside vLLM's engine is not documented; when it does not, the
  compiler is never reached and the doctor says it could not drive the stack;
* ``trace``: ``torch_neuronx.trace`` of a module computing ``f``, which runs
  ``neuronx-cc`` on a model folder: the shim;
* ``libneuronxla``: torch-xla's lazy tensors on the XLA device, ``f`` then
  ``xm.mark_step()``: PJRT hands the graph to libneuronxla's persistent cache, which
  asks the hook's cache before it compiles (the torch-xla path of Inf2 and Trn1).

``f(x) = x * SCALE + 1`` over a vector of LENGTH floats, both taken from the run's
seed: the graph is new to the server (the first compile misses even where every
earlier doctor run published its graphs), and both runs of a stack, given the same
seed, ask for the same graph. The length makes it new even where a stack passes the
scale as an input rather than a constant.

A stack that cannot be driven here (it does not import, there is no Neuron device)
raises ``Unavailable``; anything else it raises is the compile's failure. A driver
returns facts about what it compiled, ``graph`` (one line) among them. The test
suite's drivers (``NEFFCACHE_DOCTOR_LIVE_DRIVERS``, see ``live_child``) have the same
form: ``drive(stack, seed, work)``. These are tested too, against stand-ins for the
frameworks (tests/standins/frameworks/) that take each call with the real signature:
a change here must keep to the stacks' public API, or that test fails.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

# The graph's length: small enough to compile in seconds, varied enough to be new.
MIN_LENGTH = 256
LENGTHS = 4096
# The scale's resolution: a prime, so that length and scale vary independently.
SCALES = 1_000_003


class Unavailable(Exception):
    """This stack cannot be driven here: it does not import, or has no device."""


def graph_of(seed: int) -> tuple[int, float]:
    """(LENGTH, SCALE) of the run's graph: 256 to 4351 floats, a scale in [1, 2)."""
    return MIN_LENGTH + seed % LENGTHS, 1.0 + (seed // LENGTHS) % SCALES / SCALES


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # a half-installed stack raises more than ImportError
        raise Unavailable(f"import {name} failed: {type(exc).__name__}: {exc}") from exc


def _neuron_input(torch: Any, length: int) -> Any:
    try:
        return torch.ones(length, device="neuron")
    except Exception as exc:
        raise Unavailable(f"no Neuron device for torch: {type(exc).__name__}: {exc}") from exc


def _what(call: str, length: int, scale: float) -> dict[str, Any]:
    return {"graph": f"{call} of x * {scale!r} + 1 over {length} floats"}


def torchneuron(seed: int, work: str) -> dict[str, Any]:
    torch = _import("torch")
    # The neuron device and backend are TorchNeuron's: registered by its import, which
    # PyTorch's autoload of device extensions may have done already. [GUESS] Whether
    # it does is not documented: imported here either way.
    _import("torch_neuronx")
    length, scale = graph_of(seed)
    x = _neuron_input(torch, length)
    compiled = torch.compile(lambda t: t * scale + 1.0, backend="neuron", fullgraph=True)
    compiled(x).cpu()
    return _what('torch.compile(backend="neuron")', length, scale)


def vllm_neuron(seed: int, work: str) -> dict[str, Any]:
    torch = _import("torch")
    _import("vllm_neuron")  # registers its torch.compile backend
    length, scale = graph_of(seed)
    x = _neuron_input(torch, length)
    compiled = torch.compile(lambda t: t * scale + 1.0, backend="vllm_neuron", fullgraph=True)
    compiled(x).cpu()
    return _what('torch.compile(backend="vllm_neuron")', length, scale)


def trace(seed: int, work: str) -> dict[str, Any]:
    torch = _import("torch")
    torch_neuronx = _import("torch_neuronx")
    if not hasattr(torch_neuronx, "trace"):
        raise Unavailable("this torch-neuronx has no torch_neuronx.trace")
    length, scale = graph_of(seed)

    class Scale(torch.nn.Module):  # type: ignore[misc,name-defined]
        def forward(self, t: Any) -> Any:
            return t * scale + 1.0

    workdir = os.path.join(work, "trace")
    torch_neuronx.trace(Scale(), torch.ones(length), compiler_workdir=workdir)
    return _what("torch_neuronx.trace", length, scale)


def libneuronxla(seed: int, work: str) -> dict[str, Any]:
    torch = _import("torch")
    xm = _import("torch_xla.core.xla_model")
    try:
        device = xm.xla_device()
    except Exception as exc:
        raise Unavailable(f"no XLA device: {type(exc).__name__}: {exc}") from exc
    length, scale = graph_of(seed)
    y = torch.ones(length, device=device) * scale + 1.0
    xm.mark_step()
    y.cpu()
    return _what("torch-xla (xm.mark_step)", length, scale)


DRIVERS: dict[str, Callable[[int, str], dict[str, Any]]] = {
    "torchneuron": torchneuron,
    "vllm-neuron": vllm_neuron,
    "trace": trace,
    "libneuronxla": libneuronxla,
}


def drive(stack: str, seed: int, work: str) -> dict[str, Any]:
    """One tiny compile with ``stack`` (a name of ``DRIVERS``)."""
    return DRIVERS[stack](seed, work)
