"""Helpers shared by subcommands."""

from __future__ import annotations


class CommandError(Exception):
    """A bad input to a subcommand; main() prints it as one line and exits 2."""
