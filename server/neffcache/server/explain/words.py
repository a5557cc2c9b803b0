"""Plain words for explanations: times, durations, versions and flag differences.

Pure functions; times are the server's clock, shown in UTC so that every reader of
one explanation sees the same words.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence

DAY = 86400.0


def day(at: float) -> str:
    """``2026-11-12``."""
    return time.strftime("%Y-%m-%d", time.gmtime(at))


def moment(at: float, now: float) -> str:
    """``14:02 UTC`` on the day of ``now``, else ``2026-11-12 14:02 UTC``."""
    if day(at) == day(now):
        return time.strftime("%H:%M UTC", time.gmtime(at))
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def duration(seconds: float) -> str:
    """Whole units, rounded down: ``30 days``, ``1 hour``, ``12 minutes``, ``40 s``."""
    for size, unit in ((DAY, "day"), (3600.0, "hour"), (60.0, "minute")):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{max(0, int(seconds))} s"


def short(key: str) -> str:
    return key[:12]


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


_VERSION = re.compile(r"^([0-9]+(?:\.[0-9]+)*)")


def version_base(version: str) -> str:
    """The release number of a build string: ``2.20.9961.0`` of ``2.20.9961.0+0acef03a``."""
    return version.partition("+")[0]


def version_order(theirs: str, yours: str) -> int:
    """-1 when ``yours`` is an older release than ``theirs``, 1 newer, 0 the same
    release (or not comparable)."""
    a, b = _VERSION.match(theirs), _VERSION.match(yours)
    if a is None or b is None:
        return 0
    left = [int(p) for p in a[1].split(".")]
    right = [int(p) for p in b[1].split(".")]
    return (left < right) - (left > right)


def compiler_change(theirs: str, yours: str) -> str:
    """The summary of a compiler difference, as the issue words it."""
    order = version_order(theirs, yours)
    if order == 0 and version_base(theirs) == version_base(yours):
        return (
            f"compiled before under neuronx-cc {theirs}; you have {yours}: another build "
            "of the same release misses every graph"
        )
    what = {1: "a compiler upgrade", -1: "a compiler downgrade"}.get(order, "another compiler")
    return (
        f"compiled before under neuronx-cc {version_base(theirs)}; you have "
        f"{version_base(yours)}: {what} misses every graph"
    )


def _split(flag: str) -> tuple[str, str | None]:
    name, sep, value = flag.partition("=")
    return name, value if sep else None


def _show(value: str | None) -> str:
    return "(set, no value)" if value is None else (value or '""')


def flag_changes(theirs: Sequence[str], yours: Sequence[str]) -> list[str]:
    """Each difference between two normalized flag lists (``--name=value`` spellings),
    in plain words; ``[]`` when they are equal. Values of the graph compiled before
    come first: ``flag --optlevel differs: 1 vs 2``."""
    if list(theirs) == list(yours):
        return []
    before = dict(map(_split, theirs))
    after = dict(map(_split, yours))
    changes = []
    for name in after:
        if name not in before:
            changes.append(f"flag {_spell(name, after[name])} is new")
        elif before[name] != after[name]:
            changes.append(f"flag {name} differs: {_show(before[name])} vs {_show(after[name])}")
    changes.extend(
        f"flag {_spell(name, before[name])} is gone" for name in before if name not in after
    )
    if not changes:
        # Same names and last values: another order, or a flag given more than once.
        # The compiler lets the last of competing flags win, so both are in the key.
        both = f"{' '.join(theirs)} vs {' '.join(yours)}"
        if sorted(theirs) == sorted(yours):
            changes.append(f"the same flags in another order: {both}")
        else:
            changes.append(f"the same flags, some given more than once: {both}")
    return changes


def _spell(name: str, value: str | None) -> str:
    return name if value is None else f"{name}={value}"


def mapping_changes(theirs: Mapping[str, str], yours: Mapping[str, str], what: str) -> list[str]:
    """Differences between two name -> value maps (environment, frameworks)."""
    changes = []
    for name in sorted(set(theirs) | set(yours)):
        if name not in theirs:
            changes.append(f"{what} {name} is set now ({yours[name]!r}), not before")
        elif name not in yours:
            changes.append(f"{what} {name} was set before ({theirs[name]!r}), not now")
        elif theirs[name] != yours[name]:
            changes.append(f"{what} {name} differs: {theirs[name]!r} vs {yours[name]!r}")
    return changes


def opcode_changes(theirs: Sequence[str], yours: Sequence[str], limit: int = 6) -> list[str]:
    """How the operations of two graphs differ, counted by opcode: ``+2 add``,
    ``-1 multiply`` (from per-instruction ``"<opcode> <shape>"`` strings)."""
    counts: dict[str, int] = {}
    for text in yours:
        op = text.partition(" ")[0]
        counts[op] = counts.get(op, 0) + 1
    for text in theirs:
        op = text.partition(" ")[0]
        counts[op] = counts.get(op, 0) - 1
    changed = sorted((op for op, n in counts.items() if n), key=lambda op: (-abs(counts[op]), op))
    return [f"{counts[op]:+d} {op}" for op in changed[:limit]]
