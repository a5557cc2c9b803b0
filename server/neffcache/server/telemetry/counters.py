"""The client's ``Stats`` counters that metrics label by name.

A client may send any counter name matching ``[a-z0-9_]{1,64}``: all are stored. The
``neffcache_client_counters_total`` metric labels only the names below and counts
every other one as ``other``, so that clients cannot grow the server's series. The
list is the client's ``STATS.count(...)`` names (``tests/telemetry`` checks that it
covers every one in ``client/neffcache/client``); add a name here with the counter.
"""

from __future__ import annotations

OTHER = "other"

CLIENT_COUNTERS = frozenset(
    {
        "address_env_mismatches",
        "address_flags_mismatch",
        "address_unverified",
        "auth_errors",
        "bad_downloads",
        "bad_local_blobs",
        "bad_local_manifests",
        "bad_manifests",
        "compile_failures",
        "compiles",
        "config_errors",
        "failures_replayed",
        "hits_l1",
        "hits_server",
        "hook_errors",
        "host_stats_errors",
        "inputs_changed",
        "l1_evicted",
        "l1_evicted_bytes",
        "l1_evicted_manifests",
        "l1_eviction_errors",
        "l1_unwritable",
        "lease_failures_seen",
        "lease_waits",
        "lease_waits_abandoned",
        "leases_held",
        "leases_lost",
        "local_errors",
        "lock_wait_timeouts",
        "placeholders_kept_back",
        "publish_conflicts",
        "publish_failures",
        "publishes",
        "publishes_dropped",
        "publishes_unflushed",
        "server_errors",
        "server_skipped",
        "stock_caches_on_l1",
        "stale_locks_removed",
        "telemetry_dropped",
        "telemetry_errors",
        "telemetry_rejected",
        "telemetry_sent",
        "telemetry_skipped",
        "telemetry_unsent",
        "uncached",
        "unkeyable",
        "wrapper_errors",
        "writes_skipped",
    }
)


def counter_label(name: str) -> str:
    """The metric label of a counter name: itself when listed, else ``other``."""
    return name if name in CLIENT_COUNTERS else OTHER
