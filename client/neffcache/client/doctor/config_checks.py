"""Configuration: the URL and where it came from, the usual mistakes, the token and
the namespace as the server sees them."""

from __future__ import annotations

from typing import Any

from neffcache.client._typos import findings
from neffcache.client.config import location, overridden, sdk_urls
from neffcache.client.doctor import words
from neffcache.client.doctor.context import Context
from neffcache.client.doctor.model import Check, Result, failed, passed, skipped, warned

_LATER = (
    "; a launcher or script that sets it later (NxD Training's compiler_cache_url, "
    "os.environ in the script) is followed by the hook: run the doctor with the "
    "URL the job gets"
)


def url(ctx: Context) -> Result:
    found = ctx.config()
    where = found.source or "the environment"
    if found.error is not None:
        return failed(
            f"the client cannot use its settings (the URL is {words.url(found.url)}, from {where})",
            found.error,
        )
    if found.config is None:
        if found.url:
            return failed(
                f"the cache URL in force is {words.url(found.url)} (from {where}), no "
                "neffcache URL: the stock Neuron cache is used and neffcache is off",
                f"{words.SET_URL} (it overrides the SDK's settings)",
            )
        return failed(
            "no cache URL is set (NEFFCACHE_URL, NEURON_COMPILE_CACHE_URL, --cache_dir in "
            "NEURON_CC_FLAGS): neffcache is off",
            words.SET_URL + _LATER,
        )
    config = found.config
    if found.disabled:
        return failed("NEFFCACHE_DISABLE is set: neffcache does nothing", "unset NEFFCACHE_DISABLE")
    return passed(
        f"{words.url(config.url)} from {where}: server {words.url(config.server)}, "
        f"namespace {config.namespace}",
        details=_sdk_settings(ctx),
        source=found.source,
        server=config.server,
        namespace=config.namespace,
        local_dir=config.local_dir,
        connect_timeout=config.connect_timeout,
        timeout=config.timeout,
    )


def _sdk_settings(ctx: Context) -> list[str]:
    """The SDK's own cache settings, and whether NEFFCACHE_URL takes each over."""
    env = ctx.environ
    lines = []
    for sdk in sdk_urls(env):
        taken = "taken over by NEFFCACHE_URL" if overridden(sdk, env) else "left as it is"
        lines.append(f"the SDK's cache location {words.url(location(sdk))}: {taken}")
    return lines


def typos(ctx: Context) -> Result:
    found = findings(ctx.environ)
    if not found:
        return passed("no misspelled variable or URL found")
    usable = ctx.config().config is not None and ctx.config().error is None
    lines = [f"{f.found}; fix: {f.fix}" for f in found] if len(found) > 1 else []
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    evidence = found[0].found + more
    data: dict[str, Any] = {"findings": [f._asdict() for f in found]}
    if usable:  # another setting wins: these only mislead
        return warned(evidence, found[0].fix, details=lines, **data)
    return failed(evidence, found[0].fix, details=lines, **data)


def token(ctx: Context) -> Result:
    config = ctx.config().config
    status = ctx.server_status()
    if config is None or status is None:
        return skipped("no usable neffcache URL")
    if status.state == "down":
        return skipped("the server does not answer (see server.reach)")
    ns = config.namespace
    create = f"neffcache admin token create --scope write --namespace {ns}"
    if status.state == "unauthorized":
        return _unauthorized(bool(config.token), status.detail, create)
    if status.state == "ok":
        return _caller(status.body, ns, bool(config.token), create)
    trip = ctx.round_trip()
    if trip is None:
        return skipped("the server could not be asked")
    if trip.read == "unauthorized":
        return _unauthorized(bool(config.token), trip.detail, create)
    if trip.read == "forbidden" or status.state == "forbidden":
        return failed(
            f"the token does not cover namespace {ns} ({trip.detail or status.detail})",
            f"use a token for {ns} (an admin makes one: {create}), or the URL of a "
            "namespace the token covers",
        )
    if trip.read != "ok":
        return skipped(f"the server could not tell ({trip.detail})")
    if trip.write == "read-only":
        return _read_only(ns)
    how = "it may read and write" if trip.write in ("ok", "refused") else "it may read"
    return passed(
        f"{how} {ns}, as the round trip showed (this server tells no scopes)",
        token_set=bool(config.token),
    )


