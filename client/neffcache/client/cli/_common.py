"""Helpers shared by subcommands, and the errors every command reports the same way.

    Exception
        CommandError        bad input, or a request the server refused: one line, exit 2
            MissingExtra    a command of the ``server`` extra where it is not installed
        ServerUnavailable   the server cannot answer: one line, exit 1

``main()`` maps each to its line and exit code; the server's commands raise the same
classes (they receive this module's types at registration: ``_server.py``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the wrapper's fast path imports this module, never argparse
    import argparse

# The ``server`` extra's top-level modules (pyproject.toml). The client never imports
# them (tests/test_structure.py), so one of these missing can only be a server command
# run where the extra is not installed.
SERVER_EXTRA_MODULES = frozenset(
    {
        "fastapi",
        "httpx",
        "prometheus_client",
        "pydantic",
        "pydantic_settings",
        "starlette",
        "uvicorn",
    }
)
SERVER_EXTRA = "needs the server extra: pip install 'neffcache[server]'"


class CommandError(Exception):
    """A bad input to a subcommand; main() prints it as one line and exits 2."""


class MissingExtra(CommandError):
    """The command needs the ``server`` extra; main() prints ``SERVER_EXTRA`` (exit 2)."""

    def __init__(self) -> None:
        super().__init__(SERVER_EXTRA)


class ServerUnavailable(Exception):
    """The server could not answer: not reached, a timeout, a 5xx, an answer that is
    not one; main() prints it as one line and exits 1."""


def missing_extra(exc: ImportError) -> bool:
    """Whether ``exc`` is a module of the ``server`` extra that is not installed."""
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return bool(name) and str(name).partition(".")[0] in SERVER_EXTRA_MODULES


def help_text(doc: str | None) -> str | None:
    """A command module's docstring, second paragraph, as its ``--help`` description:
    without reStructuredText's literal markup, which a terminal would show as is."""
    return doc.split("\n\n")[1].replace("``", "") if doc else None


def one_line(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A bad option is one line on stderr and exit code 2, as every neffcache command
    reports bad input, not argparse's usage block."""

    def error(message: str) -> Any:
        sys.stderr.write(f"{parser.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)

    parser.error = error  # type: ignore[method-assign]
    return parser
