"""Compile leases: who compiles a missing graph, so a fleet that starts cold compiles it
once (the HTTP side, the long-poll, is api/leases.py; the protocol, docs/protocol.md).

One look (``look``) answers with the entry when it exists (``done``), the lease when
nobody holds it (``granted``), or the live lease (``held``, or ``failed``: a short
notice a failed compile leaves so that the waiters do not queue up to repeat it).
Each call blocks on the stores: from the event loop, call it in a worker thread.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from neffcache.protocol import AnswerState
from neffcache.server.errors import Conflict
from neffcache.server.index import Failure, Lease
from neffcache.server.lookup import find_name, stamped
from neffcache.server.manifest import HEX64
from neffcache.server.services import Services
from neffcache.server.settings import ServerSettings


@dataclass(frozen=True)
class Asking:
    """Who asks for a lease, and on what terms."""

    holder: str  # who asks (host and pid), for people
    since: float  # when the asker began to wait: older failure notices are not its business
    expected_seconds: float | None = None  # the asker's estimate of its compile
    dead_holder: str | None = None  # a holder the asker knows is dead (same host)
    take: bool = True  # False: only wait for a holder; never be granted the lease


@dataclass(frozen=True)
class Answer:
    state: AnswerState
    entry: str | None = None  # the entry's JSON (``stamped``), when done
    lease: Lease | None = None  # ours when granted, else the live one


def look(services: Services, namespace: str, name: str, asking: Asking) -> Answer:
    """One look: the entry if it exists, else the lease (ours if it was free)."""
    index = services.index
    found = _entry(services, namespace, name)
    if found is not None:
        return Answer("done", entry=found)
    now = time.time()
    # A read first: a lease that is held (the common answer while waiting) costs no
    # write transaction.
    live = index.get_lease(namespace, name, now)
    ttl = services.settings.lease_ttl_seconds
    replacing = None
    if live is not None and live.failed and live.expires_at - ttl < asking.since:
        replacing = live.lease_id  # failed before this asker began to wait
    elif live is not None and not live.failed and live.holder == asking.dead_holder:
        replacing = live.lease_id
    if (live is None or replacing is not None) and not asking.take:
        return Answer("free")
    if live is None or replacing is not None:
        lease_id, claim = secrets.token_hex(16), asking.expected_seconds
        mine = Lease(namespace, name, lease_id, asking.holder, now, now + ttl, claim)
        live = index.acquire_lease(mine, replacing)
        if live.lease_id == mine.lease_id:
            # The entry may have been published, and its lease released, between the
            # look at the entry and this grant: then there is nothing to compile.
            found = _entry(services, namespace, name)
            if found is not None:
                index.release_lease(namespace, name, mine.lease_id, None)
                return Answer("done", entry=found)
            return Answer("granted", lease=live)
    return Answer("failed" if live.failed else "held", lease=live)


def _entry(services: Services, namespace: str, name: str) -> str | None:
    """The entry a lease name stands for (its key, or an alias), as the API returns it;
    read through as a lookup is, so a graph another namespace holds is not compiled."""
    found = find_name(services, namespace, name)
    return None if found is None else stamped(found)


def holder_view(services: Services, namespace: str, name: str, answer: Answer) -> dict[str, Any]:
    """What a waiter is told of a lease held by another (``held``) or left by a failed
    compile (``failed``, with the failure's record when there is one)."""
    lease = answer.lease
    assert lease is not None
    now = time.time()
    settings = services.settings
    failures: list[Failure] = []
    if re.fullmatch(HEX64, name):
        failures = services.index.failures(namespace, name, now)
    fields: dict[str, Any] = {
        "state": answer.state,
        "holder": lease.holder,
        "held_for": round(max(0.0, now - lease.acquired_at), 3),
        "expires_in": round(max(0.0, lease.expires_at - now), 3),
        "expected_seconds": expected(lease.expected_seconds, history(failures), settings),
        "ttl": settings.lease_ttl_seconds,
    }
    if answer.state == "failed":
        # The record of this failure, never an older one: the holder reports it
        # after its compile, which began when it took the lease.
        mine = [f for f in failures if f.created_at >= lease.acquired_at]
        fields["failure"] = json.loads(mine[0].record) if mine else None
    return fields


def expected(claim: float | None, known: float | None, settings: ServerSettings) -> float | None:
    """The compile time told to waiters. The holder's claim is any write token's word
    (a squatter claims a month and renews): it is believed no further than twice what
    this graph's own history says, when there is one, nor past the server's maximum.
    The waiter bounds it again by its own setting (client/lease.py)."""
    told = known if claim is None else claim if known is None else min(claim, 2 * known)
    return None if told is None else min(told, settings.lease_expected_max_seconds)


def history(failures: list[Failure]) -> float | None:
    """How long this graph's compile took before, from its recent failure records."""
    for failure in failures:
        try:
            seconds = json.loads(failure.record).get("compile_seconds")
        except ValueError:
            continue
        if isinstance(seconds, (int, float)) and seconds >= 0:
            return float(seconds)
    return None


def renew(services: Services, namespace: str, name: str, lease_id: str) -> None:
    """Extend a held lease by one TTL; Conflict when it no longer holds the name."""
    until = time.time() + services.settings.lease_ttl_seconds
    if not services.index.renew_lease(namespace, name, lease_id, until):
        raise Conflict(f"lease {lease_id} no longer holds {name}: it expired or was released")


def release(services: Services, namespace: str, name: str, lease_id: str, failed: bool) -> None:
    """End a lease; Conflict when it does not hold the name. A failed compile leaves
    its notice for one lease lifetime: long enough for every waiter to hear of it
    (the caller wakes them, on the event loop: ``Wakeups``), short enough that a retry
    soon after a transient failure is not refused."""
    ttl = services.settings.lease_ttl_seconds
    until = time.time() + ttl if failed else None
    if not services.index.release_lease(namespace, name, lease_id, until):
        raise Conflict(f"lease {lease_id} does not hold {name}")
