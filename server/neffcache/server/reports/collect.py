"""Reading the stores for the reports, a page at a time, every store call through
``Backends.run`` (inline for local stores, in a worker thread for remote ones). The
event loop is given back between pages, so a long report does not hold up lookups."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from neffcache.server.deps import Backends
from neffcache.server.reports.cost import CostReport
from neffcache.server.reports.prices import CURRENCY, load_prices
from neffcache.server.reports.storage import storage_rows
from neffcache.server.reports.upgrade import DEFAULT_ACTIVE_SECONDS, NamespaceUpgrade, totals

EVENT_PAGE = 1000
ENTRY_PAGE = 1000


async def cost_report(
    backends: Backends,
    since: float,
    until: float,
    by: Sequence[str],
    namespaces: Sequence[str] | None,
    top: int,
) -> dict[str, Any]:
    """The cost report of ``namespaces`` (None: every namespace)."""
    report = CostReport(since, until, by, load_prices(backends.settings.price_table), top)
    after: str | None = None
    while True:
        page, after = await backends.run(
            backends.index.events, since, until, namespaces, after, EVENT_PAGE
        )
        report.add_all(page)
        if after is None:
            break
        await asyncio.sleep(0)
    if namespaces is None:
        held = await backends.run(_namespaces_held, backends)
        names: Sequence[str] = sorted(set(held) | report.namespaces)
    else:
        names = namespaces
    storage = await backends.run(storage_rows, backends.usage, backends.policies, names)
    return report.result(storage, generated_at=time.time())


def _namespaces_held(backends: Backends) -> list[str]:
    """Every namespace with entries or a policy."""
    return [policy.namespace for policy in backends.policies.all()]


async def upgrade_report(
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
        namespaces = await backends.run(backends.index.namespaces)
    now = time.time()
    parts = []
    for namespace in sorted(set(namespaces)):
        window = active_seconds
        if window is None:
            policy = await backends.run(backends.policies.get, namespace)
            window = policy.ttl_seconds or DEFAULT_ACTIVE_SECONDS
        plan = NamespaceUpgrade(namespace, to_compiler, now - window, top, from_compiler)
        await _read_entries(backends, plan)
        await _read_events(backends, plan, now)
        parts.append(plan.result(prices, server))
    return {
        "to_compiler": to_compiler,
        "generated_at": time.time(),
        "currency": CURRENCY,
        "totals": totals(parts),
        "namespaces": parts,
        "prices": {"table": prices.label, "shipped_checked": prices.shipped_checked},
    }


async def _read_entries(backends: Backends, plan: NamespaceUpgrade) -> None:
    after: str | None = None
    while True:
        page = await backends.run(backends.index.entry_stats, plan.namespace, after, ENTRY_PAGE)
        if not page:
            # Only an empty page ends the listing (entries may go while it is read).
            return
        plan.add_entries(page)
        after = page[-1].key
        await asyncio.sleep(0)


async def _read_events(backends: Backends, plan: NamespaceUpgrade, now: float) -> None:
    after: str | None = None
    while True:
        page, after = await backends.run(
            backends.index.events, plan.active_since, now, [plan.namespace], after, EVENT_PAGE
        )
        plan.add_events(page)
        if after is None:
            return
        await asyncio.sleep(0)
