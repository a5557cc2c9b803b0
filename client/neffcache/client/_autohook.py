"""Imported by ``neffcache_hook.pth`` at interpreter start-up, only when the one-line
pre-check there saw ``neffcache+`` in the environment: arms the libneuronxla hook.
Which URL is in force is settled later, when libneuronxla asks for a cache; arming
costs one finder on ``sys.meta_path``. Any error here is reported and swallowed:
start-up of a training process must never fail because of the cache."""

from __future__ import annotations


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


_arm()
