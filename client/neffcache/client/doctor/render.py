"""The results as a person reads them (text) and as a script does (JSON).

Neither redacts: ``report.Redactor`` is applied to whatever is printed or written.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from neffcache.client.doctor.model import Group, Outcome, Status

# Bumped when the JSON output changes incompatibly (scripts read it).
FORMAT = 1
_INDENT = " " * 8


def about() -> dict[str, Any]:
    """Where and what ran: neffcache's version, this Python, the host, the time."""
    from importlib import metadata

    try:
        version = metadata.version("neffcache")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "neffcache": version,
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "pid": os.getpid(),
    }


def header(info: dict[str, Any]) -> str:
    return (
        f"neffcache doctor: neffcache {info['neffcache']}, Python {info['python']} "
        f"({info['executable']}), host {info['host']}, {info['time']}"
    )


def group_heading(group: Group) -> str:
    return f"\n{group.title}"


def outcome_lines(outcome: Outcome, *, details: bool = True) -> list[str]:
    result = outcome.result
    lines = [f"  {result.status.value:<4}  {outcome.check.id:<22} {result.evidence}"]
    if result.fix:
        lines.append(f"{_INDENT}fix: {result.fix}")
    if details:
        lines += [f"{_INDENT}- {line}" for line in result.details]
    return lines


def counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    found = Counter(o.result.status for o in outcomes)
    return {status.value: found.get(status, 0) for status in Status}


def summary(outcomes: Sequence[Outcome], code: int) -> str:
    parts = ", ".join(f"{n} {status}" for status, n in counts(outcomes).items())
    verdict = "something fails" if code else "nothing fails"
    return f"\n{parts}: {verdict} (exit {code})"


def text(
    info: dict[str, Any], groups: Sequence[Group], outcomes: Sequence[Outcome], code: int
) -> str:
    lines = [header(info)]
    for group in groups:
        mine = [o for o in outcomes if o.check.group == group.name]
        if mine:
            lines.append(group_heading(group))
            for outcome in mine:
                lines += outcome_lines(outcome)
    lines.append(summary(outcomes, code))
    return "\n".join(lines) + "\n"


def as_json(info: dict[str, Any], outcomes: Sequence[Outcome], code: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        **info,
        "results": [
            {
                "id": o.check.id,
                "group": o.check.group,
                "title": o.check.title,
                "status": o.result.status.value,
                "evidence": o.result.evidence,
                "fix": o.result.fix,
                "details": list(o.result.details),
                "data": dict(o.result.data),
                "seconds": o.seconds,
            }
            for o in outcomes
        ],
        "summary": counts(outcomes),
        "exit_code": code,
    }
