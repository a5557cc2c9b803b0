"""STAND-IN for ``torch.nn`` (its ``Module`` only); NOT PyTorch's code."""

from __future__ import annotations

from typing import Any


class Module:
    def forward(self, *args: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any) -> Any:
        return self.forward(*args)
