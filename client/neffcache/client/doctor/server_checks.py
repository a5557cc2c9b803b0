"""Server: reachable, its version and auth mode, its clock, and a round trip."""

from __future__ import annotations

from typing import Any

from neffcache.client.doctor import words
from neffcache.client.doctor.context import Context
from neffcache.client.doctor.model import Check, Result, failed, passed, skipped, warned

# Past this (beyond the request's own uncertainty) a host's clock is worth fixing: the
# events it sends carry its time (reports place them by it), and TLS certificates are
# judged by it.
SKEW_WARN_SECONDS = 10.0


def reach(ctx: Context) -> Result:
    config = ctx.config().config
    status = ctx.server_status()
    if config is None or status is None:
        return skipped("no usable neffcache URL (see config.url)")
    where = words.url(config.server)
    ms = f"{status.seconds * 1000:.0f} ms"
    if status.state == "down":
        return failed(
            status.detail,
            f"check that `neffcache serve` runs at {where} and that this host reaches it "
            f"(host, port, firewall, security group); NEFFCACHE_CONNECT_TIMEOUT is "
            f"{config.connect_timeout:g} s",
        )
    if status.state == "error":
        return failed(
            f"{where} answered, but not as a neffcache server: {status.detail}",
            "the URL's host and port must be those of `neffcache serve`",
        )
    if status.state == "old":
        return warned(
            f"{where} is up, but has no /v1/status: a server older than this client, so "
            "its version, auth mode and clock are unknown",
            "upgrade the server to this client's release of neffcache",
        )
    if status.state != "ok":
        return passed(f"{where} answered in {ms}; it refused its status ({status.detail})")
    server: Any = status.body.get("server")
    server = server if isinstance(server, dict) else {}
    auth = {"tokens": "tokens required", "open": "open to loopback callers"}.get(
        str(server.get("auth")), f"auth {server.get('auth')}"
    )
    return passed(
        f"neffcache {server.get('version', '?')} at {where}, {auth}, answered in {ms}",
        version=server.get("version"),
        auth=server.get("auth"),
    )


def clock(ctx: Context) -> Result:
    status = ctx.server_status()
    if status is None or status.skew is None or status.uncertainty is None:
        return skipped("the server does not tell its time here")
    skew, within = status.skew, status.uncertainty
    data: dict[str, Any] = {"skew_seconds": round(skew, 3), "uncertainty_seconds": round(within, 3)}
    if abs(skew) - within > SKEW_WARN_SECONDS:
        ahead = "behind" if skew > 0 else "ahead of"
        return warned(
            f"this host's clock is {abs(skew):.1f} s {ahead} the server's",
            "sync the clock (chrony, with the Amazon Time Sync Service on EC2): the events a "
            "host sends carry its time, and TLS certificates are judged by it",
            **data,
        )
    return passed(f"within {abs(skew):.2f} s of the server's (±{within:.3f} s)", **data)


def round_trip(ctx: Context) -> Result:
    config = ctx.config().config
    trip = ctx.round_trip()
    if config is None or trip is None:
        return skipped("no server to try (see server.reach)")
    data: dict[str, Any] = {"read": trip.read, "write": trip.write, "timings": trip.timings}
    if trip.key:
        data["key"] = trip.key
    if trip.read != "ok":
        return failed(
            f"a lookup in {config.namespace} failed: {trip.detail}",
            "see config.token (401, 403) or server.reach",
            **data,
        )
    if trip.write == "ok":
        return passed(f"{trip.detail} in {config.namespace}", **data)
    if trip.write == "skipped":
        why = "--read-only" if ctx.read_only else "the token may not write"
        return passed(f"read only ({why}): {trip.detail}", **data)
    if trip.write == "read-only":
        return passed(f"lookups work; the token may not write ({trip.detail})", **data)
    if trip.write == "refused":
        return warned(
            f"namespace {config.namespace} refused the probe's entry: {trip.detail}",
            "a namespace that takes only trusted writers needs a trusted token; one over its "
            "quota needs room (an admin: neffcache admin namespace ...)",
            **data,
        )
    return failed(
        f"the round trip failed: {trip.detail}",
        "attach `neffcache doctor --report FILE` to an issue: the server answered what the "
        "protocol does not allow",
        **data,
    )


CHECKS = (
    Check("server.reach", "reachable", reach),
    Check("server.clock", "clock", clock),
    Check("server.round-trip", "round trip", round_trip),
)
