"""The client's counters (``STATS.count(name)``) that the server's metrics label by
name.

A counters event may carry any name matching ``patterns.COUNTER_NAME``: the server
stores them all, but its ``neffcache_client_counters_total`` metric labels only the
names below and counts every other one as ``other``, so that clients cannot grow the
server's series. ``tests/telemetry`` reads every ``STATS.count`` in the client and
checks that each name is listed here: add a member with the counter.

Not imported by ``neffcache.protocol`` itself: building this enum costs more than the
rest of the package. The client's ``stats.py`` imports it, so the shim pays it (about
0.6 ms) for counters that cannot be misspelled.
"""

from __future__ import annotations

import enum


class ClientCounter(enum.Enum):
    # What a graph came to.
    HITS_L1 = "hits_l1"
    HITS_SERVER = "hits_server"
    COMPILES = "compiles"
    COMPILE_FAILURES = "compile_failures"
    UNCACHED = "uncached"
    UNKEYABLE = "unkeyable"
    INPUTS_CHANGED = "inputs_changed"
    FAILURES_REPLAYED = "failures_replayed"
    # Stock addresses that could not be trusted as keys.
    ADDRESS_ENV_MISMATCHES = "address_env_mismatches"
    ADDRESS_FLAGS_MISMATCH = "address_flags_mismatch"
    ADDRESS_UNVERIFIED = "address_unverified"
    # The server: trouble, refusals, and the calls skipped while it is marked down.
    AUTH_ERRORS = "auth_errors"
    SERVER_ERRORS = "server_errors"
    SERVER_SKIPPED = "server_skipped"
    WRITES_SKIPPED = "writes_skipped"
    # Untrusted input refused: manifests and blobs, from the server or from L1.
    BAD_DOWNLOADS = "bad_downloads"
    BAD_LOCAL_BLOBS = "bad_local_blobs"
    BAD_LOCAL_MANIFESTS = "bad_local_manifests"
    BAD_MANIFESTS = "bad_manifests"
    # L1, the host's own cache directory.
    L1_EVICTED = "l1_evicted"
    L1_EVICTED_BYTES = "l1_evicted_bytes"
    L1_EVICTED_MANIFESTS = "l1_evicted_manifests"
    L1_EVICTION_ERRORS = "l1_eviction_errors"
    L1_UNWRITABLE = "l1_unwritable"
    LOCAL_ERRORS = "local_errors"
    LOCK_WAIT_TIMEOUTS = "lock_wait_timeouts"
    STALE_LOCKS_REMOVED = "stale_locks_removed"
    PLACEHOLDERS_KEPT_BACK = "placeholders_kept_back"
    STOCK_CACHES_ON_L1 = "stock_caches_on_l1"
    HOST_STATS_ERRORS = "host_stats_errors"
    # Compile leases.
    LEASES_HELD = "leases_held"
    LEASES_LOST = "leases_lost"
    LEASE_WAITS = "lease_waits"
    LEASE_WAITS_ABANDONED = "lease_waits_abandoned"
    LEASE_FAILURES_SEEN = "lease_failures_seen"
    # Publishes.
    PUBLISHES = "publishes"
    PUBLISH_CONFLICTS = "publish_conflicts"
    PUBLISH_FAILURES = "publish_failures"
    PUBLISHES_DROPPED = "publishes_dropped"
    PUBLISHES_UNFLUSHED = "publishes_unflushed"
    # Telemetry itself.
    TELEMETRY_SENT = "telemetry_sent"
    TELEMETRY_DROPPED = "telemetry_dropped"
    TELEMETRY_ERRORS = "telemetry_errors"
    TELEMETRY_REJECTED = "telemetry_rejected"
    TELEMETRY_SKIPPED = "telemetry_skipped"
    TELEMETRY_UNSENT = "telemetry_unsent"
    # The client's own failures, each turned into a miss.
    CONFIG_ERRORS = "config_errors"
    HOOK_ERRORS = "hook_errors"
    WRAPPER_ERRORS = "wrapper_errors"


CLIENT_COUNTERS: frozenset[str] = frozenset(member.value for member in ClientCounter)
