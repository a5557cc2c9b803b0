"""``neffcache admin reindex`` and ``neffcache admin fsck``: run on a host with the
server's settings (``NEFFCACHE_*``, ``--config``, ``--data-dir``), opening its stores
directly, with or without a server running: they exist for when the index is lost.

fsck exits as fsck(8) does: 0 when all is well, 1 when it found problems and repaired
them all, 4 when problems are left (run it with ``--repair``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from neffcache.server import clihost
from neffcache.server.units import human_bytes

_SHOWN = 20  # items listed per problem in the text output


def register(admin_sub: Any, one_line: Any) -> None:
    reindex = one_line(
        admin_sub.add_parser(
            "reindex",
            help="rebuild the index from the blob store's documents (a lost or wiped index)",
            description="Restore every entry, alias, token, policy and pin the blob store "
            "documents and the index lacks; rows the index holds stay. Safe beside running "
            "replicas, and to run twice.",
        )
    )
    _store_arguments(reindex)
    reindex.set_defaults(run=run_reindex)
    fsck = one_line(
        admin_sub.add_parser(
            "fsck",
            help="check index, documents and blobs against each other; --repair fixes",
            description="Find dangling index rows, orphaned and (with --verify) corrupt "
            "blobs, and index rows and documents that disagree (docs/operations.md). "
            "Exit 0: clean (orphans await the collector); 1: problems found and all "
            "repaired; 4: problems left.",
        )
    )
    fsck.add_argument("--repair", action="store_true", help="fix what it finds")
    fsck.add_argument(
        "--verify", action="store_true", help="read and hash every blob (reads everything)"
    )
    _store_arguments(fsck)
    fsck.set_defaults(run=run_fsck)


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="the server's TOML settings file")
    parser.add_argument("--data-dir", help="the server's data directory (embedded stores)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


@contextmanager
def local_backends(args: argparse.Namespace) -> Iterator[Any]:
    """The server's stores, opened as ``neffcache serve`` opens them (the index
    wrapped with its documents), as ``Services``; closed after."""
    from neffcache.server.blobs import open_blob_store
    from neffcache.server.config_errors import ConfigError
    from neffcache.server.errors import StoreError
    from neffcache.server.index import open_index
    from neffcache.server.services import build_services
    from neffcache.server.settings import load_settings

    try:
        settings = load_settings(data_dir=args.data_dir, config_file=getattr(args, "config", None))
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        blobs = open_blob_store(settings.blob_store_url())
    except (ConfigError, OSError, StoreError) as exc:
        raise clihost.CommandError(str(exc)) from None
    try:
        index = open_index(settings.index_store_url())
    except (ConfigError, StoreError) as exc:
        blobs.close()
        raise clihost.CommandError(str(exc)) from None
    try:
        yield build_services(settings, blob_store=blobs, index=index, starting=False)
    except StoreError as exc:
        raise clihost.CommandError(f"{exc} (run it again: it takes up what is left)") from None
    finally:
        index.close()
        blobs.close()


def run_reindex(args: argparse.Namespace, extra: list[str]) -> int:
    from neffcache.server.recovery.durable import DurableIndex
    from neffcache.server.recovery.reindex import reindex

    clihost.no_extra(extra)
    with local_backends(args) as backends:
        index = backends.index
        if not isinstance(index, DurableIndex):
            raise clihost.CommandError("this blob store keeps no documents to rebuild from")
        report = reindex(index.inner, backends.blobs, index.store, progress=_progress(args))
    if args.json:
        return _dump(report.as_json(), 0)
    print(
        f"reindex: {report.restored} entries restored, {report.present} already there, "
        f"{report.aliases} aliases, {report.tokens} tokens, {report.records} policies and "
        f"pins, in {report.seconds:.1f} s"
    )
    for title, items in (
        (
            "not restored, blobs missing (fsck --repair removes their documents)",
            report.missing_blobs,
        ),
        ("kept the index's own manifest (conflicts)", report.conflicts),
        ("not restored: the namespace now takes only trusted writers", report.untrusted),
        ("damaged documents (fsck reports them)", report.damaged),
    ):
        _section(title, items)
    return 0


def run_fsck(args: argparse.Namespace, extra: list[str]) -> int:
    from neffcache.server.recovery.fsck import fsck

    clihost.no_extra(extra)
    with local_backends(args) as backends:
        report = fsck(backends, repair=args.repair, verify=args.verify, progress=_progress(args))
    status = 0 if not report.problems else 1 if args.repair and not report.left else 4
    if args.json:
        return _dump(report.as_json(), status)
    verified = f", {report.verified} verified" if args.verify else ""
    print(
        f"fsck: {report.entries} entries, {report.blobs} blobs "
        f"({human_bytes(report.blob_bytes)}{verified}), {report.documents} entry documents, "
        f"in {report.seconds:.1f} s"
    )
    for title, items in (
        ("dangling entries (index rows naming absent or short blobs)", report.dangling),
        ("corrupt blobs (bytes do not match their digest)", report.corrupt),
        (
            f"orphaned blobs ({human_bytes(report.orphaned_bytes)}; no entry or document "
            "names them, older than the grace period; the evicting replica collects them)",
            report.orphaned,
        ),
        (
            "undocumented entries (index rows whose document is missing or differs)",
            report.undocumented,
        ),
        ("unindexed documents (entries the index lacks)", report.unindexed),
        ("damaged documents", report.damaged),
        ("token, policy and pin documents missing or stale", report.configuration),
    ):
        _section(title, items)
    if not report.problems:
        print("clean")
    elif args.repair:
        done = ", ".join(f"{what} {count}" for what, count in sorted(report.repaired.items()))
        left = f"; {report.left} left (run it again)" if report.left else ""
        print(f"{report.problems} problems; repaired: {done or 'nothing'}{left}")
    else:
        print(f"{report.problems} problems; run again with --repair to fix them")
    return status


def _section(title: str, items: list[str]) -> None:
    if not items:
        return
    print(f"{title}: {len(items)}")
    for item in items[:_SHOWN]:
        print(f"  {item}")
    if len(items) > _SHOWN:
        print(f"  ... and {len(items) - _SHOWN} more (--json lists all)")


def _progress(args: argparse.Namespace) -> Any:
    def progress(line: str) -> None:
        if not args.json:
            print(f"  {line}", file=sys.stderr)

    return progress


def _dump(value: Any, status: int) -> int:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return status
