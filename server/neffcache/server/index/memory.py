"""An in-memory index: the shipped fake for tests, and ``memory://`` for trials."""

from __future__ import annotations

from .catalogs import MemoryCatalogs
from .primitive_roles import PrimitiveRoles
from .primitives import MemoryCells, MemoryLogs, MemoryMaps
from .sequences import MemorySequences


class MemoryIndex(PrimitiveRoles):
    # Answers come from this machine: the server may call it on its event loop.
    local = True

    def __init__(self) -> None:
        catalogs = MemoryCatalogs()
        # The aliases, (namespace, alias) -> key: tests plant data from before here.
        self._aliases = catalogs.names
        # Every role written once over primitives.
        super().__init__(MemoryCells(), MemoryLogs(), MemoryMaps(), MemorySequences(), catalogs)

    @classmethod
    def from_url(cls, url: str) -> MemoryIndex:
        return cls()

    def check(self) -> None:
        return None

    def close(self) -> None:
        return None
