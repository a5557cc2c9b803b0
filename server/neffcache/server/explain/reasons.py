"""The reasons a graph can miss: one vocabulary for explanations, the client's run
manifest and events, the reports and the metrics.

Codes are stable strings (reports and dashboards group by them). Metrics label only
by these codes, so a client cannot grow the series with made-up ones.
"""

from __future__ import annotations

from collections.abc import Mapping

REASONS: Mapping[str, str] = {
    "new-graph": "nothing the server knows shares this program",
    "shapes-changed": "a graph of the same structure exists, with other shapes",
    "graph-changed": "the closest graph the server knows is another program",
    "compiler-changed": "the same program was compiled under another compiler version",
    "flags-changed": "the same program was compiled with other compiler flags",
    "target-changed": "the same program was compiled for another target",
    "env-changed": "the same program was compiled under other compile-relevant variables",
    "evicted": "this graph's entry was removed by a quota, compiler retention or an admin",
    "expired": "this graph's entry was removed after going unused for its namespace's TTL",
    "failed-before": "the last compile of this graph failed",
    "published-since": "an entry exists now: it was published after the miss",
    "other-namespace": "an entry exists in a namespace this one does not read through",
    "server-unavailable": "the client could not ask the server (down, timeout, back-off)",
    "unauthorized": "the server refused the client's token (none, or unknown or revoked)",
    "forbidden": "the client's token does not cover its namespace",
    "unkeyable": "the client could not compute this graph's key",
    "uncached": "caching was off for this compile",
    "unknown": "no explanation arrived in time, or none applies",
}

# What a client can decide without the server.
CLIENT_REASONS = frozenset(
    {"server-unavailable", "unkeyable", "uncached", "unknown", "unauthorized", "forbidden"}
)


def is_reason(code: object) -> bool:
    return isinstance(code, str) and code in REASONS


def reason_label(code: object) -> str:
    """The code itself when known, else ``unknown``: a bounded metric label."""
    return code if isinstance(code, str) and code in REASONS else "unknown"
