"""``neffcache admin namespace|pin|unpin|pins|expire|evict|audit``: the admin API from a
shell. Each command is one request; output is for people (``--json`` for scripts).

Durations are ``90s``, ``15m``, ``12h``, ``30d`` (or plain seconds), sizes ``500M``,
``2G``, ``1.5T`` (powers of 1024; ``MiB`` style and plain bytes too); ``none`` lifts a
limit.
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

from . import clihost
from .admintext import audit_text, out, pin_text, pins_text, table, when
from .units import human_bytes, human_seconds

# Seconds a pass or an expiry may take on the server before the CLI stops waiting.
_LONG = 3600.0
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_PIN_KINDS = (
    ("key", "an entry's canonical key"),
    ("address", "a Neuron address neuronxcc-<ver>/MODULE_<hash>+<flags8>, or a direct key"),
    ("model", "every entry published with this model label"),
    ("compiler-version", "every entry of a compiler version, or a pattern such as 2.21.*"),
)


def duration(text: str) -> float | None:
    """Seconds from ``30d`` / ``12h`` / ``3600``; None for ``none``."""
    if text.strip().lower() in ("none", "never"):
        return None
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*", text.lower())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 12h, 30d")
    return float(found[1]) * _UNITS[found[2] or "s"]


def size(text: str) -> int | None:
    """Bytes from ``500M`` / ``2G`` / ``1.5TiB`` / ``1048576``; None for ``none``."""
    if text.strip().lower() == "none":
        return None
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(?:i?b)?\s*", text.lower())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 500M, 2G, 1.5T")
    return int(float(found[1]) * _SIZES[found[2]])


def optional_count(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of 1 or more, or none")
    return int(text)


def since(text: str) -> float:
    """Epoch seconds from a duration back from now (``7d``, a unit required) or an ISO
    date or time (``2026-11-01``, ``2026-11-01T12:00Z``; UTC unless it says)."""
    if re.fullmatch(r"\s*[0-9]+(?:\.[0-9]+)?\s*[smhdw]\s*", text.lower()):
        back = duration(text)
        assert back is not None
        return time.time() - back
    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (7d, 12h) nor a date (2026-11-01)"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _one_line(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Bad input is one line on stderr and exit code 2, as every neffcache command
    reports it, not argparse's usage block (the host CLI's own ``one_line``)."""
    made: argparse.ArgumentParser = clihost.host.one_line(parser)
    return made


