"""The neffcache server (FastAPI on uvicorn): ``neffcache serve``.

Depends on ``neffcache.keying`` and the ``server`` extra; nothing in keying or client
imports it.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "create_app"]


def __getattr__(name: str) -> object:
    # create_app pulls in FastAPI: import it only when asked, so `import
    # neffcache.server` stays cheap for the CLI's command registration.
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
