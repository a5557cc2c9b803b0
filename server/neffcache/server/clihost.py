"""What every server command shares with the host CLI: its error types, its server
resolver (``host``), and the admin API's one request.

A module of its own, below ``cli.py``, ``admincli.py`` and ``recovery/commands.py``:
each of them imports it and none imports another back. ``cli.register`` binds the
host's types here (``bind``); read them as ``clihost.CommandError`` at call time.
"""

from __future__ import annotations

import argparse
from typing import Any


class CommandError(Exception):
    """Replaced at registration by the host CLI's own type (one line, exit 2)."""


class ServerUnavailable(Exception):
    """Replaced at registration by the host CLI's own type (one line, exit 1)."""


# The host CLI's ``_server`` module, set at registration.
host: Any = None


def bind(cli_host: Any) -> None:
    """Take the host CLI's server resolver and error types (cli.py's docstring)."""
    global CommandError, ServerUnavailable, host
    host = cli_host
    CommandError = cli_host.CommandError  # type: ignore[misc]
    ServerUnavailable = cli_host.ServerUnavailable  # type: ignore[misc]


def no_extra(extra: list[str]) -> None:
    if extra:
        raise CommandError(f"unexpected arguments after --: {' '.join(extra)}")


def target_arguments(parser: argparse.ArgumentParser, *, local: bool) -> None:
    host.add_options(
        parser, namespace=False, token_help="an admin token (default: NEFFCACHE_TOKEN)"
    )
    if local:
        parser.add_argument(
            "--local",
            action="store_true",
            help="write the server's index directly (on the server host; no server needed)",
        )
        parser.add_argument("--data-dir", help="with --local: the server's data directory")


def request(
    args: argparse.Namespace, method: str, path: str, body: Any = None, timeout: float = 10.0
) -> Any:
    """The admin API's JSON answer, asked through the host CLI's one API client
    (``host.request``); a refusal is a CommandError (exit 2), no answer or one that is
    not JSON a ServerUnavailable (exit 1)."""
    return host.request(args, method, path, body, timeout)
