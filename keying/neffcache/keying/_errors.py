"""The one exception keying raises.

    KeyingError (ValueError)
        bytes that are not an HloModuleProto, a malformed flag or environment entry,
        an unknown target, a compiler that cannot be found or does not say its version.

A cache miss is never an exception; only inputs that cannot be keyed are.
"""

from __future__ import annotations


class KeyingError(ValueError):
    """An input cannot be turned into a cache key; the message says which and why."""
