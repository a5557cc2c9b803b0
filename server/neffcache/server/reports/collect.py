"""Reading the stores for the reports, a page at a time, and folding what is read.

``build_cost_report`` and ``build_upgrade_report`` do it all in the calling thread:
store calls, parsing and folding. The API calls them in a worker thread (with the
rendering), one report at a time (``gate.py``), never on the event loop: a report
over thousands of events takes seconds of CPU, which on the loop would be seconds
of every lookup, download and health check waiting. Folding pauses now and then
(``pace.py``) so that the loop gets the GIL back soon.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from neffcache.server.eviction.pins import version_matches
from neffcache.server.index import EntryStats, Index
from neffcache.server.reports.cost import CostReport
from neffcache.server.reports.pace import Pace, paced
from neffcache.server.reports.prices import CURRENCY, load_prices
from neffcache.server.reports.programs import program_of
from neffcache.server.reports.storage import storage_rows
from neffcache.server.reports.upgrade import (
    DEFAULT_ACTIVE_SECONDS,
    MAX_BUILT,
    NamespaceUpgrade,
    totals,
)
from neffcache.server.services import Services

EVENT_PAGE = 1000
ENTRY_PAGE = 1000


def build_cost_report(
    backends: Services,
    since: float,
    until: float,
    by: Sequence[str],
    namespaces: Sequence[str] | None,
    top: int,
) -> dict[str, Any]:
    """The cost report of ``namespaces`` (None: every namespace)."""
    report = CostReport(since, until, by, load_prices(backends.settings.price_table), top)
    pace = Pace()
    after: str | None = None
    while True:
        page, after = backends.index.events(since, until, namespaces, after, EVENT_PAGE)
        report.add_all(paced(page, pace))
        if after is None:
            break
    names: Sequence[str]
    if namespaces is None:
        names = sorted(set(_namespaces_held(backends)) | report.namespaces)
    else:
        names = namespaces
    storage = storage_rows(backends.usage, backends.policies, names)
    return report.result(storage, generated_at=time.time())


def _namespaces_held(backends: Services) -> list[str]:
    """Every namespace with entries or a policy."""
    return [policy.namespace for policy in backends.policies.all()]


def build_upgrade_report(
    backends: Services,
    to_compiler: str,
    namespaces: Sequence[str] | None,
    *,
    from_compiler: str | None,
    active_seconds: float | None,
    top: int,
    server: str,
) -> dict[str, Any]:
    """The upgrade report of ``namespaces`` (None: every namespace with entries)."""
    prices = load_prices(backends.settings.price_table)
    if namespaces is None:
        namespaces = backends.index.namespaces()
    now = time.time()
    pace = Pace()
    parts = []
    # Graphs built under to_compiler, per namespace: read once, however many
    # namespaces read through it.
    built: dict[str, tuple[set[bytes], bool]] = {}
    for namespace in sorted(set(namespaces)):
        window = active_seconds
        if window is None:
            window = backends.policies.get(namespace).ttl_seconds or DEFAULT_ACTIVE_SECONDS
        plan = NamespaceUpgrade(namespace, to_compiler, now - window, top, from_compiler)
        # Where an upgraded job's lookup finds an entry: here, then the read-through.
        for source in [namespace, *backends.policies.sources(namespace)]:
            if source not in built:
                built[source] = _read_built(backends.index, source, to_compiler, pace)
            programs, partial = built[source]
            plan.add_built(programs, partial=partial)
        _read_entries(backends, plan, pace)
        _read_events(backends, plan, now, pace)
        parts.append(plan.result(prices, server))
    return {
        "to_compiler": to_compiler,
        "generated_at": time.time(),
        "currency": CURRENCY,
        "totals": totals(parts),
        "namespaces": parts,
        "prices": {"table": prices.label, "shipped_checked": prices.shipped_checked},
    }


def _read_entries(backends: Services, plan: NamespaceUpgrade, pace: Pace) -> None:
    index = backends.index
    after: str | None = None
    while True:
        page = index.entry_stats(plan.namespace, after, ENTRY_PAGE)
        if not page:
            # Only an empty page ends the listing (entries may go while it is read).
            return
        wanted = [stats.key for stats in page if plan.wants_program(stats)]
        programs = _programs(index, plan.namespace, after, page, wanted, pace)
        plan.add_entries(paced(page, pace), programs)
        after = page[-1].key


def _read_built(
    index: Index, namespace: str, to_compiler: str, pace: Pace
) -> tuple[set[bytes], bool]:
    """The graphs of the entries of ``namespace`` whose compiler version matches
    ``to_compiler``, and whether there were more than MAX_BUILT (not all kept). Only
    their manifests are read: before an upgrade starts there are none."""
    found: set[bytes] = set()
    after: str | None = None
    while True:
        page = index.entry_stats(namespace, after, ENTRY_PAGE)
        if not page:
            return found, False
        wanted = [s.key for s in page if version_matches(to_compiler, s.facts.compiler_version)]
        for program in _programs(index, namespace, after, page, wanted, pace).values():
            if program is not None:
                found.add(program)
        if len(found) >= MAX_BUILT:
            return found, True
        after = page[-1].key


def _programs(
    index: Index,
    namespace: str,
    after: str | None,
    page: Sequence[EntryStats],
    wanted: Sequence[str],
    pace: Pace,
) -> dict[str, bytes | None]:
    """The graphs (``program_of``) of the ``wanted`` keys of a page of entry stats,
    from their manifests: listed from where the page began, and the few the listing
    missed (published meanwhile ahead of them) read one by one. An entry gone since
    has no graph: it is counted as to rebuild."""
    if not wanted:
        return {}
    manifests = {e.key: e.manifest for e in index.list_entries(namespace, after, len(page))}
    for key in wanted:
        if key not in manifests:
            entry = index.get_entry(namespace, key)
            if entry is not None:
                manifests[key] = entry.manifest
    return {key: program_of(key, manifests.get(key)) for key in paced(wanted, pace)}


def _read_events(backends: Services, plan: NamespaceUpgrade, now: float, pace: Pace) -> None:
    after: str | None = None
    while True:
        page, after = backends.index.events(
            plan.active_since, now, [plan.namespace], after, EVENT_PAGE
        )
        plan.add_events(paced(page, pace))
        if after is None:
            return
