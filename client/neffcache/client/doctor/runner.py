"""The registry of checks and the loop that runs them.

A check that raises is reported as a FAIL with the exception's one line, and the
others still run: the doctor is run on hosts where things are broken. Each check's
own waits are bounded (child processes and requests have timeouts; walks have
budgets), so the run as a whole ends.

To add a group, write a module exporting ``CHECKS`` and add a ``Group`` here,
``default=False`` when it should run only when asked for: the ``live`` group compiles
a graph per stack and publishes, so it runs with ``--live`` or ``--only live``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from neffcache.client.doctor import (
    config_checks,
    hook_checks,
    l1_checks,
    live_checks,
    path_checks,
    server_checks,
    stack_checks,
)
from neffcache.client.doctor.context import Context
from neffcache.client.doctor.model import Check, Group, Outcome, Result, Status, failed

GROUPS: tuple[Group, ...] = (
    Group("config", "Configuration", config_checks.CHECKS),
    Group("server", "Server", server_checks.CHECKS),
    Group("paths", "Interpreters and PATH", path_checks.CHECKS),
    Group("stacks", "Stacks", stack_checks.CHECKS),
    Group("hook", "Hook", hook_checks.CHECKS),
    Group("l1", "L1", l1_checks.CHECKS),
    Group("live", "Live compiles", live_checks.CHECKS, default=False),
)
# What one line of evidence or fix may be: a terminal line or two, never a log.
LINE = 400


def selected(only: Sequence[str] | None, *, live: bool = False) -> list[Group]:
    """The groups ``only`` names (in the registry's order), or the default ones; with
    ``live``, the live group too."""
    names = set(only or [g.name for g in GROUPS if g.default]) | ({"live"} if live else set())
    return [g for g in GROUPS if g.name in names]


def run(
    ctx: Context,
    groups: Sequence[Group],
    on_result: Callable[[Group, Outcome], None] | None = None,
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for group in groups:
        for check in group.checks:
            outcome = run_one(ctx, check)
            outcomes.append(outcome)
            if on_result is not None:
                on_result(group, outcome)
    return outcomes


def run_one(ctx: Context, check: Check) -> Outcome:
    began = time.monotonic()
    try:
        result = check.run(ctx)
    except Exception as exc:  # a check's bug must not hide the other checks
        result = failed(
            f"the check itself failed: {type(exc).__name__}: {exc}",
            "attach `neffcache doctor --report FILE` to an issue",
        )
    return Outcome(check, _tidy(result), round(time.monotonic() - began, 3))


def _tidy(result: Result) -> Result:
    """Evidence and fix as one line each, details one line each."""
    return Result(
        result.status,
        one_line(result.evidence),
        one_line(result.fix),
        tuple(one_line(d) for d in result.details),
        result.data,
    )


def one_line(text: str) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= LINE else flat[: LINE - 1] + "…"


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """0 when nothing failed, 1 otherwise."""
    return 1 if any(o.result.status is Status.FAIL for o in outcomes) else 0
