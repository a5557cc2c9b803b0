"""``neffcache stats [--json] [--zero] [--server URL] [--local-dir DIR] [--window 7d]``

This host's cache statistics, as ``ccache -s`` shows a compiler cache's: the graphs
every rank and process of the host resolved (hits from L1 and from the server,
compiles, fall-backs and why), the time fetches took and the compile time hits saved,
from the counters kept in L1; L1's size against its limit and the free space; and,
with a server configured (``NEFFCACHE_URL`` or ``--server``), the server's view of the
namespace. ``--zero`` resets the counters (not L1's contents) before showing them.
Exit 0 when all is shown, 1 when the server cannot answer (the host's part is shown,
and one line on stderr says why) or ``--zero`` cannot write L1, 2 on bad input or a
request the server refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any

# ``_size``: the size setting's own parser (ClientConfig reads it only with a URL set).
from neffcache.client.config import DEFAULT_LOCAL_DIR, ClientConfig, ConfigError, _size

from . import _server
from ._common import CommandError, ServerUnavailable, help_text, one_line

if TYPE_CHECKING:
    from neffcache.client.hosttally import Tally

DAY = 86400.0
MAX_WINDOW = 90 * DAY  # the server's bound (the events' default retention)
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": DAY, "w": 7 * DAY}
# The walk of L1 for its size stops here (an L1 on a slow network volume): the figures
# are then of what it saw, and say so.
WALK_SECONDS = 20.0
STATUS_LIMIT = 1 << 20  # the status answer is a few hundred bytes


def register(sub: Any) -> None:
    parser = one_line(
        sub.add_parser(
            "stats",
            help="this host's hits, compiles, fall-backs and L1 size (like ccache -s)",
            usage="neffcache stats [--json] [--zero] [--server URL] [--namespace NS] "
            "[--token TOKEN] [--local-dir DIR] [--window 7d]",
            description=help_text(__doc__),
        )
    )
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.add_argument(
        "--zero", action="store_true", help="reset the host's counters first (not L1)"
    )
    _server.add_options(parser, namespace=True)
    parser.epilog = (
        "The server: --server, else NEFFCACHE_URL; none: the host's part alone. The "
        "namespace: --namespace, else the URL's. The token: --token, else NEFFCACHE_TOKEN. "
        f"{_server.EXIT_CODES}"
    )
    parser.add_argument("--local-dir", metavar="DIR", help="L1 instead of NEFFCACHE_LOCAL_DIR's")
    parser.add_argument(
        "--window",
        metavar="DURATION",
        default="7d",
        help="the server's hit rate over this long: 7d, 12h, seconds (default 7d)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise CommandError(f"unexpected arguments: {' '.join(extra)}")
    window = _window(args.window)
    config, local_dir, max_size = _settings(args)
    from neffcache.client.hosttally import fold, read

    if args.zero:
        from neffcache.client.config import local_read_only

        if local_read_only(os.environ):  # the write helpers would refuse, silently
            print(
                "neffcache stats: cannot zero the counters: L1 is declared read-only "
                "(NEFFCACHE_LOCAL_READ_ONLY)",
                file=sys.stderr,
            )
            return 1
        try:
            zeroed = fold(local_dir, zero=True).held
        except OSError as exc:
            print(f"neffcache stats: cannot zero the counters: {exc}", file=sys.stderr)
            return 1
        if not zeroed:
            print(
                "neffcache stats: cannot zero the counters: L1's stats lock is held",
                file=sys.stderr,
            )
            return 1
        print("neffcache stats: counters zeroed", file=sys.stderr)
    writable = _writable(local_dir)
    lost = _fold(local_dir) if writable else False
    found = read(local_dir)
    server, failure = (None, None) if config is None else _server_view(config, window)
    stats = {
        "counters": _counters(found.tally, lost or found.summary_lost, local_dir),
        "l1": _l1(local_dir, max_size, writable),
        "server": server,
    }
    if args.json:
        json.dump(stats, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        from ._stats_table import table

        sys.stdout.write(table(stats, window))
    if failure is not None:
        raise failure  # after the host's part, which is shown all the same
    return 0


def _window(text: str) -> float:
    found = _DURATION.fullmatch(text.lower())
    seconds = float(found[1]) * _UNITS[found[2]] if found else 0.0
    if not 0 < seconds <= MAX_WINDOW:
        raise CommandError(
            f"--window {text!r}: give a duration from 1s to 90d, such as 7d, 12h or 3600"
        )
    return seconds


def _settings(args: argparse.Namespace) -> tuple[ClientConfig | None, str, int | None]:
    """The training job's configuration (None when no server is configured), L1's
    directory and its size setting, with the command line's overrides."""
    env = dict(os.environ)
    if args.local_dir:
        env["NEFFCACHE_LOCAL_DIR"] = args.local_dir
    target = _server.configured(args, env, namespace=True)
    config = None if target is None else _server.client_config(target, env)
    try:
        max_size = _size(env, "NEFFCACHE_LOCAL_MAX_SIZE")
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    return config, env.get("NEFFCACHE_LOCAL_DIR") or DEFAULT_LOCAL_DIR, max_size