def _unauthorized(has_token: bool, detail: str, create: str) -> Result:
    if has_token:
        return failed(
            f"the server refused NEFFCACHE_TOKEN ({detail}): unknown or revoked",
            f"set NEFFCACHE_TOKEN to a live token (an admin makes one: {create})",
        )
    return failed(
        f"the server requires a token and NEFFCACHE_TOKEN is not set ({detail})",
        f"set NEFFCACHE_TOKEN (an admin makes one: {create})",
    )


def _read_only(ns: str) -> Result:
    return warned(
        f"the token is read-only on {ns}: this host fetches, but never publishes what it "
        "compiles and takes no compile leases",
        f"a write token for {ns}, if this host's compiles should reach the fleet",
        scope="read",
    )


def _caller(body: dict[str, Any], ns: str, has_token: bool, create: str) -> Result:
    server, caller = _object(body.get("server")), _object(body.get("caller"))
    scope = str(caller.get("scope", "?"))
    spaces = [str(n) for n in caller.get("namespaces") or []]
    name = str(caller.get("name") or "anonymous")
    data: dict[str, Any] = {
        "name": name,
        "scope": scope,
        "namespaces": spaces,
        "trusted": caller.get("trusted"),
    }
    if ns not in spaces and "*" not in spaces:
        return failed(
            f"the token {name} ({scope}) covers {words.listed(spaces)}, not {ns}",
            f"use a token for {ns} (an admin makes one: {create}), or the URL of a "
            "namespace the token covers",
            **data,
        )
    if scope == "read":
        return _read_only(ns)
    if server.get("auth") == "open" and not has_token:
        return passed("the server is open to loopback callers: no token needed", **data)
    trusted = ", trusted" if caller.get("trusted") else ""
    return passed(f"token {name}: {scope} on {words.listed(spaces)}{trusted}", **data)


def namespace(ctx: Context) -> Result:
    config = ctx.config().config
    status = ctx.server_status()
    if config is None or status is None or status.state != "ok":
        why = status.detail if status is not None and status.state != "ok" else "no server"
        return skipped(f"the server does not describe namespaces here ({why})")
    found = status.body.get("namespace")
    if not isinstance(found, dict):
        why = status.detail or "it describes none"
        return skipped(f"the server does not describe the namespace ({why}; see config.token)")
    name = str(found.get("name") or config.namespace)
    if not found.get("exists"):
        return warned(
            f"namespace {name} does not exist yet (no entry, no policy)",
            "check its spelling in the URL: a namespace is made by its first publish, or "
            f"by an admin (neffcache admin namespace create {name})",
            namespace=found,
        )
    return _described(name, found, status.body.get("caller"))


def _described(name: str, found: dict[str, Any], caller: Any) -> Result:
    policy = _object(found.get("policy"))
    details = [f"policy {key}: {value}" for key, value in sorted(policy.items())]
    quota = found.get("quota_bytes")
    held = f"{found.get('entries', '?')} entries, {words.size(float(found.get('bytes') or 0))}"
    if isinstance(quota, int):
        held += f" of a {words.size(quota)} quota"
    lookups = _object(found.get("lookups"))
    hits, misses = lookups.get("hits"), lookups.get("misses")
    if isinstance(hits, int) and isinstance(misses, int) and hits + misses:
        window = found.get("window_seconds")
        span = (
            f" in the last {float(window) / 3600:.0f} h" if isinstance(window, int | float) else ""
        )
        held += f"; lookups{span}: {hits} hits, {misses} misses"
    trusted = bool(isinstance(caller, dict) and caller.get("trusted"))
    if policy.get("trusted_writers_only") and not trusted:
        return warned(
            f"namespace {name} takes only trusted writers and this token is not one: its "
            f"publishes are refused ({held})",
            "a trusted token (neffcache admin token create --trusted ...), if this host "
            "should publish",
            details=details,
            namespace=found,
        )
    return passed(f"namespace {name}: {held}", details=details, namespace=found)


def _object(value: Any) -> dict[str, Any]:
    """``value`` when the server sent a JSON object there, else an empty one: a server
    of another version may send less, or other shapes."""
    return value if isinstance(value, dict) else {}


CHECKS = (
    Check("config.url", "cache URL", url),
    Check("config.typos", "usual mistakes", typos),
    Check("config.token", "token", token),
    Check("config.namespace", "namespace", namespace),
)
