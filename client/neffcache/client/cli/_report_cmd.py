"""``neffcache report`` and ``neffcache report upgrade``: the server's cost report and
upgrade plan (``GET /v1/reports/cost``, ``GET /v1/reports/upgrade``; docs/reports.md).

The server computes and renders the report; this command asks for it and prints it
(or writes it with ``-o``). The server and token come from the environment a training
job uses (``NEFFCACHE_URL``, ``NEFFCACHE_TOKEN``), or from ``--server`` and ``--token``.
Without ``--namespace`` the report covers every namespace the token reads. Exit 0 on a
report, 1 when the server cannot be reached or fails, 2 on bad input (also when the
server refuses it: a bad option, or a token that does not cover a namespace).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from neffcache.protocol import is_namespace

from . import _server
from ._common import CommandError, ServerUnavailable, help_text, one_line

FORMATS = ("table", "csv", "json", "html")
GROUPINGS = ("namespace", "model", "day", "job")
MAX_TOP = 1000
# A report over months of events on a large server takes a while; the server answers
# when it is done, so the wait is long and only a silent server times out.
CONNECT_TIMEOUT = 5.0
REPORT_TIMEOUT = 600.0
# A report is aggregates, bounded by the server (a few MiB as an HTML page); a larger
# answer is not a report, and reading it whole would only fill this process.
REPORT_LIMIT = 64 << 20
_DURATION = re.compile(r"\s*[0-9]+(?:\.[0-9]+)?\s*[smhdw]\s*")
_NUMBER = re.compile(r"\s*[0-9]+(?:\.[0-9]+)?\s*")


def register(sub: Any) -> None:
    parser = one_line(
        sub.add_parser(
            "report",
            help="what compiles cost and hits saved, from the server's telemetry",
            usage="neffcache report [--since 7d] [--until WHEN] [--by namespace,model,day,job] "
            "[--namespace NS ...] [--top N] [--format table|csv|json|html] [-o FILE] "
            "[--server URL] [--token TOKEN]\n"
            "       neffcache report upgrade --to-compiler V [--namespace NS ...] "
            "[--format ...] [-o FILE] [--server URL] [--token TOKEN]",
            description=help_text(__doc__),
        )
    )
    parser.add_argument("--since", default="7d", help="7d, 12h, epoch seconds or 2026-11-01")
    parser.add_argument("--until", default="now", help="as --since (default now)")
    parser.add_argument("--by", default="namespace", help="namespace,model,day,job")
    parser.add_argument("--top", default=None, help="most expensive misses listed (10)")
    _common_options(parser, argparse.SUPPRESS, plain=True)
    parser.set_defaults(run=run)
    actions = parser.add_subparsers(
        dest="report_action", metavar="[upgrade]", prog="neffcache report"
    )
    upgrade = one_line(
        actions.add_parser(
            "upgrade",
            help="what a compiler upgrade will recompile, per namespace, and a prewarm plan",
            description="Lists, per namespace, the graphs in use that a compiler upgrade "
            "will miss, the compile-hours and money to rebuild them, and a prewarm plan "
            "(docs/reports.md).",
            usage="neffcache report upgrade --to-compiler V [--from-compiler V] [--active 30d] "
            "[--namespace NS ...] [--top N] [--format ...] [-o FILE] [--server URL] "
            "[--token TOKEN]",
        )
    )
    upgrade.add_argument("--to-compiler", metavar="V", help="the neuronx-cc version to come")
    upgrade.add_argument("--from-compiler", metavar="V", help="default: the one in use")
    upgrade.add_argument("--active", metavar="DURATION", help="in use if served within (30d)")
    upgrade.add_argument("--top", default=argparse.SUPPRESS, help="graphs listed per plan (20)")
    # SUPPRESS: an option given before "upgrade" is kept unless given again after it.
    _common_options(upgrade, argparse.SUPPRESS, plain=False)
    upgrade.set_defaults(run=run)


def _common_options(parser: argparse.ArgumentParser, default: Any, *, plain: bool) -> None:
    parser.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        default=[] if plain else default,
        help="repeat for several (default: every namespace your token reads)",
    )
    parser.add_argument(
        "--format", dest="fmt", default="table" if plain else default, help=", ".join(FORMATS)
    )
    parser.add_argument(
        "-o",
        "--output",
        default=None if plain else default,
        metavar="FILE",
        help="write the report to FILE instead of stdout",
    )
    # The report's --namespace is a filter, not the URL's: the server's part only.
    _server.add_options(parser, namespace=False, default=None if plain else default)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise CommandError(f"unexpected arguments: {' '.join(extra)}")
    fmt = _choice(args.fmt, FORMATS, "--format")
    report, query = _upgrade(args) if args.report_action == "upgrade" else _cost(args)
    query["format"] = fmt
    for namespace in args.namespaces:
        if not is_namespace(namespace):
            raise CommandError(f"--namespace {namespace!r} is not a namespace name")
    query["namespace"] = args.namespaces
    target = _server.resolve(args, namespace=False)
    body = _get(target.server, report, query, target.token)
    if fmt == "json":
        body = (json.dumps(_json(body, target.server), indent=2) + "\n").encode()
    if args.output:
        _write(Path(args.output), body)
        print(f"neffcache report: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(body.decode("utf-8", errors="replace"))
        sys.stdout.flush()
    return 0


def _cost(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    by = [part.strip() for part in args.by.split(",") if part.strip()]
    if not by or any(name not in GROUPINGS for name in by):
        raise CommandError(f"--by {args.by!r}: give one or more of {','.join(GROUPINGS)}")
    query: dict[str, Any] = {
        "since": _when(args.since, "--since"),
        "until": _when(args.until, "--until"),
        "by": ",".join(dict.fromkeys(by)),
        "top": _count(args.top, 10, "--top"),
    }
    return "cost", query


def _upgrade(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if not args.to_compiler:
        raise CommandError("--to-compiler V is required (the neuronx-cc version to come)")
    query: dict[str, Any] = {
        "to_compiler": args.to_compiler,
        "top": _count(args.top, 20, "--top"),
    }
    if args.from_compiler:
        query["from_compiler"] = args.from_compiler
    if args.active is not None:
        if not _DURATION.fullmatch(args.active):
            raise CommandError(f"--active {args.active!r} is not a duration such as 30d")
        query["active"] = args.active
    return "upgrade", query


def _choice(value: str, choices: tuple[str, ...], option: str) -> str:
    if value not in choices:
        raise CommandError(f"{option} {value!r}: give one of {', '.join(choices)}")
    return value


def _count(raw: str | None, default: int, option: str) -> int:
    if raw is None:
        return default
    # Not str.isdigit: it takes "²", which int() refuses.
    if not re.fullmatch(r"[0-9]{1,7}", raw) or int(raw) > MAX_TOP:
        raise CommandError(f"{option} {raw!r}: give a whole number from 0 to {MAX_TOP}")
    return int(raw)


def _when(text: str, option: str) -> str:
    """The time as given (the server reads it on its own clock), once known to parse."""
    lowered = text.strip().lower()
    if lowered == "now" or _DURATION.fullmatch(lowered):
        return text.strip()
    if _NUMBER.fullmatch(lowered) and math.isfinite(float(lowered)):
        return text.strip()
    try:
        datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(
            f"{option} {text!r} is neither a duration (7d, 12h), epoch seconds, "
            "nor a date (2026-11-01)"
        ) from None
    return text.strip()


def _get(server: str, report: str, query: dict[str, Any], token: str | None) -> bytes:
    from neffcache.client.api import report_path

    return _server.ask(
        server,
        "",
        token,
        lambda api: api.get(report_path(report, query), limit=REPORT_LIMIT),
        connect_timeout=CONNECT_TIMEOUT,
        timeout=REPORT_TIMEOUT,
    ).body


def _json(body: bytes, server: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise ServerUnavailable(f"{server} answered with something other than JSON") from None


def _write(path: Path, body: bytes) -> None:
    try:
        path.write_bytes(body)
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
