"""``neffcache import`` and ``neffcache export``, commands of the client's
``neffcache`` (docs/bridge.md): they need the base install, and boto3 (the ``s3``
extra) only for an ``s3://`` source.

Importing this module is cheap: the HTTP client, boto3 and keying's protobuf load
inside the commands (keying itself, which the CLI imports anyway, costs little). The
server, namespace and token are named as for every command (the CLI's resolver,
``cli/_server.py``, handed to ``register`` as the server's commands get it).
A bad input, an unreadable source or a refused token is one line on stderr and exit
code 2; a server that cannot answer, one line and exit 1; a run that finished with
per-entry errors exits 1; an interrupted one (Ctrl-C) says so in one line and exits
130, leaving only whole entries behind (``--json``: the counts so far, marked
``interrupted``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neffcache.client.bridge.remote import Remote
    from neffcache.client.bridge.report import Report

# The host CLI's ``_server`` module (resolver and error types), set at registration.
host: Any = None


def register(sub: Any, cli_host: Any) -> None:
    """Add ``import`` and ``export`` to the ``neffcache`` parser; ``cli_host`` is the
    host CLI's server resolver and error types."""
    from neffcache.keying import TARGETS  # cheap: its protobuf loads only to fingerprint

    global host
    host = cli_host
    imp = sub.add_parser(
        "import",
        help="import a stock Neuron cache (a directory or s3://) into a server",
        description=_IMPORT_DOC,
    )
    imp.add_argument("src", metavar="SRC", help="a stock cache directory or s3://bucket/prefix")
    imp.add_argument(
        "--target",
        choices=TARGETS,
        help="the target of entries whose compile_flags.json has no --target=",
    )
    imp.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="read files and folders that symlinks in SRC lead to outside it (such as "
        "Hugging Face blobs optimum-neuron links in); without it such entries are errors",
    )
    _server_arguments(imp)
    imp.set_defaults(run=run_import)

    exp = sub.add_parser(
        "export",
        help="write a server's entries out as a stock Neuron cache",
        description=_EXPORT_DOC,
    )
    exp.add_argument(
        "dest", metavar="DEST", help="the cache directory to write (created if absent)"
    )
    exp.add_argument(
        "--compiler-version",
        help="only this neuronx-cc build (2.20.9961.0+0acef03a), or every build of a number",
    )
    exp.add_argument(
        "--since", help="only entries published since this date (YYYY-MM-DD or ISO 8601, UTC)"
    )
    _server_arguments(exp)
    exp.set_defaults(run=run_export)


