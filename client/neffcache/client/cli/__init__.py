"""The ``neffcache`` command: one entry point, one module per subcommand.

Every subcommand reports a bad input as one line on stderr and exit code 2, never a
traceback: a CLI's users are people and shell scripts, not Python callers.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._common import CommandError

if TYPE_CHECKING:
    import argparse

# Other parts add commands through this entry point group (the server adds `serve` and
# `admin`), so this package never imports them by name.
PLUGIN_GROUP = "neffcache.cli"


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="neffcache",
        description="A shared compilation cache for AWS Neuron.",
    )
    from ._version import VersionAction

    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from . import (
        _doctor_cmd,
        _explain_cmd,
        _key_cmd,
        _prewarm_cmd,
        _report_cmd,
        _stats_cmd,
        _wrap_cmd,
    )

    for command in (
        _key_cmd,
        _wrap_cmd,
        _prewarm_cmd,
        _explain_cmd,
        _report_cmd,
        _stats_cmd,
        _doctor_cmd,
    ):
        command.register(sub)
    from importlib.metadata import entry_points  # scans every installed package

    for plugin in entry_points(group=PLUGIN_GROUP):
        try:
            register = plugin.load()
        except ImportError:
            continue  # that part is not installed
        register(sub, CommandError)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["wrap"] and "-h" not in args_in[1:2] and "--help" not in args_in[1:2]:
        # Once per graph, in a fresh process: skip the parser, the plugins and keying's
        # import, which together cost more than a cache hit may.
        from neffcache.client.wrapper import exit_fast
        from neffcache.client.wrapper import main as wrap

        command = args_in[1:]
        status = wrap(command[1:] if command[:1] == ["--"] else command)
        if argv is None:  # this process is the wrapper's own: no teardown to wait for
            exit_fast(status)
        return status
    # Everything after the first "--" is compiler flags, passed through untouched:
    # argparse would otherwise try to read "--model-type" as one of its own options.
    extra: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, extra = args_in[:cut], args_in[cut + 1 :]
    from neffcache.keying import KeyingError

    parser = build_parser()
    args = parser.parse_args(args_in)
    try:
        code: int = args.run(args, extra)
        sys.stdout.flush()  # a reader that left shows here, not as Python exits
    except (CommandError, KeyingError) as exc:
        print(f"neffcache {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _reader_gone()
    return code


def _reader_gone() -> int:
    """The reader of stdout left (``neffcache ... --json | head``): no traceback, as a
    tool killed by SIGPIPE prints none. Python ignores SIGPIPE, so the write raised
    instead; stdout goes to devnull so that the flush at exit fails no more (the Python
    docs' recipe, signal module), and the exit code is a SIGPIPE death's, 128 + 13."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141
