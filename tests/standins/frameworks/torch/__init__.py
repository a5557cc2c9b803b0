"""STAND-IN for PyTorch (``torch``); NOT PyTorch's code. See ../_standin_lowering.py.

What the doctor's live drivers call, with the real signatures: ``torch.ones``,
``torch.compile``, ``torch.device``, ``torch.nn.Module``, a tensor's ``*``, ``+`` and
``.cpu()``. Tensors are lazy records (length, device, operations).

Devices and ``torch.compile`` backends are registered by the packages that bring them
(``register_device``, ``register_backend``) when they are imported: ``cpu`` is built
in, an unknown device or backend raises as PyTorch does. [GUESS] Whether PyTorch's
autoload of device extensions (the ``torch.backends`` entry points) imports TorchNeuron
on ``import torch`` is not in docs/neuron-sdk.md; this stand-in does not, so that a
caller here works only if it imports ``torch_neuronx`` itself, which works either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A device type's hook, called when a tensor of it is made: ``created(tensor)``.
_DEVICES: dict[str, Callable[[Tensor], None]] = {"cpu": lambda tensor: None}
# A backend: ``backend(graph, example_inputs)`` returns the compiled callable.
_BACKENDS: dict[str, Callable[[Graph, list[Any]], Callable[..., Any]]] = {}


def register_device(name: str, created: Callable[[Tensor], None]) -> None:
    _DEVICES[name] = created


def register_backend(name: str, backend: Callable[[Graph, list[Any]], Callable[..., Any]]) -> None:
    _BACKENDS[name] = backend


class _Device:
    def __init__(self, type: str, index: int | None = None) -> None:
        kind, _, number = type.partition(":")
        self.type = kind
        self.index = int(number) if number else index

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


device = _Device  # PyTorch's name; ``ones`` takes a parameter of that name


class Tensor:
    """``length`` floats on ``device``, made by ``ops`` from ones."""

    def __init__(
        self, length: int, device_: _Device, ops: tuple[tuple[str, float], ...] = ()
    ) -> None:
        self.length, self.device, self.ops = length, device_, ops
        self.materialized: Callable[[Tensor], None] | None = None
        _DEVICES[device_.type](self)

    def _then(self, op: str, value: Any) -> Tensor:
        if not isinstance(value, (int, float)):
            raise NotImplementedError(f"the stand-in torch takes scalars only, not {value!r}")
        return Tensor(self.length, self.device, (*self.ops, (op, float(value))))

    def __mul__(self, value: Any) -> Tensor:
        return self._then("mul", value)

    def __add__(self, value: Any) -> Tensor:
        return self._then("add", value)

    def cpu(self) -> Tensor:
        """The values on the host: a lazy device (xla) compiles what it has not yet."""
        if self.materialized is not None:
            self.materialized(self)
        return Tensor(self.length, _Device("cpu"), self.ops)


def ones(*size: int, device: str | _Device | None = None, **kwargs: Any) -> Tensor:
    where = _Device(str(device or "cpu"))
    if where.type not in _DEVICES:
        raise RuntimeError(
            f"Expected one of {', '.join(sorted(_DEVICES))} device type at start of device "
            f"string: {where.type}"
        )
    if len(size) != 1:
        raise NotImplementedError("the stand-in torch makes vectors only")
    return Tensor(size[0], where)


class Graph:
    """What a backend gets: the program's operations and its input's length."""

    def __init__(self, ops: tuple[tuple[str, float], ...], length: int) -> None:
        self.ops, self.length = ops, length


def compile(
    model: Callable[..., Any] | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable[..., Any] = "inductor",
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    disable: bool = False,
) -> Any:
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise RuntimeError(f"invalid backend {backend!r} (the stand-in torch knows {_BACKENDS})")
    chosen = _BACKENDS[backend]
    if model is None:
        raise NotImplementedError("the stand-in torch.compile is not a decorator factory")
    compiled: dict[int, Callable[..., Any]] = {}

    def run(*inputs: Tensor) -> Any:
        traced = model(*inputs)  # the lazy tensors record the program
        key = hash(traced.ops)
        if key not in compiled:
            compiled[key] = chosen(Graph(traced.ops, inputs[0].length), list(inputs))
        return compiled[key](*inputs)

    return run


from torch import nn  # noqa: E402 -- after Tensor, which nn's users need

__all__ = ["Graph", "Tensor", "compile", "device", "nn", "ones"]
