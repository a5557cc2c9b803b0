"""The client's ``Stats`` counters that metrics label by name.

A client may send any counter name matching ``protocol.COUNTER_NAME``: all are stored.
The ``neffcache_client_counters_total`` metric labels only the client's known counters
(``neffcache.protocol.counters.ClientCounter``, where a new counter is added) and
counts every other one as ``other``, so that clients cannot grow the server's series.
"""

from __future__ import annotations

from neffcache.protocol.counters import CLIENT_COUNTERS

__all__ = ["CLIENT_COUNTERS", "OTHER", "counter_label"]

OTHER = "other"


def counter_label(name: str) -> str:
    """The metric label of a counter name: itself when listed, else ``other``."""
    return name if name in CLIENT_COUNTERS else OTHER