def register(admin_sub: Any) -> None:
    ns = _one_line(
        admin_sub.add_parser(
            "namespace",
            help="create, show, change or list namespaces",
            description="A namespace's policy: TTL, quota, largest entry, compiler versions "
            "kept, failure TTL, read-through, trusted writers, ranking. A namespace without "
            "one has the server's defaults.",
        )
    )
    ns_sub = ns.add_subparsers(dest="namespace_command", metavar="ACTION", required=True)
    for action, helptext, description in (
        (
            "create",
            "create a namespace with a policy (unset settings take the defaults)",
            "Create a namespace with a policy; a setting not given takes the server's "
            "default, and follows it when the default changes.",
        ),
        (
            "set",
            "change settings of a namespace",
            "Change the named settings of a namespace created before; the others stay.",
        ),
    ):
        parser = _one_line(ns_sub.add_parser(action, help=helptext, description=description))
        parser.add_argument("namespace")
        _policy_arguments(parser)
        _target(parser)
        parser.set_defaults(run=run_namespace_write, action=action)
    show = _one_line(
        ns_sub.add_parser(
            "show",
            help="a namespace's policy, usage and pins",
            description="Print a namespace's effective policy, what it holds (entries, "
            "bytes, share of its quota, compile-hours) and its pins.",
        )
    )
    show.add_argument("namespace")
    _target(show)
    show.set_defaults(run=run_namespace_show)
    listing = _one_line(
        ns_sub.add_parser(
            "list",
            help="every namespace you administer, with usage",
            description="A table of every namespace with a policy or an entry that the "
            "token administers: entries, bytes, quota, TTL, who may write.",
        )
    )
    _target(listing)
    listing.set_defaults(run=run_namespace_list)

    for action, helptext, description in (
        (
            "pin",
            "never evict an entry or a group",
            "Pin an entry (by key or Neuron address) or a group (by model label or "
            "compiler version): no expiry, retention or quota removes it. Labels are the "
            "publisher's, so a label pin protects only entries of trusted tokens. Prints how "
            "many entries the pin protects now, and why it does not protect others it "
            "matches; a key or address no entry has yet is pinned for when one is published.",
        ),
        ("unpin", "undo a pin", "Remove a pin given as it was made; audited with --reason."),
    ):
        parser = _one_line(admin_sub.add_parser(action, help=helptext, description=description))
        parser.add_argument("namespace")
        group = parser.add_mutually_exclusive_group(required=True)
        for kind, kind_help in _PIN_KINDS:
            group.add_argument(f"--{kind}", dest="pin", type=_pin(kind), help=kind_help)
        parser.add_argument("--reason", default="", help="why, for the audit log")
        _target(parser)
        parser.set_defaults(run=run_pin, action=action)
    pins = _one_line(
        admin_sub.add_parser(
            "pins",
            help="list a namespace's pins",
            description="A table of a namespace's pins: kind, value, how many entries each "
            "protects now, since when, by whom, why; then, per pin, what it does not cover "
            "(entries of untrusted writers, a key no entry has).",
        )
    )
    pins.add_argument("namespace")
    _target(pins)
    pins.set_defaults(run=run_pins)

    expire = _one_line(
        admin_sub.add_parser(
            "expire",
            help="retire a compiler generation: remove its unpinned entries",
            description="Remove every unpinned entry built by a compiler version (or a "
            "pattern such as 2.20.*) in the namespaces the token administers, or those "
            "named with --namespace.",
        )
    )
    expire.add_argument(
        "--compiler-version", required=True, metavar="SPEC", help="a version, or a pattern: 2.20.*"
    )
    expire.add_argument("--namespace", action="append", help="only this one (repeat for more)")
    expire.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    _target(expire)
    expire.set_defaults(run=run_expire)

    evict = _one_line(
        admin_sub.add_parser(
            "evict",
            help="apply expiry, retention and quotas now (--dry-run: only list)",
            description="Run an eviction pass now (an admin token for '*'; a replica that "
            "is not the evictor answers 409 naming it), or with --dry-run list what the "
            "rules would remove, with the bytes and compile-hours at stake.",
        )
    )
    evict.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    evict.add_argument("--namespace", action="append", help="with --dry-run: only this one")
    _target(evict)
    evict.set_defaults(run=run_evict)

    audit = _one_line(
        admin_sub.add_parser(
            "audit",
            help="who evicted, expired, pinned or changed what",
            description="Print the audit log, newest first: evictions, expiries, pins, "
            "namespace and token changes, each with when, who, what and why.",
        )
    )
    audit.add_argument("--since", type=since, default=0.0, help="7d, 12h, or a date: 2026-11-01")
    audit.add_argument("--namespace", help="only this namespace")
    audit.add_argument("--limit", type=int, default=200, help="at most this many (default 200)")
    _target(audit)
    audit.set_defaults(run=run_audit)


def _target(parser: argparse.ArgumentParser) -> None:
    clihost.target_arguments(parser, local=False)
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer")


