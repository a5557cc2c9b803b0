"""Imported by ``neffcache_hook.pth`` at interpreter start-up, only when the one-line
pre-check there saw ``neffcache+`` in the environment: arms the libneuronxla hook.
Which URL is in force is settled later, when libneuronxla asks for a cache; arming
costs one finder on ``sys.meta_path``. Any error here is reported and swallowed:
start-up of a training process must never fail because of the cache."""

from __future__ import annotations


def _arm() -> None:
    try:
        import os

        disable = os.environ.get("NEFFCACHE_DISABLE", "").strip().lower()
        if disable in ("", "0", "false", "no", "off"):  # as config.ClientConfig reads it
            from neffcache.client.hook import install

            install()
    except Exception as exc:  # defensive: never break interpreter start-up
        import sys

        print(f"neffcache: the persistent-cache hook is off: {exc}", file=sys.stderr)


_arm()
