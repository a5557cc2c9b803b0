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
    """The admin API's JSON answer; a refusal is a CommandError (exit 2), no answer or
    one that is not JSON a ServerUnavailable (exit 1)."""
    import httpx

    target = host.resolve(args, namespace=False)
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    # Certificates are loaded for https only: loading them costs a fifth of a second,
    # and a plain http server has no use for them.
    verify = target.server.startswith("https://")
    try:
        response = httpx.request(
            method,
            target.server + path,
            json=body,
            headers=headers,
            timeout=timeout,
            verify=verify,
        )
    except httpx.HTTPError as exc:
        raise ServerUnavailable(f"cannot reach {target.server}: {exc}") from None
    if not 200 <= response.status_code < 300:
        raise host.answer_error(target.server, response.status_code, _detail(response))
    try:
        return response.json() if response.content else None
    except ValueError:
        raise ServerUnavailable(
            f"{target.server} answered with something other than JSON"
        ) from None


def _detail(response: Any) -> str:
    """The server's reason, on one line: its ``detail``, else the body."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        detail = response.text
    return " ".join(str(detail).split())[:300] or "no reason given"
