"""``neffcache --version``: the installed distribution's version.

Looked up only when asked: ``importlib.metadata`` walks ``sys.path`` for it, which
every other command would otherwise pay for. The version is the distribution's, not
the server's module, so it prints in a training image without the ``server`` extra.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

DISTRIBUTION = "neffcache"


def package_version() -> str:
    """The version pip installed, or ``unknown`` from a source tree never installed."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


class VersionAction(argparse.Action):
    """argparse's ``version`` action, with the version looked up when the option is
    given rather than when the parser is built."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="print the version and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(f"{DISTRIBUTION} {package_version()}\n")
        parser.exit()
