"""What the documentation shows, read out of its Markdown: fenced blocks, inline code,
the ``neffcache`` commands in them and the HTTP requests they name.

Imported by the tests in this folder as ``docs.doctext``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")
# Shell words that end one command and start another.
_SEPARATORS = {"&&", "||", ";", "|"}
# What may stand before a command on its line: a Dockerfile instruction, `export`.
_PREFIXES = {"RUN", "export", "exec", "sudo"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
METHODS = ("GET", "HEAD", "PUT", "POST", "PATCH", "DELETE")
_REQUEST = re.compile(rf"^({'|'.join(METHODS)}) (/\S*)(?: (.+))?$")


def pages() -> list[Path]:
    """Every Markdown page a reader sees: the README and the docs site."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language tag and text, and the line its text starts."""

    path: Path
    line: int
    lang: str
    text: str


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(path, text.count("\n", 0, m.start(2)) + 1, m.group(1), m.group(2))
        for m in _FENCE.finditer(text)
    ]


def prose(path: Path) -> str:
    """The page with its fenced blocks blanked (line numbers kept)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())


def spans(path: Path) -> list[tuple[int, str]]:
    """Inline code outside fenced blocks, each with its line; one may wrap a line."""
    text = prose(path)
    return [
        (text.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
        for m in _SPAN.finditer(text)
    ]


@dataclass(frozen=True)
class Command:
    """One ``neffcache`` command a page shows: its words after ``neffcache``."""

    where: str
    words: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def synopsis(self) -> bool:
        """A usage synopsis (``[--opt X]``, ``a|b``, ``...``), not a command to run."""
        return any(
            w.startswith("[") or w.endswith("]") or w == "..." or ("|" in w and "=" not in w)
            for w in self.words
        )

    def __str__(self) -> str:
        return shlex.join(["neffcache", *self.words])


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """The block's commands as single lines: ``\\`` continuations and indented
    follow-on lines joined; in a block with ``$`` prompts, only the prompted lines
    (the rest is output). A ``text`` block is output, save its prompted lines."""
    raw = block.text.splitlines()
    prompted = block.lang == "text" or any(line.startswith("$ ") for line in raw)
    lines: list[tuple[int, str]] = []
    continued = False
    for number, line in enumerate(raw, start=block.line):
        if continued or (not prompted and line[:1].isspace() and lines):
            lines[-1] = (lines[-1][0], lines[-1][1].rstrip("\\") + " " + line.strip())
        elif prompted and not line.startswith("$ "):
            continue
        else:
            lines.append((number, line.removeprefix("$ ")))
        continued = line.rstrip().endswith("\\")
    return lines


def transcripts(path: Path) -> list[tuple[str, str]]:
    """Each ``$ `` command of the page's blocks (continuations joined) and the output
    shown after it."""
    found: list[tuple[str, str]] = []
    for block in blocks(path):
        lines = block.text.splitlines()
        index = 0
        while index < len(lines):
            if not lines[index].startswith("$ "):
                index += 1
                continue
            command = lines[index][2:]
            while command.endswith("\\") and index + 1 < len(lines):
                index += 1
                command = command[:-1] + " " + lines[index].strip()
            index += 1
            start = index
            while index < len(lines) and not lines[index].startswith("$ "):
                index += 1
            found.append((" ".join(command.split()), "\n".join(lines[start:index])))
    return found


def commands_in(line: str, at: str) -> list[Command]:
    """The ``neffcache`` commands of one shell line (comments dropped, ``&&`` and pipes
    split, ``VAR=value`` prefixes kept as the command's environment)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    found: list[Command] = []
    segment: list[str] = []
    for word in [*words, ";"]:
        if word not in _SEPARATORS:
            segment.append(word)
            continue
        env: list[tuple[str, str]] = []
        while segment and (segment[0] in _PREFIXES or _ASSIGNMENT.fullmatch(segment[0])):
            if "=" in segment[0]:
                name, _, value = segment[0].partition("=")
                env.append((name, value))
            segment.pop(0)
        if segment[:1] == ["neffcache"]:
            found.append(Command(at, tuple(segment[1:]), tuple(env)))
        segment = []
    return found


def block_commands(path: Path) -> list[Command]:
    """Every ``neffcache`` command in the page's fenced code blocks, in order."""
    return [
        command
        for block in blocks(path)
        if block.lang not in ("json", "toml", "mermaid", "python")
        for number, line in logical_lines(block)
        for command in commands_in(line, where(path, number))
    ]


def span_commands(path: Path) -> list[Command]:
    """Every inline ``neffcache ...`` mention; often partial (``neffcache admin pin``)."""
    return [
        Command(where(path, number), tuple(_words(text)[1:]))
        for number, text in spans(path)
        if text.startswith("neffcache ")
    ]


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a mention: the plain words
        return text.split()


@dataclass(frozen=True)
class Request:
    """An HTTP request a page names: ``GET /v1/...`` with an optional JSON body."""

    where: str
    method: str
    target: str  # path and query, as written
    body: str | None
    row: str  # the table row or line it was found in: what the docs say it answers

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> list[str]:
        """The names of the query parameters written."""
        query = self.target.partition("?")[2]
        return [part.partition("=")[0] for part in query.split("&") if part]


def requests(path: Path) -> list[Request]:
    """Every ``METHOD /path`` in inline code (a JSON body in the next span of the same
    line) and every line of a fenced block that is one."""
    found: list[Request] = []
    text = prose(path)
    lines = text.splitlines()
    for match in re.finditer(r"`([A-Z]+ /[^`]*)`(?: `(\{[^`]*\})`)?", text):
        number = text.count("\n", 0, match.start()) + 1
        request = _REQUEST.match(match.group(1))
        if request:
            method, target, _ = request.groups()
            at = where(path, number)
            found.append(Request(at, method, target, match.group(2), lines[number - 1]))
    for block in blocks(path):
        for number, line in enumerate(block.text.splitlines(), start=block.line):
            request = _REQUEST.match(line.strip())
            if request:
                method, target, body = request.groups()
                found.append(Request(where(path, number), method, target, body, line))
    return found


def variables(text: str) -> set[str]:
    """The ``NEFFCACHE_*`` and ``NEURON_*`` environment variables a text names."""
    return set(re.findall(r"\b((?:NEFFCACHE|NEURON)_[A-Z0-9_]*[A-Z0-9])\b", text))