def _pin(kind: str) -> Any:
    def parse(value: str) -> tuple[str, str]:
        return kind, value

    return parse


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ttl",
        type=duration,
        default=argparse.SUPPRESS,
        help="unused this long: expired (30d; none)",
    )
    parser.add_argument(
        "--quota", type=size, default=argparse.SUPPRESS, help="bytes kept at most (500G; none)"
    )
    parser.add_argument(
        "--max-entry",
        type=size,
        default=argparse.SUPPRESS,
        help="largest entry accepted (2G; none)",
    )
    parser.add_argument(
        "--keep-compiler-versions",
        type=optional_count,
        default=argparse.SUPPRESS,
        help="compiler versions retained, most recently used first (2; none)",
    )
    parser.add_argument(
        "--failure-ttl",
        type=duration,
        default=argparse.SUPPRESS,
        help="how long a failed compile is remembered (1h)",
    )
    parser.add_argument(
        "--read-through",
        default=argparse.SUPPRESS,
        help="namespaces read after this one, in order, comma-separated ('' for none)",
    )
    trust = parser.add_mutually_exclusive_group()
    trust.add_argument(
        "--trusted-writers-only",
        dest="trusted_writers_only",
        action="store_const",
        const=True,
        default=argparse.SUPPRESS,
        help="only trusted tokens may publish",
    )
    trust.add_argument(
        "--any-writer",
        dest="trusted_writers_only",
        action="store_const",
        const=False,
        default=argparse.SUPPRESS,
        help="any write token may publish",
    )
    parser.add_argument(
        "--ranking",
        choices=("value", "lru"),
        default=argparse.SUPPRESS,
        help="what a quota evicts first (value)",
    )


_FIELDS = {
    "ttl": "ttl_seconds",
    "quota": "quota_bytes",
    "max_entry": "max_entry_bytes",
    "keep_compiler_versions": "compiler_versions",
    "failure_ttl": "failure_ttl_seconds",
    "read_through": "read_through",
    "trusted_writers_only": "trusted_writers_only",
    "ranking": "ranking",
}


