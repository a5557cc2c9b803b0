"""Arms the libneuronxla hook; imported through ``neffcache_hook.pth``, which is
installed with the package and runs at every interpreter start-up.

The ``.pth`` line costs almost nothing when no cache is configured: it imports no
neffcache module, and puts one finder on ``sys.meta_path`` that does nothing until
``libneuronxla`` is imported; then it imports this module, which arms the hook, and
lets the hook's finder load libneuronxla (:func:`find_spec`). Arming does not depend
on the environment at start-up because the cache URL is often set later, in the script
itself (docs/neuron-sdk.md#when-the-cache-url-is-set: NxD Training exports it inside
each worker, the SDK's own caching page sets ``os.environ``); which URL is in force is
settled when libneuronxla asks for a cache. When the start-up environment already names
a ``neffcache+`` URL, the ``.pth`` line imports this module at once.

Any error here is reported and swallowed: neither start-up nor the import of
libneuronxla may fail because of the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any


def _arm() -> None:
    try:
        # Armed even with NEFFCACHE_DISABLE: the hook then hands the SDK a stock cache
        # on the L1 directory, where without it the SDK would make a directory named
        # after the neffcache+ URL.
        from neffcache.client.hook import install

        install()
    except Exception as exc:  # defensive: never break interpreter start-up
        import sys

        print(f"neffcache: the persistent-cache hook is off: {exc}", file=sys.stderr)


def find_spec(fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
    """The spec of ``fullname`` (``libneuronxla``) as the armed hook finds it; for the
    ``.pth`` line's finder. None when the hook cannot load: the import goes on as if
    neffcache were not installed."""
    try:
        from neffcache.client import hook

        return hook.find_spec(fullname, path, target)
    except Exception as exc:  # defensive: never break the SDK's import
        import sys

        print(f"neffcache: the persistent-cache hook is off: {exc}", file=sys.stderr)
        return None


_arm()
