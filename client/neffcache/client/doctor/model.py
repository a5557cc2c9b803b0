"""What a check is and what it answers.

A check answers one ``Result``: a status, one line of evidence (what was seen), one
line of fix (what to do; empty when nothing is to be done), optional detail lines
(a list the evidence summarises) and ``data`` (the same facts for scripts, in the
JSON output). A check never raises: the runner turns an exception into a FAIL.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neffcache.client.doctor.context import Context


class Status(str, enum.Enum):
    PASS = "PASS"  # works as neffcache expects
    WARN = "WARN"  # works, but not as well as it could, or differs from our assumptions
    FAIL = "FAIL"  # an interception point does not work: the exit code is 1
    SKIP = "SKIP"  # does not apply here (a stack not installed, no server to ask)


@dataclass(frozen=True)
class Result:
    status: Status
    evidence: str
    fix: str = ""
    details: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)


def passed(evidence: str, *, details: Sequence[str] = (), **data: Any) -> Result:
    return Result(Status.PASS, evidence, "", tuple(details), data)


def warned(evidence: str, fix: str, *, details: Sequence[str] = (), **data: Any) -> Result:
    return Result(Status.WARN, evidence, fix, tuple(details), data)


def failed(evidence: str, fix: str, *, details: Sequence[str] = (), **data: Any) -> Result:
    return Result(Status.FAIL, evidence, fix, tuple(details), data)


def skipped(evidence: str, *, details: Sequence[str] = (), **data: Any) -> Result:
    return Result(Status.SKIP, evidence, "", tuple(details), data)


@dataclass(frozen=True)
class Check:
    """``id`` is ``<group>.<name>`` (``config.url``); ``run`` answers for a context."""

    id: str
    title: str
    run: Callable[[Context], Result]

    @property
    def group(self) -> str:
        return self.id.partition(".")[0]


@dataclass(frozen=True)
class Group:
    """A group of checks as the output heads it. ``default`` groups run unless
    ``--only`` names others; a group that takes long or changes more (``live``, which
    compiles a graph per stack) is registered with ``default=False``."""

    name: str
    title: str
    checks: tuple[Check, ...]
    default: bool = True


@dataclass(frozen=True)
class Outcome:
    check: Check
    result: Result
    seconds: float