def run_namespace_write(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    body: dict[str, Any] = {}
    for option, name in _FIELDS.items():
        if hasattr(args, option):
            body[name] = getattr(args, option)
    if "read_through" in body:
        body["read_through"] = [n.strip() for n in body["read_through"].split(",") if n.strip()]
    if "failure_ttl_seconds" in body and body["failure_ttl_seconds"] is None:
        raise clihost.CommandError("--failure-ttl needs a duration; failure records always expire")
    if args.action == "set" and not body:
        raise clihost.CommandError("name at least one setting to change (see --help)")
    method = "POST" if args.action == "create" else "PATCH"
    answer = clihost.request(args, method, f"/v1/admin/namespaces/{args.namespace}", body)
    return out(args, answer, _policy_text)


def run_namespace_show(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    answer = clihost.request(args, "GET", f"/v1/admin/namespaces/{args.namespace}")
    return out(args, answer, _policy_text)


def run_namespace_list(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    answer = clihost.request(args, "GET", "/v1/admin/namespaces")

    def text(value: dict[str, Any]) -> str:
        rows = [("NAMESPACE", "ENTRIES", "BYTES", "QUOTA", "TTL", "WRITERS")]
        for ns in value["namespaces"]:
            rows.append(
                (
                    ns["namespace"],
                    str(ns["usage"]["entries"]),
                    human_bytes(ns["usage"]["bytes"]),
                    human_bytes(ns["quota_bytes"]),
                    human_seconds(ns["ttl_seconds"]),
                    "trusted" if ns["trusted_writers_only"] else "any",
                )
            )
        return table(rows)

    return out(args, answer, text)


def run_pin(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    kind, value = args.pin
    path = f"/v1/admin/namespaces/{args.namespace}/pins"
    if args.action == "pin":
        answer = clihost.request(
            args, "PUT", path, {"kind": kind, "value": value, "reason": args.reason}
        )
        return out(args, answer, lambda a: pin_text(a, args.namespace))
    query = urlencode({"kind": kind, "value": value, "reason": args.reason}, quote_via=quote)
    clihost.request(args, "DELETE", f"{path}?{query}")
    return out(
        args,
        {"unpinned": {"kind": kind, "value": value}},
        lambda a: f"unpinned {kind} {value} in {args.namespace}",
    )


def run_pins(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    answer = clihost.request(args, "GET", f"/v1/admin/namespaces/{args.namespace}/pins")
    return out(args, answer, lambda a: pins_text(a, args.namespace))


def run_expire(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    body: dict[str, Any] = {"compiler_version": args.compiler_version, "dry_run": args.dry_run}
    if args.namespace:
        body["namespaces"] = args.namespace
    # A whole generation may take a while to remove: a long wait, not a retry.
    answer = clihost.request(args, "POST", "/v1/admin/expire", body, timeout=_LONG)
    verb = "would remove" if args.dry_run else "removed"
    return out(args, answer, lambda a: _victims_text(a, verb))


def run_evict(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    body: dict[str, Any] = {"dry_run": args.dry_run}
    if args.namespace:
        if not args.dry_run:
            raise clihost.CommandError(
                "--namespace goes with --dry-run: a pass covers every namespace"
            )
        body["namespaces"] = args.namespace
    answer = clihost.request(args, "POST", "/v1/admin/evict", body, timeout=_LONG)

    def text(value: dict[str, Any]) -> str:
        if value["dry_run"]:
            return _victims_text(value, "would remove")
        lines = [_victims_text(value["removed"], "removed")]
        freed = human_bytes(value["blob_bytes_collected"])
        lines.append(
            f"blobs collected: {value['blobs_collected']} ({freed}); "
            f"{value['blobs_in_grace']} unreferenced blobs wait out their grace period"
        )
        return "\n".join(lines)

    return out(args, answer, text)


def run_audit(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    query: dict[str, Any] = {"since": args.since, "limit": args.limit}
    if args.namespace:
        query["namespace"] = args.namespace
    answer = clihost.request(args, "GET", f"/v1/admin/audit?{urlencode(query)}")
    return out(args, answer, audit_text)


# --- output


def _policy_text(p: dict[str, Any]) -> str:
    created = "" if p["created"] else "  (not created: defaults)"
    writers = "trusted tokens only" if p["trusted_writers_only"] else "any write token"
    lines = [
        f"namespace            {p['namespace']}{created}",
        f"ttl                  {human_seconds(p['ttl_seconds'])} since last use",
        f"quota                {human_bytes(p['quota_bytes'])}",
        f"max entry            {human_bytes(p['max_entry_bytes'])}",
        f"compiler versions    {p['compiler_versions'] or 'all'} kept",
        f"failure ttl          {human_seconds(p['failure_ttl_seconds'])}",
        f"read through         {', '.join(p['read_through']) or '-'}",
        f"writers              {writers}",
        f"ranking              {p['ranking']}",
    ]
    usage = p.get("usage")
    if usage is not None:
        share = usage["quota_share"]
        used = f" ({share:.0%} of quota)" if share is not None else ""
        held = f"{usage['entries']} entries, {human_bytes(usage['bytes'])}{used}"
        lines.append(f"holds                {held}, {usage['compile_hours']:.2f} compile-hours")
    for pin in p.get("pins", []):
        lines.append(
            f"pinned               {pin['kind']} {pin['value']}  ({pin['reason'] or 'no reason'})"
        )
    return "\n".join(lines)


def _victims_text(value: dict[str, Any], verb: str) -> str:
    total = value["total"]
    rows = [("NAMESPACE", "KEY", "BYTES", "COMPILE", "LAST USED", "WHY")]
    for v in value["entries"]:
        seconds = v["compile_seconds"]
        rows.append(
            (
                v["namespace"],
                v["key"][:16],
                human_bytes(v["bytes"]),
                "?" if seconds is None else human_seconds(seconds),
                when(v["last_access"]),
                v["why"],
            )
        )
    unknown = total["unknown_compile_time"]
    summary = (
        f"{verb} {total['entries']} entries, {human_bytes(total['bytes'])}, "
        f"worth {human_seconds(total['compile_hours'] * 3600)} of compile time "
        f"({total['compile_hours']:.2f} compile-hours)"
        + (f" ({unknown} without a known compile time)" if unknown else "")
    )
    if value.get("skipped"):
        summary += f"; {value['skipped']} kept (pinned or changed meanwhile)"
    return (table(rows) + "\n" if value["entries"] else "") + summary
