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

from neffcache.server.deps import Backends
from neffcache.server.reports.cost import CostReport
from neffcache.server.reports.pace import Pace, paced
from neffcache.server.reports.prices import CURRENCY, load_prices
from neffcache.server.reports.storage import storage_rows
from neffcache.server.reports.upgrade import DEFAULT_ACTIVE_SECONDS, NamespaceUpgrade, totals

EVENT_PAGE = 1000
ENTRY_PAGE = 1000


def build_cost_report(
    backends: Backends,
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


def _namespaces_held(backends: Backends) -> list[str]:
    """Every namespace with entries or a policy."""
    return [policy.namespace for policy in backends.policies.all()]


def build_upgrade_report(
    backends: Backends,
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
    for namespace in sorted(set(namespaces)):
        window = active_seconds
        if window is None:
            window = backends.policies.get(namespace).ttl_seconds or DEFAULT_ACTIVE_SECONDS
        plan = NamespaceUpgrade(namespace, to_compiler, now - window, top, from_compiler)
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


def _read_entries(backends: Backends, plan: NamespaceUpgrade, pace: Pace) -> None:
    after: str | None = None
    while True:
        page = backends.index.entry_stats(plan.namespace, after, ENTRY_PAGE)
        if not page:
            # Only an empty page ends the listing (entries may go while it is read).
            return
        plan.add_entries(paced(page, pace))
        after = page[-1].key


def _read_events(backends: Backends, plan: NamespaceUpgrade, now: float, pace: Pace) -> None:
    after: str | None = None
    while True:
        page, after = backends.index.events(
            plan.active_since, now, [plan.namespace], after, EVENT_PAGE
        )
        plan.add_events(paced(page, pace))
        if after is None:
            return
