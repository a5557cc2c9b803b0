"""The server's Prometheus metrics, all defined here (``GET /metrics``).

Names follow ``neffcache_<component>_<what>[_total]``. Each replica counts what it
served; Prometheus sums replicas. Every app has its own registry, so several apps in
one process (tests, a bench) never mix their counts. The per-namespace gauges read the
index, at most once a minute, when Prometheus scrapes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Namespaces labelled by name, at most: past it, a namespace is counted as "_other", so
# a token that may name any namespace cannot grow the server's series without bound.
MAX_NAMESPACE_LABELS = 1000
OTHER = "_other"

# Seconds: a lease wait lasts from a moment to a long compile.
_WAIT_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 1800, 3600)
# Seconds: a client's fetch is an L1 copy (milliseconds) or a download of a large NEFF.
_FETCH_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300)
# Seconds: a compile takes from seconds to hours for the largest graphs.
_COMPILE_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400)


@dataclass(frozen=True)
class Usage:
    namespace: str
    entries: int
    bytes: int
    quota_bytes: int | None


class Metrics:
    def __init__(self, usage: Callable[[], Iterable[Usage]], usage_ttl: float = 60.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labelled: set[str] = set()
        self._label_lock = threading.Lock()
        self._entry_children: dict[tuple[str, str], Any] = {}
        r = self.registry
        #: Entry requests answered (a lookup by key or alias, a lease request naming an
        #: entry), by namespace asked and answer: ``hit`` (own namespace),
        #: ``hit_read_through`` (a namespace it reads), ``absent``. Requests, not graphs:
        #: a client probes several addresses for one graph and polls leases, and hits
        #: from a host's own cache never reach the server, so no hit rate comes from
        #: these; ``client_graphs`` counts graphs.
        self.entry_requests = Counter(
            "neffcache_entry_requests_total",
            "Entry requests answered, by answer: server probes, not graphs (no hit rate: "
            "see neffcache_client_graphs_total)",
            ["namespace", "answer"],
            registry=r,
        )
        #: Publishes by namespace and result: created, same, conflict, refused.
        self.publishes = Counter(
            "neffcache_publishes_total",
            "Entry publishes by result",
            ["namespace", "result"],
            registry=r,
        )
        #: Blob downloads answered (hit, miss; a redirect is a hit), and the bytes of the
        #: answers the server sent (their Content-Length: whole blobs and ranges; a
        #: download cut off counts in full).
        self.blob_reads = Counter(
            "neffcache_blob_reads_total", "Blob downloads answered", ["result"], registry=r
        )
        self.blob_bytes_served = Counter(
            "neffcache_blob_bytes_served_total", "Bytes of blob answers", registry=r
        )
        #: Blobs sent inside an entry lookup's answer (protocol/inline.py); also counted
        #: as blob reads, their bytes in blob_bytes_served.
        self.blob_inlined = Counter(
            "neffcache_blob_inlined_total", "Blobs sent inline in a lookup's answer", registry=r
        )
        #: Hits answered with a redirect to a presigned URL (blob_redirect_seconds), and
        #: the blobs' bytes, which the store sent instead (not in blob_bytes_served).
        self.blob_redirects = Counter(
            "neffcache_blob_redirects_total", "Blob downloads redirected to the store", registry=r
        )
        self.blob_bytes_redirected = Counter(
            "neffcache_blob_bytes_redirected_total",
            "Bytes of blobs redirected to the store",
            registry=r,
        )
        #: Hits answered with X-Accel-Redirect (accel_redirect_prefix): nginx sent the
        #: file, whose bytes are counted here (not in blob_bytes_served).
        self.blob_accel = Counter(
            "neffcache_blob_accel_total", "Blob downloads handed to nginx", registry=r
        )
        self.blob_bytes_accel = Counter(
            "neffcache_blob_bytes_accel_total", "Bytes of blobs nginx sent", registry=r
        )
        #: Blobs found corrupt and quarantined, by what found them: ``read`` (a
        #: download), ``scrub`` (the background pass), ``report`` (a client's report).
        self.blob_mismatches = Counter(
            "neffcache_blob_mismatches_total",
            "Corrupt blobs quarantined",
            ["found_by"],
            registry=r,
        )
        #: Blobs and bytes the scrub read and hashed, and when this replica last ended
        #: a full pass (epoch seconds; 0 until then).
        self.scrub_blobs = Counter(
            "neffcache_scrub_blobs_total", "Blobs the scrub verified", registry=r
        )
        self.scrub_bytes = Counter(
            "neffcache_scrub_bytes_total", "Bytes the scrub verified", registry=r
        )
        self.scrub_last_pass = Gauge(
            "neffcache_scrub_last_full_pass_timestamp_seconds",
            "When this replica last ended a full scrub pass",
            registry=r,
        )
        #: Clients' mismatch reports by what became of them: ``queued`` (rechecked),
        #: ``recent`` (rechecked lately: ignored), ``busy`` (too many queued), ``absent``.
        self.mismatch_reports = Counter(
            "neffcache_mismatch_reports_total",
            "Client reports of blobs that did not match their digest",
            ["result"],
            registry=r,
        )
        #: Entries removed by eviction or expiry, and their bytes, by namespace and reason
        #: (expired, compiler-retention, quota, admin-expire).
        self.evictions = Counter(
            "neffcache_evictions_total", "Entries removed", ["namespace", "reason"], registry=r
        )
        self.evicted_bytes = Counter(
            "neffcache_evicted_bytes_total",
            "Bytes of entries removed",
            ["namespace", "reason"],
            registry=r,
        )
        #: Unreferenced blobs collected, and their bytes.
        self.blobs_collected = Counter(
            "neffcache_blobs_collected_total", "Unreferenced blobs removed", registry=r
        )
        self.blob_bytes_collected = Counter(
            "neffcache_blob_bytes_collected_total",
            "Bytes of unreferenced blobs removed",
            registry=r,
        )
        #: Answers to compile-lease requests by namespace and state (done, granted,
        #: held, failed, free), and how long each request waited before its answer.
        self.lease_answers = Counter(
            "neffcache_lease_answers_total",
            "Compile lease answers",
            ["namespace", "state"],
            registry=r,
        )
        self.lease_wait = Histogram(
            "neffcache_lease_wait_seconds",
            "Time a lease request waited",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        # --- from clients' telemetry events (POST /v1/events), counted when stored.
        #: Events stored, by kind (graph, counters).
        self.events_received = Counter(
            "neffcache_events_received_total", "Telemetry events stored", ["kind"], registry=r
        )
        #: Graphs clients resolved, by namespace, result (hit, miss) and where the NEFF
        #: came from (l1, server, compiler; unknown when the event does not say): one
        #: per graph, whatever it took to find it, so the hit rate is its hits over all.
        self.client_graphs = Counter(
            "neffcache_client_graphs_total",
            "Graphs clients resolved, one per graph (the hit rate's counter)",
            ["namespace", "result", "source"],
            registry=r,
        )
        #: Clients' compiles (misses that compiled), by namespace and outcome (ok,
        #: failed): the graphs that cost compile time.
        self.client_compiles = Counter(
            "neffcache_client_compiles_total",
            "Graphs clients compiled, by outcome",
            ["namespace", "outcome"],
            registry=r,
        )
        #: Clients' misses by namespace and reason: one of the shared reason codes
        #: (explain/reasons.py), anything else or none as ``unknown``.
        self.client_misses = Counter(
            "neffcache_client_misses_total",
            "Client misses by reason",
            ["namespace", "reason"],
            registry=r,
        )
        #: How long clients took to fetch a NEFF (L1 or server), per graph that says.
        self.client_fetch_seconds = Histogram(
            "neffcache_client_fetch_seconds",
            "Client fetch time per graph",
            buckets=_FETCH_BUCKETS,
            registry=r,
        )
        #: How long clients' compiles took (failed ones too), per graph that says.
        self.client_compile_seconds = Histogram(
            "neffcache_client_compile_seconds",
            "Client compile time per graph",
            buckets=_COMPILE_BUCKETS,
            registry=r,
        )
        #: Clients' Stats counters (fall-backs, server errors, timeouts...), summed
        #: over their deltas; names outside the client's known list count as ``other``.
        self.client_counters = Counter(
            "neffcache_client_counters_total",
            "Client counters, summed",
            ["name"],
            registry=r,
        )
        r.register(_UsageCollector(usage, usage_ttl))

    def entry_answered(self, namespace: str, answer: str) -> None:
        """Count an entry request's answer; each labelled child is looked up once (as
        many as there are namespace labels, which ``namespace`` bounds)."""
        label = self.namespace(namespace)
        child = self._entry_children.get((label, answer))
        if child is None:
            child = self.entry_requests.labels(label, answer)
            self._entry_children[(label, answer)] = child
        child.inc()

    def namespace(self, name: str) -> str:
        """The label of a namespace: its name, for the first ``MAX_NAMESPACE_LABELS``."""
        if name in self._labelled:
            return name
        with self._label_lock:
            if len(self._labelled) < MAX_NAMESPACE_LABELS:
                self._labelled.add(name)
                return name
        return OTHER

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _UsageCollector(Collector):
    """Entries, bytes and quota per namespace: a scan of the index, cached."""

    def __init__(self, usage: Callable[[], Iterable[Usage]], ttl: float) -> None:
        self._usage = usage
        self._ttl = ttl
        self._cached: tuple[float, list[Usage]] | None = None
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # no scan at registration: the families are named when collected

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > self._ttl:
                self._cached = (now, list(self._usage()))
            found = self._cached[1]
        entries = GaugeMetricFamily(
            "neffcache_namespace_entries", "Entries held", labels=["namespace"]
        )
        held = GaugeMetricFamily(
            "neffcache_namespace_bytes", "Bytes of entries held", labels=["namespace"]
        )
        quota = GaugeMetricFamily(
            "neffcache_namespace_quota_bytes", "Quota of the namespace", labels=["namespace"]
        )
        for usage in found:
            entries.add_metric([usage.namespace], usage.entries)
            held.add_metric([usage.namespace], usage.bytes)
            if usage.quota_bytes is not None:
                quota.add_metric([usage.namespace], usage.quota_bytes)
        yield from (entries, held, quota)
