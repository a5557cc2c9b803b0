"""The stock Neuron cache address: ``neuronxcc-<version>/MODULE_<key>+<flags8>``.

neffcache stores this address beside its own key so existing caches, tools such as
``neuron_parallel_compile`` and exports interoperate. The ``<key>`` part is whatever
the SDK chose (a decimal uint64 on the PJRT path, 20 hex digits for NxD and
transformers-neuronx; docs/neuron-sdk.md#module_key): its algorithm is not public, so it
is observed, never computed here.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ._compiler import check_compiler_version
from ._errors import KeyingError
from ._inputs import Frozen

_ADDRESS = re.compile(
    r"^neuronxcc-(?P<version>[^/]+)/MODULE_(?P<module_key>[0-9A-Za-z]{1,128})"
    r"\+(?P<flags_hash>[0-9a-f]{8})$"
)
_MODULE_KEY = re.compile(r"^[0-9A-Za-z]{1,128}$")
_FLAGS_HASH = re.compile(r"^[0-9a-f]{8}$")


class NeuronAddress(Frozen):
    """A parsed stock address; ``str()`` gives it back."""

    __match_args__ = ("compiler_version", "module_key", "flags_hash")
    __slots__ = _compared = __match_args__

    if TYPE_CHECKING:  # read-only fields, as a frozen dataclass's

        @property
        def compiler_version(self) -> str: ...
        @property
        def module_key(self) -> str: ...
        @property
        def flags_hash(self) -> str: ...

    def __init__(self, compiler_version: str, module_key: str, flags_hash: str) -> None:
        check_compiler_version(compiler_version)
        if not _MODULE_KEY.fullmatch(module_key):
            raise KeyingError(f"module key {module_key!r} is not 1-128 letters or digits")
        if not _FLAGS_HASH.fullmatch(flags_hash):
            raise KeyingError(f"flags hash {flags_hash!r} is not 8 lowercase hex digits")
        object.__setattr__(self, "compiler_version", compiler_version)
        object.__setattr__(self, "module_key", module_key)
        object.__setattr__(self, "flags_hash", flags_hash)

    def __str__(self) -> str:
        return f"neuronxcc-{self.compiler_version}/MODULE_{self.module_key}+{self.flags_hash}"


def neuron_address(compiler_version: str, module_key: str, flags_hash: str) -> str:
    """Format a stock address, validating every part.

    >>> neuron_address("2.20.9961.0+0acef03a", "16518787498567201059", "3cc9a3cb")
    'neuronxcc-2.20.9961.0+0acef03a/MODULE_16518787498567201059+3cc9a3cb'
    """
    return str(NeuronAddress(compiler_version, module_key, flags_hash))


def parse_neuron_address(address: str) -> NeuronAddress:
    """Parse ``neuronxcc-<ver>/MODULE_<key>+<flags8>``; KeyingError if it is not one."""
    match = _ADDRESS.fullmatch(address)
    if match is None:
        raise KeyingError(
            f"{address!r} is not a Neuron cache address neuronxcc-<version>/MODULE_<key>+<8 hex>"
        )
    return NeuronAddress(match["version"], match["module_key"], match["flags_hash"])