_IMPORT_DOC = (
    "Publish every successful entry of a stock Neuron cache (neuronxcc-*/MODULE_*/ with "
    "model.neff and model.done) to a neffcache server, keyed from its HLO and "
    "compile_flags.json, with its Neuron address as an alias. Failed, locked, empty and "
    "unkeyable entries are skipped and counted; entries the server holds count as present "
    "and get the folder's address as an alias. A symlink leading out of SRC makes its "
    "entry an error unless --follow-symlinks is given."
)
_EXPORT_DOC = (
    "Write every entry of a namespace that has a Neuron address into DEST in the stock "
    "layout, verified, model.done last, for the unmodified SDK to use (air-gapped "
    "clusters, container images). Entries compiled under a compile-affecting environment "
    "variable are skipped: a stock cache cannot tell environments apart."
)


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    host.add_options(
        parser,
        namespace=True,
        token_help="a token with write scope to import, read to export (default: NEFFCACHE_TOKEN)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def run_import(args: argparse.Namespace, extra: list[str]) -> int:
    _no_extra(extra)
    target = host.resolve(args, namespace=True)
    from neffcache.client.bridge.importer import import_cache, import_report
    from neffcache.client.bridge.report import Progress
    from neffcache.client.bridge.stock import SourceError, open_source

    progress = Progress("neffcache import", sys.stderr)
    try:
        source = open_source(args.src, follow_symlinks=args.follow_symlinks)
    except SourceError as exc:
        raise host.CommandError(str(exc)) from None
    report = import_report()
    context = {"source": args.src, "server": target.server, "namespace": target.namespace}
    try:
        try:
            with _connected(target) as remote:
                import_cache(source, remote, target=args.target, progress=progress, report=report)
        finally:
            progress.close()
            source.close()
    except SourceError as exc:
        raise host.CommandError(str(exc)) from None
    except KeyboardInterrupt:
        # A manifest goes last and is published atomically: no entry is half there.
        return _interrupted(report, args.json, context, "entries published so far are complete")
    return _finish(report, args.json, context)


def run_export(args: argparse.Namespace, extra: list[str]) -> int:
    _no_extra(extra)
    target = host.resolve(args, namespace=True)
    from neffcache.client.bridge.exporter import Filters, export_cache, export_report, parse_since
    from neffcache.client.bridge.report import Progress

    try:
        since = None if args.since is None else parse_since(args.since)
    except ValueError:
        raise host.CommandError(
            f"--since {args.since!r} is not an ISO date: YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS[+HH:MM]"
        ) from None
    version = args.compiler_version
    if version is not None:
        version = version.removeprefix("neuronxcc-")
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)+(\+[0-9A-Za-z]+)?", version):
            raise host.CommandError(
                f"--compiler-version {args.compiler_version!r}: a neuronx-cc version such as "
                "2.20.9961.0+0acef03a, or 2.20.9961.0 for every build of it"
            )
    dest = Path(args.dest)
    if dest.exists() and not dest.is_dir():
        raise host.CommandError(f"{dest} exists and is not a directory")
    progress = Progress("neffcache export", sys.stderr)
    report = export_report()
    context = {"dest": str(dest), "server": target.server, "namespace": target.namespace}
    try:
        try:
            with _connected(target) as remote:
                filters = Filters(version, since)
                export_cache(remote, dest, filters=filters, progress=progress, report=report)
        finally:
            progress.close()
    except OSError as exc:
        raise host.CommandError(f"cannot write {dest}: {exc}") from None
    except KeyboardInterrupt:
        # Each entry is renamed into place whole; the one being written is removed.
        return _interrupted(report, args.json, context, "entries written so far are complete")
    return _finish(report, args.json, context)


@contextlib.contextmanager
def _connected(target: Any) -> Iterator[Remote]:
    """A Remote for the run; its ``Unusable`` becomes the command's one-line error: a
    refused token is bad input (exit 2), any other a server that cannot answer (1)."""
    from neffcache.client.bridge.remote import Remote, TokenRefused, Unusable

    try:
        remote = Remote(target.server, target.namespace, target.token)
    except Unusable as exc:
        raise host.ServerUnavailable(str(exc)) from None
    try:
        yield remote
    except TokenRefused as exc:
        raise host.CommandError(str(exc)) from None
    except Unusable as exc:
        raise host.ServerUnavailable(str(exc)) from None
    finally:
        remote.close()


def _interrupted(report: Report, as_json: bool, context: dict[str, Any], state: str) -> int:
    if as_json:
        _dump(report, {**context, "interrupted": True})
    print(
        f"neffcache {report.command}: interrupted; {state}, run it again to go on",
        file=sys.stderr,
    )
    return 130


def _finish(report: Report, as_json: bool, context: dict[str, Any]) -> int:
    if as_json:
        _dump(report, {**context, "interrupted": False})
        print(report.line(), file=sys.stderr)
    else:
        print(report.line())
    return 1 if report.errors else 0


def _dump(report: Report, context: dict[str, Any]) -> None:
    json.dump(report.as_json(**context), sys.stdout, indent=2)
    sys.stdout.write("\n")


def _no_extra(extra: list[str]) -> None:
    if extra:
        raise host.CommandError(f"unexpected arguments after --: {' '.join(extra)}")
