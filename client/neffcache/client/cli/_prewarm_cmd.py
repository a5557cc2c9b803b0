"""``neffcache prewarm --manifest RUN_MANIFEST [--parallel N] [--json]``

Fetches every graph a previous run used (its run manifest, ``NEFFCACHE_RUN_MANIFEST``)
into L1 before a job starts, so the job pays no fetch latency: see
``neffcache.client.prewarm``. The server, token and L1 come from the environment a
training job uses, or from --server, --namespace, --token and --local-dir. Exit 0 when
every graph is in L1 or missing on the server (the job will compile those), 1 when
the server cannot answer (one line) or some graphs could not be fetched, 2 on bad
input, 130 when interrupted (with --json, the counts so far, marked interrupted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neffcache.client.config import ClientConfig, _flag

from . import _server
from ._common import CommandError, ServerUnavailable, help_text

if TYPE_CHECKING:
    from neffcache.client.prewarm import Summary

MAX_PARALLEL = 64


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "prewarm",
        help="fetch every graph a previous run used into L1",
        usage="neffcache prewarm --manifest RUN_MANIFEST [--parallel N] [--json] "
        "[--server URL] [--namespace NS] [--token TOKEN] [--local-dir DIR]",
        description=help_text(__doc__),
    )
    parser.add_argument(
        "--manifest",
        metavar="RUN_MANIFEST",
        help="a run manifest written with NEFFCACHE_RUN_MANIFEST (JSON lines)",
    )
    parser.add_argument(
        "--parallel",
        metavar="N",
        default="8",
        help=f"graphs fetched at once, 1..{MAX_PARALLEL} (default 8)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    _server.add_options(parser, namespace=True)
    parser.add_argument("--local-dir", metavar="DIR", help="L1 instead of NEFFCACHE_LOCAL_DIR's")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise CommandError(f"unexpected arguments: {' '.join(extra)}")
    if not args.manifest:
        raise CommandError("--manifest RUN_MANIFEST is required")
    parallel = _parallel(args.parallel)
    config = _config(args)
    _check_l1(config.local_dir, config.local_read_only)
    from neffcache.client.prewarm import Interrupted, Unanswered, prewarm, read_run_manifest

    try:
        graphs = read_run_manifest(args.manifest)
    except OSError as exc:
        raise CommandError(f"cannot read {args.manifest}: {exc.strerror or exc}") from None
    if graphs.lines and graphs.malformed == graphs.lines:
        raise CommandError(
            f"{args.manifest} is not a run manifest: none of its {graphs.lines} lines is a "
            "JSON object with key, direct_key or neuron_address"
        )
    try:
        summary = prewarm(config, graphs, parallel, progress=sys.stderr)
    except Unanswered as exc:
        raise ServerUnavailable(str(exc)) from None
    except Interrupted as stopped:
        # prewarm() has stopped its threads and cut their downloads, whose temporary
        # files are removed (those a killed prewarm leaves go at the next start).
        return _report(stopped.summary, args.json, 130)
    return _report(summary, args.json, 1 if summary.failed else 0)


def _report(summary: Summary, as_json: bool, code: int) -> int:
    state = "interrupted; " if summary.interrupted else ""
    print(f"neffcache prewarm: {state}{summary.line()}", file=sys.stderr)
    if as_json:
        json.dump(summary.as_json(), sys.stdout)
        sys.stdout.write("\n")
    return code


def _parallel(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PARALLEL:
        raise CommandError(f"--parallel {raw!r}: give a whole number from 1 to {MAX_PARALLEL}")
    return value


def _config(args: argparse.Namespace) -> ClientConfig:
    """The training job's configuration, with the command line's overrides."""
    if _flag(os.environ, "NEFFCACHE_DISABLE"):
        # The job that follows would not use what prewarm fetches.
        raise CommandError("NEFFCACHE_DISABLE is set: unset it to prewarm")
    target = _server.resolve(args, namespace=True)
    return _server.client_config(target, local_dir=args.local_dir)


def _check_l1(local_dir: str, read_only: bool) -> None:
    """An L1 that cannot be written is a wrong option here, not a run of failures."""
    if read_only:
        raise CommandError(
            f"L1 {local_dir} is declared read-only (NEFFCACHE_LOCAL_READ_ONLY): prewarm fills "
            "L1, so run it where L1 is written (an image's build, say), or unset the variable"
        )
    root = Path(local_dir) / ".neffcache"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"cannot write L1 {local_dir}: {exc.strerror or exc}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise CommandError(f"cannot write L1 {local_dir}: set NEFFCACHE_LOCAL_DIR or --local-dir")
