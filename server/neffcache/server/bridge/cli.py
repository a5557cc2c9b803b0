"""``neffcache import`` and ``neffcache export``, added to the ``neffcache`` command
through the ``neffcache.cli`` entry point (docs/bridge.md).

Importing this module is cheap: httpx, boto3 and keying's protobuf load inside the
commands (keying itself, which the host CLI imports anyway, costs little). A bad
input, an unreadable source and an unreachable server are each one line on stderr and
exit code 2; a run that finished with per-entry errors exits 1; an interrupted one
(Ctrl-C) says so in one line and exits 130, leaving only whole entries behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neffcache.server.bridge.remote import Remote
    from neffcache.server.bridge.report import Report

DEFAULT_SERVER = "http://127.0.0.1:8787"
_SCHEME_PREFIX = "neffcache+"
_NAMESPACE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


class CommandError(Exception):
    """Replaced at registration by the host CLI's own error type (one line, exit 2)."""


def register(sub: Any, error_type: type[Exception]) -> None:
    """Add ``import`` and ``export`` to the ``neffcache`` parser; ``error_type`` is the
    exception the host CLI reports as a one-line error."""
    from neffcache.keying import TARGETS  # cheap: its protobuf loads only to fingerprint

    global CommandError
    CommandError = error_type  # type: ignore[misc,assignment]
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
    parser.add_argument(
        "--server",
        help="the server: http://HOST:PORT, or neffcache+http://HOST:PORT/NAMESPACE "
        f"(default: NEFFCACHE_URL, else {DEFAULT_SERVER})",
    )
    parser.add_argument(
        "--namespace", help="the namespace (default: the one in a neffcache+ server URL)"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("NEFFCACHE_TOKEN"),
        help="a token with write scope to import, read to export (default: NEFFCACHE_TOKEN)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def resolve_server(
    server: str | None, namespace: str | None, environ: Any = os.environ
) -> tuple[str, str]:
    """(base URL, namespace) from the options, ``NEFFCACHE_URL`` and the defaults."""
    url = server or environ.get("NEFFCACHE_URL") or DEFAULT_SERVER
    from_url = None
    if url.startswith(_SCHEME_PREFIX):
        url, from_url = _split_neffcache_url(url)
    elif not re.fullmatch(r"https?://[^/\s]+/?", url):
        raise CommandError(
            f"server {url!r}: use http://HOST:PORT or neffcache+http://HOST:PORT/NAMESPACE"
        )
    chosen = namespace or from_url
    if chosen is None:
        raise CommandError(
            "no namespace: pass --namespace NS, or a server URL "
            "neffcache+http://HOST:PORT/NS (--server or NEFFCACHE_URL)"
        )
    if not _NAMESPACE.fullmatch(chosen):
        raise CommandError(
            f"namespace {chosen!r}: lowercase letters, digits, '.', '_', '-' (at most 63)"
        )
    return url.rstrip("/"), chosen


def _split_neffcache_url(url: str) -> tuple[str, str]:
    # The client's form (client/config.py parse_url); the server package may not import it.
    match = re.fullmatch(r"neffcache\+(https?://[^/\s]+)/([^/\s]+)/?", url)
    if match is None:
        raise CommandError(f"{url!r}: use neffcache+http://HOST:PORT/NAMESPACE")
    return match[1], match[2]


def run_import(args: argparse.Namespace, extra: list[str]) -> int:
    _no_extra(extra)
    server, namespace = resolve_server(args.server, args.namespace)
    _need_httpx("import")
    from neffcache.server.bridge.importer import import_cache
    from neffcache.server.bridge.report import Progress
    from neffcache.server.bridge.stock import SourceError, open_source

    progress = Progress("neffcache import", sys.stderr)
    try:
        source = open_source(args.src, follow_symlinks=args.follow_symlinks)
    except SourceError as exc:
        raise CommandError(str(exc)) from None
    try:
        try:
            with _connected(server, namespace, args.token) as remote:
                report = import_cache(source, remote, target=args.target, progress=progress)
        finally:
            progress.close()
            source.close()
    except SourceError as exc:
        raise CommandError(str(exc)) from None
    except KeyboardInterrupt:
        # A manifest goes last and is published atomically: no entry is half there.
        return _interrupted("import", "entries published so far are complete")
    context = {"source": args.src, "server": server, "namespace": namespace}
    return _finish(report, args.json, context)


def run_export(args: argparse.Namespace, extra: list[str]) -> int:
    _no_extra(extra)
    server, namespace = resolve_server(args.server, args.namespace)
    _need_httpx("export")
    from neffcache.server.bridge.exporter import Filters, export_cache, parse_since
    from neffcache.server.bridge.report import Progress

    try:
        since = None if args.since is None else parse_since(args.since)
    except ValueError:
        raise CommandError(
            f"--since {args.since!r} is not an ISO date: YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS[+HH:MM]"
        ) from None
    version = args.compiler_version
    if version is not None:
        version = version.removeprefix("neuronxcc-")
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)+(\+[0-9A-Za-z]+)?", version):
            raise CommandError(
                f"--compiler-version {args.compiler_version!r}: a neuronx-cc version such as "
                "2.20.9961.0+0acef03a, or 2.20.9961.0 for every build of it"
            )
    dest = Path(args.dest)
    if dest.exists() and not dest.is_dir():
        raise CommandError(f"{dest} exists and is not a directory")
    progress = Progress("neffcache export", sys.stderr)
    try:
        try:
            with _connected(server, namespace, args.token) as remote:
                filters = Filters(version, since)
                report = export_cache(remote, dest, filters=filters, progress=progress)
        finally:
            progress.close()
    except OSError as exc:
        raise CommandError(f"cannot write {dest}: {exc}") from None
    except KeyboardInterrupt:
        # Each entry is renamed into place whole; the one being written is removed.
        return _interrupted("export", "entries written so far are complete")
    context = {"dest": str(dest), "server": server, "namespace": namespace}
    return _finish(report, args.json, context)


@contextlib.contextmanager
def _connected(server: str, namespace: str, token: str | None) -> Iterator[Remote]:
    """A Remote for the run; its ``Unusable`` becomes the command's one-line error."""
    from neffcache.server.bridge.remote import Remote, Unusable

    remote = Remote(server, namespace, token)
    try:
        yield remote
    except Unusable as exc:
        raise CommandError(str(exc)) from None
    finally:
        remote.close()


def _interrupted(command: str, state: str) -> int:
    print(f"neffcache {command}: interrupted; {state}, run it again to go on", file=sys.stderr)
    return 130


def _finish(report: Report, as_json: bool, context: dict[str, str]) -> int:
    if as_json:
        json.dump(report.as_json(**context), sys.stdout, indent=2)
        sys.stdout.write("\n")
        print(report.line(), file=sys.stderr)
    else:
        print(report.line())
    return 1 if report.errors else 0


def _need_httpx(command: str) -> None:
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise CommandError(
            f"neffcache {command} needs the server extra: pip install 'neffcache[server]'"
        ) from None


def _no_extra(extra: list[str]) -> None:
    if extra:
        raise CommandError(f"unexpected arguments after --: {' '.join(extra)}")
