"""services/__init__.py: ``build_services`` builds every service once, over injected
stores and the clock it is given, into a ``Services`` nothing can change afterwards."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.services import build_services
from neffcache.server.settings import ServerSettings


def test_services_are_built_over_the_stores_and_clock_given_and_frozen(tmp_path: Path) -> None:
    blobs, index = MemoryBlobStore(), MemoryIndex()
    try:
        services = build_services(
            ServerSettings(data_dir=tmp_path), blob_store=blobs, index=index, clock=lambda: 42.0
        )
        assert services.clock() == 42.0
        assert services.blobs is blobs
        assert services.evictor.policies is services.policies
        assert services.maintenance.evictor is services.evictor
        with pytest.raises(dataclasses.FrozenInstanceError):
            services.clock = lambda: 0.0  # type: ignore[misc]
        services.close()  # injected stores stay open
        assert blobs.size("0" * 64) is None
    finally:
        blobs.close()
        index.close()
