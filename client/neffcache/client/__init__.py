"""What runs inside training images: the libneuronxla persistent-cache hook (armed by
``neffcache_hook.pth``), the ``neuronx-cc`` wrapper and its shim, and the ``neffcache``
command line. See docs/client.md.

Depends on ``neffcache.keying`` and the standard library only; never on FastAPI,
pydantic, redis or boto3 (or even httpx), because training images pin their own
stacks, and because every Python process of such an image imports the hook.
"""

from __future__ import annotations

__all__: list[str] = []
