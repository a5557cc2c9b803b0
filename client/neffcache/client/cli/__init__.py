"""The ``neffcache`` command: one entry point, one module per subcommand.

Every subcommand reports trouble as one line on stderr, never a traceback (a CLI's
users are people and shell scripts, not Python callers), with one rule for the exit
code (``_common.py``): 2 for bad input, including a request the server refuses; 1 when
the server cannot answer; 130 when interrupted. ``wrap`` alone keeps the compiler's.
Every command that asks a server names it the same way (``_server.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._common import CommandError, MissingExtra, ServerUnavailable, missing_extra

if TYPE_CHECKING:
    import argparse

# Other parts add commands through this entry point group (the server adds `serve` and
# `admin`), so this package never imports them by name. A plugin's ``register(sub,
# host)`` gets the subparsers and ``_server``, the module with the one server resolver
# and the error types main() maps to exit codes; the bridge's commands (``import``,
# ``export``), part of the client, register the same way.
PLUGIN_GROUP = "neffcache.cli"
# This distribution's own plugins' commands: where one cannot load, its commands still
# parse, and say which extra to install instead of "invalid choice". (An install made
# while the bridge was a plugin lists a ``bridge`` entry point that no longer loads:
# not named here, it adds nothing.)
PLUGIN_COMMANDS = {"server": ("serve", "admin")}


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

    from neffcache.client.bridge import cli as bridge

    from . import _server

    bridge.register(sub, _server)
    for plugin in entry_points(group=PLUGIN_GROUP):
        try:
            register = plugin.load()
        except ImportError:
            _needs_extra(sub, PLUGIN_COMMANDS.get(plugin.name, ()))
            continue
        register(sub, _server)
    return parser


def _needs_extra(sub: Any, commands: Sequence[str]) -> None:
    """Commands whose plugin could not load: any arguments, one line, exit 2."""
    import argparse

    def run(args: argparse.Namespace, extra: list[str]) -> int:
        raise MissingExtra

    for name in commands:
        # No option prefix: every word, "--help" too, is one of the arguments it ignores.
        parser = sub.add_parser(
            name, help="(needs the server extra)", add_help=False, prefix_chars="\0"
        )
        parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
        parser.set_defaults(run=run)


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
    except BrokenPipeError:
        return _reader_gone()
    except ImportError as exc:
        if not missing_extra(exc):
            raise  # not a missing extra but a broken install, whose traceback helps
        return _failed(args.command, MissingExtra())
    except (CommandError, KeyingError, ServerUnavailable, KeyboardInterrupt) as exc:
        return _failed(args.command, exc)
    return code


def _failed(command: str, exc: BaseException) -> int:
    """One line on stderr for what ended a command, and its exit code."""
    if isinstance(exc, MissingExtra):
        line, code = str(exc), 2
    elif isinstance(exc, KeyboardInterrupt):
        line, code = "interrupted", 130
    elif isinstance(exc, ServerUnavailable):
        line, code = str(exc), 1
    else:
        line, code = f"error: {exc}", 2
    print(f"neffcache {command}: {line}", file=sys.stderr)
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