def _writable(local_dir: str) -> bool:
    """Whether processes like this one can record counters in L1: the deepest
    directory that exists on the way to the counters' is writable."""
    from neffcache.client.hostlog import stats_dir

    directory = os.path.abspath(stats_dir(local_dir))
    while not os.path.exists(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    return os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)


def _fold(local_dir: str) -> bool:
    """Fold the counters' log into their summary, which keeps it small (a command
    that only reads makes no directory: nothing to fold where there is none); True
    when the summary could not be read and was begun again."""
    from neffcache.client.hostlog import stats_dir
    from neffcache.client.hosttally import fold

    if not os.path.isdir(stats_dir(local_dir)):
        return False
    try:
        lost = fold(local_dir).summary_lost
    except OSError:  # read as they are
        return False
    return lost


def _counters(tally: Tally, summary_lost: bool, local_dir: str) -> dict[str, Any]:
    from neffcache.client.hostlog import stats_dir
    from neffcache.client.reasons import CLIENT_REASONS, FAILED_BEFORE, UNKNOWN

    kinds = tally.kinds
    misses = kinds["compiled"] + kinds["failed"] + kinds["replayed"]
    # A fall-back: a miss the cache could not help with for a reason of the client's own.
    fallback_codes = {*CLIENT_REASONS, FAILED_BEFORE} - {UNKNOWN}
    fallbacks = {r: n for r, n in sorted(tally.reasons.items()) if r in fallback_codes}
    return {
        "directory": stats_dir(local_dir),
        "graphs": kinds["l1"] + kinds["server"] + misses,
        "hits_l1": kinds["l1"],
        "hits_server": kinds["server"],
        "misses": misses,
        "compiles": kinds["compiled"],
        "compile_failures": kinds["failed"],
        "failures_replayed": kinds["replayed"],
        "miss_reasons": dict(sorted(tally.reasons.items())),
        "fallbacks": sum(fallbacks.values()),
        "fallback_reasons": fallbacks,
        "fetch_seconds": round(tally.fetch_seconds, 6),
        "saved_seconds": round(tally.saved_seconds, 3),
        "compile_seconds": round(tally.compile_seconds, 3),
        "bytes_fetched": tally.bytes_fetched,
        "skipped_records": tally.skipped,
        "summary_lost": summary_lost,
        "zeroed_at": tally.zeroed_at,
        "updated_at": tally.updated_at,
    }


def _l1(local_dir: str, max_size: int | None, writable: bool) -> dict[str, Any]:
    """What counts against L1's size limit (l1limit.py: its blobs and the stock
    entries), the limit and the free space."""
    from neffcache.client.l1limit import Evictor

    evictor = Evictor(local_dir, max_size)
    deadline = time.monotonic() + WALK_SECONDS
    # The evictor's own walks, so that these are the very files the limit counts.
    blobs = list(evictor._blobs(deadline))
    entries = list(evictor._entries(deadline))
    try:
        fs = os.statvfs(local_dir)
        free: int | None = fs.f_bavail * fs.f_frsize
    except OSError:
        free = None
    return {
        "directory": local_dir,
        "entries": len(blobs) + len(entries),
        "blobs": len(blobs),
        "stock_entries": len(entries),
        "bytes": sum(item.size for item in blobs + entries),
        "limit_bytes": evictor.limit(),
        "free_bytes": free,
        "complete": time.monotonic() <= deadline,
        "writable": writable,
    }


def _server_view(config: ClientConfig, window: float) -> tuple[dict[str, Any], Exception | None]:
    """The server's ``GET /v1/status`` for the configured namespace, or why not, with
    the error the command ends with when it could not be had."""
    shown: dict[str, Any] = {"url": config.url, "status": None, "error": None}
    failure: Exception
    try:
        answer = _server.ask(
            config.server,
            config.namespace,
            config.token,
            lambda api: api.get(api.status_path(window=window), limit=STATUS_LIMIT),
            connect_timeout=config.connect_timeout,
            timeout=max(config.timeout, 30.0),
        )
    except (ServerUnavailable, CommandError) as exc:
        failure = exc
    else:
        status = _status(answer.body)
        if status is not None:
            shown["status"] = status
            return shown, None
        failure = ServerUnavailable(f"{config.server} answered with something other than a status")
    shown["error"] = str(failure)
    return shown, failure


def _status(body: bytes) -> dict[str, Any] | None:
    try:
        status = json.loads(body)
    except ValueError:
        return None
    return status if isinstance(status, dict) else None
