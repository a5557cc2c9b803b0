"""The neffcache server (FastAPI on uvicorn).

Depends on ``neffcache.keying`` and the ``server`` extra; nothing in keying or client
imports it. The HTTP API, stores and index arrive with the server-core issue.
"""

from __future__ import annotations

__all__: list[str] = []
