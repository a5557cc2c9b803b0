"""Helpers shared by subcommands."""

from __future__ import annotations


class CommandError(Exception):
    """A bad input to a subcommand; main() prints it as one line and exits 2."""


def help_text(doc: str | None) -> str | None:
    """A command module's docstring, second paragraph, as its ``--help`` description:
    without reStructuredText's literal markup, which a terminal would show as is."""
    return doc.split("\n\n")[1].replace("``", "") if doc else None
