"""What runs inside training images: the ``neffcache`` command line today; the
persistent-cache hook and the ``neuronx-cc`` wrapper build on it.

Depends on ``neffcache.keying`` and httpx only; never on FastAPI, pydantic, redis or
boto3, because training images pin their own stacks.
"""

from __future__ import annotations

__all__: list[str] = []
