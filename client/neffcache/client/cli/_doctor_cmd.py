"""``neffcache doctor [--json] [--report FILE] [--only GROUP] [--read-only] [--live]``

Checks this host's set-up as a training job here would meet it: the cache URL and the
usual mistakes, the server (its version, auth mode, clock, a round trip), the shim and
the Python behind each tool, the stacks installed and the interception point serving
each, the libneuronxla hook, and L1. PASS, WARN, FAIL or SKIP per check, each with its
evidence and what to do. With --live, a tiny graph is also compiled with each stack,
twice, and the second must come from the server. --server, --namespace and --token
check another server than the job's (as NEFFCACHE_URL and NEFFCACHE_TOKEN would name
it). Exit 0 when nothing fails, 1 when something does (a server that cannot answer
among them), 2 on bad input. See docs/doctor.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import IO, TYPE_CHECKING, Any

from . import _server
from ._common import CommandError, help_text

if TYPE_CHECKING:
    from neffcache.client.doctor.model import Group, Outcome
    from neffcache.client.doctor.report import Redactor

# runner.GROUPS' names (a test keeps them equal), spelled here so that building the
# parser, which every neffcache command does, imports none of the checks.
_GROUPS = ("config", "server", "paths", "stacks", "hook", "l1", "live")
# context.LIVE_SECONDS, spelled here for the same reason.
_LIVE_SECONDS = 600.0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check this host's set-up: each interception point, the server, the stacks",
        usage="neffcache doctor [--json] [--report FILE] [--only GROUP] [--read-only] "
        "[--live [--live-deadline SECONDS]] [--server URL] [--namespace NS] [--token TOKEN]",
        description=help_text(__doc__),
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="also write everything (text, environment, JSON) to FILE, to attach to an "
        "issue: no token or secret is in it",
    )
    parser.add_argument(
        "--only",
        metavar="GROUP",
        action="append",
        choices=_GROUPS,
        help=f"run only this group of checks; repeat for several ({', '.join(_GROUPS)})",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="write nothing to the server (the round trip only looks up an absent key)",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="also compile a tiny graph with each stack installed, twice on a fresh L1: the "
        "second must be a server hit (minutes; publishes an entry per stack)",
    )
    parser.add_argument(
        "--live-deadline",
        metavar="SECONDS",
        type=_seconds,
        default=_LIVE_SECONDS,
        help=f"stop the live compiles after this long (default {_LIVE_SECONDS:g})",
    )
    _server.add_options(parser, namespace=True)
    # A server that cannot answer is a failed check among the others, not an error.
    parser.epilog = (
        "The server: --server, else the URL a job here would use. The namespace: "
        "--namespace, else the URL's. The token: --token, else NEFFCACHE_TOKEN. Exit 1 when "
        "a check fails (a server that cannot answer among them), 2 on bad input."
    )
    parser.set_defaults(run=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a number of seconds above 0: {text!r}")
    return value


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise CommandError(f"unexpected arguments: {' '.join(extra)}")
    out = _open(args.report) if args.report else None
    from neffcache.client.doctor import render, report, runner
    from neffcache.client.doctor.context import Context

    environ = _environ(args)
    ctx = Context(environ, read_only=args.read_only, live_seconds=args.live_deadline)
    config = ctx.config().config
    redact = report.Redactor(environ, [config.token] if config and config.token else [])
    groups = runner.selected(args.only, live=args.live)
    info = render.about()
    stream = None if args.json else _Stream(redact, info)
    try:
        outcomes = runner.run(ctx, groups, stream.result if stream else None)
    finally:
        ctx.close()
    code = runner.exit_code(outcomes)
    document = render.as_json(info, outcomes, code)
    if stream is not None:
        stream.write(render.summary(outcomes, code))
    else:
        # default=str: a check's data is facts, and one of an odd type must not end the run.
        sys.stdout.write(redact(json.dumps(document, indent=2, default=str)) + "\n")
    if out is not None:
        text = render.text(info, groups, outcomes, code)
        with out:
            out.write(report.strip_controls(redact(report.render(text, environ, document))))
        print(f"neffcache doctor: wrote {args.report} (no token or secret in it)", file=sys.stderr)
    return code


def _environ(args: argparse.Namespace) -> dict[str, str]:
    """This process's environment, with the server the options name in the variables a
    job reads: the checks then see it as a job given those would."""
    environ = dict(os.environ)
    given = (args.server, args.deprecated_url, args.namespace, args.token)
    if any(value is not None for value in given):
        target = _server.resolve(args, environ, namespace=True)
        environ["NEFFCACHE_URL"] = target.url
        environ.pop("NEFFCACHE_TOKEN", None)
        if target.token:
            environ["NEFFCACHE_TOKEN"] = target.token
    return environ


def _open(path: str) -> IO[str]:
    """The report file, opened before the checks run: a path that cannot be written is
    bad input, not something to find out after a minute of checks."""
    try:
        return open(path, "w", encoding="utf-8")  # closed by run()
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None


class _Stream:
    """Prints each result as it comes: on a slow host the first lines show at once."""

    def __init__(self, redact: Redactor, info: dict[str, Any]) -> None:
        from neffcache.client.doctor import render

        self.redact = redact
        self.group: str | None = None
        self.write(render.header(info))

    def write(self, text: str) -> None:
        sys.stdout.write(self.redact(text) + "\n")
        sys.stdout.flush()

    def result(self, group: Group, outcome: Outcome) -> None:
        from neffcache.client.doctor import render

        if group.name != self.group:
            self.group = group.name
            self.write(render.group_heading(group))
        self.write("\n".join(render.outcome_lines(outcome)))
