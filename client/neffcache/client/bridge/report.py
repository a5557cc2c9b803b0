"""What an import or export tells its user: counts by outcome, the entries that need a
look, a progress bar while it runs, and the summary at the end."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

# Outcomes whose entries are listed by address in the JSON summary: each asks for a
# look (the rest are routine and may number thousands).
NOTEWORTHY = frozenset({"unkeyable", "conflict", "error"})


@dataclass
class Report:
    """Counts of every outcome (zeros included, in a fixed order) and the noteworthy
    entries. ``done`` outcomes are what the run did or found already done; the others
    are skips, except ``error``. ``tallies`` are counted beside the outcomes (one
    entry may add to them or not), such as ``aliases_added``."""

    command: str
    done: Sequence[str]
    skipped: Sequence[str]
    tallies: Sequence[str] = ()
    counts: dict[str, int] = field(default_factory=dict)
    details: list[dict[str, str]] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.counts = dict.fromkeys([*self.done, *self.skipped, "error"], 0)
        self.totals = dict.fromkeys(self.tallies, 0)

    def add(self, outcome: str, address: str, reason: str | None = None) -> None:
        self.counts[outcome] += 1
        if outcome in NOTEWORTHY:
            self.details.append({"address": address, "outcome": outcome, "reason": reason or ""})

    def tally(self, name: str, n: int) -> None:
        self.totals[name] += n

    @property
    def errors(self) -> int:
        return self.counts["error"]

    def line(self) -> str:
        """The one-line summary: ``neffcache import: 3 imported, 1 present; aliases
        added: 2; skipped 1 failed, 2 empty; 1 error``; what did not happen is left out."""

        def listed(outcomes: Sequence[str]) -> str:
            return ", ".join(f"{self.counts[o]} {o}" for o in outcomes if self.counts[o])

        parts = [listed(self.done) or "nothing new"]
        parts += [f"{name.replace('_', ' ')}: {n}" for name, n in self.totals.items() if n]
        if listed(self.skipped):
            parts.append("skipped " + listed(self.skipped))
        if self.errors:
            parts.append(f"{self.errors} error{'s' if self.errors > 1 else ''}")
        return f"neffcache {self.command}: " + "; ".join(parts)

    def as_json(self, **context: Any) -> dict[str, Any]:
        return {
            "command": self.command,
            **context,
            "counts": self.counts,
            **self.totals,
            "details": self.details,
        }


class Progress:
    """A one-line bar on ``stream`` when it is a terminal; silent otherwise (a log file
    or a pipe gets only the summary)."""

    _INTERVAL_S = 0.1
    _WIDTH = 30

    def __init__(self, label: str, stream: TextIO, total: int | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream
        self._on = stream.isatty()
        self._last = 0.0

    def advance(self, note: str = "") -> None:
        self.done += 1
        now = time.monotonic()
        if self._on and (now - self._last >= self._INTERVAL_S or self.done == self.total):
            self._last = now
            self._draw(note)

    def close(self) -> None:
        if self._on:
            self._stream.write("\r\033[K")  # erase the bar: the summary follows
            self._stream.flush()

    def _draw(self, note: str) -> None:
        if self.total:
            filled = self._WIDTH * self.done // self.total
            bar = f"[{'#' * filled}{'.' * (self._WIDTH - filled)}] {self.done}/{self.total}"
        else:
            bar = f"{self.done} entries"
        line = f"{self.label} {bar} {note}"
        # Never wider than the terminal: a wrapped line would defeat the carriage return.
        width = shutil.get_terminal_size().columns - 1
        self._stream.write(f"\r\033[K{line[:width]}")
        self._stream.flush()
