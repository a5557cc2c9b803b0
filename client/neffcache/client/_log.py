"""The client's logger, loaded on first use: ``logging``'s import costs about 3 ms, and
the compiler wrapper's cache hits log nothing (one start-up per graph)."""

from __future__ import annotations

from typing import Any


class _LazyLogger:
    def __getattr__(self, name: str) -> Any:
        import logging

        return getattr(logging.getLogger("neffcache.client"), name)


log: Any = _LazyLogger()
