"""The real ``neffcache`` argparse tree, walked: every command path and its parser.

Built by the CLI's own ``build_parser`` (plugins from the ``neffcache.cli`` entry point
included), so a command added anywhere is found without a list to keep up to date.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from neffcache.client.cli import build_parser


@dataclass(frozen=True)
class Node:
    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    help: str | None  # what the parent's command list says of it


def _subcommands(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(found) <= 1
    return found[0] if found else None


def walk(
    parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()
) -> Iterator[Node]:
    """Every command, depth first, the root (``()``) first."""
    parser = parser or build_parser()
    if not path:
        yield Node((), parser, parser.description)
    action = _subcommands(parser)
    if action is None:
        return
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    for name, sub in action.choices.items():
        yield Node((*path, name), sub, helps.get(name))
        yield from walk(sub, (*path, name))


def children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = _subcommands(parser)
    return dict(action.choices) if action else {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


@dataclass(frozen=True)
class Resolved:
    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    rest: tuple[str, ...]  # the words after the command path


def resolve(words: Sequence[str], root: argparse.ArgumentParser) -> Resolved:
    """The deepest command the leading words name (``admin token create ...``)."""
    parser, index = root, 0
    path: tuple[str, ...] = ()
    while index < len(words) and words[index] in children(parser):
        parser = children(parser)[words[index]]
        path = (*path, words[index])
        index += 1
    return Resolved(path, parser, tuple(words[index:]))


def mentioned_options(words: Sequence[str]) -> list[str]:
    """``--option`` names in words, brackets of a synopsis stripped, up to a ``--``
    after which everything is the compiler's flags."""
    named: list[str] = []
    for word in words:
        if word == "--":
            break
        named += re.findall(r"(?:^|[\[|])(--?[A-Za-z][A-Za-z0-9-]*)", word)
    return named


@dataclass(frozen=True)
class Parsed:
    ok: bool
    namespace: argparse.Namespace | None
    error: str


def parse(words: Sequence[str], root: argparse.ArgumentParser) -> Parsed:
    """Parse as ``neffcache.client.cli.main`` does (words after ``--`` are the
    compiler's), without running anything."""
    words = list(words)
    if "--" in words:
        words = words[: words.index("--")]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            namespace = root.parse_args(words)
    except SystemExit as exc:
        return Parsed(False, None, f"exit {exc.code}: {err.getvalue().strip()}")
    return Parsed(True, namespace, "")
