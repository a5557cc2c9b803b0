"""``neffcache prewarm --manifest RUN_MANIFEST [--parallel N] [--json]``

Fetches every graph a previous run used (its run manifest, ``NEFFCACHE_RUN_MANIFEST``)
into L1 before a job starts, so the job pays no fetch latency: see
``neffcache.client.prewarm``. The server and L1 come from the environment a training
job uses. Exit 0 when every graph is in L1 or missing on the server (the job will
compile those), 1 when some could not be fetched, 2 on bad input, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from neffcache.client.config import ClientConfig, ConfigError, wants_neffcache

from ._common import CommandError, help_text

MAX_PARALLEL = 64


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "prewarm",
        help="fetch every graph a previous run used into L1",
        usage="neffcache prewarm --manifest RUN_MANIFEST [--parallel N] [--json] "
        "[--url URL] [--local-dir DIR]",
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
    parser.add_argument(
        "--url",
        metavar="URL",
        help="neffcache+http://HOST:PORT/NAMESPACE instead of the environment's",
    )
    parser.add_argument("--local-dir", metavar="DIR", help="L1 instead of NEFFCACHE_LOCAL_DIR's")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise CommandError(f"unexpected arguments: {' '.join(extra)}")
    if not args.manifest:
        raise CommandError("--manifest RUN_MANIFEST is required")
    parallel = _parallel(args.parallel)
    config = _config(args.url, args.local_dir)
    _check_l1(config.local_dir)
    from neffcache.client.prewarm import prewarm, read_run_manifest

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
    except KeyboardInterrupt:
        # prewarm() has stopped its threads and cut their downloads, whose temporary
        # files are removed (those a killed prewarm leaves go at the next start).
        print("neffcache prewarm: interrupted", file=sys.stderr)
        return 130
    print(f"neffcache prewarm: {summary.line()}", file=sys.stderr)
    if args.json:
        json.dump(summary.as_json(), sys.stdout)
        sys.stdout.write("\n")
    return 1 if summary.failed else 0


def _parallel(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PARALLEL:
        raise CommandError(f"--parallel {raw!r}: give a whole number from 1 to {MAX_PARALLEL}")
    return value


def _config(url: str | None, local_dir: str | None) -> ClientConfig:
    """The training job's configuration, with the command line's overrides."""
    env = dict(os.environ)
    if url:
        env["NEFFCACHE_URL"] = url
    if local_dir:
        env["NEFFCACHE_LOCAL_DIR"] = local_dir
    try:
        config = ClientConfig.from_env(env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    if config is not None:
        return config
    if wants_neffcache(env):
        raise CommandError("NEFFCACHE_DISABLE is set: unset it to prewarm")
    raise CommandError(
        "no neffcache URL: set NEFFCACHE_URL (or NEURON_COMPILE_CACHE_URL) to "
        "neffcache+http://HOST:PORT/NAMESPACE, or pass --url"
    )


def _check_l1(local_dir: str) -> None:
    """An L1 that cannot be written is a wrong option here, not a run of failures."""
    root = Path(local_dir) / ".neffcache"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"cannot write L1 {local_dir}: {exc.strerror or exc}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise CommandError(f"cannot write L1 {local_dir}: set NEFFCACHE_LOCAL_DIR or --local-dir")
