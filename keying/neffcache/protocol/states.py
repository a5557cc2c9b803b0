"""The words of the lease exchange (docs/protocol.md), as ``Literal`` types.

Literal types rather than enums: the values travel as JSON strings and in query
strings, pydantic validates a ``Literal`` directly, mypy checks every comparison
against one, and a plain string never formats as ``State.DONE`` in a URL.
"""

from __future__ import annotations

from typing import Literal, TypeGuard, get_args

# What ``POST /v1/ns/{ns}/leases/{name}`` answers in its ``state`` field:
#   done     the entry is there (``entry`` holds it): fetch, do not compile
#   granted  the caller holds the lease now (``lease``, ``ttl``): compile, then release
#   held     another holder compiles it (202): wait, or compile unleased
#   failed   its holder released it as failed (``failure``): the compile failed there
#   free     nobody holds it (only when asked with ``take`` false)
AnswerState = Literal["done", "granted", "held", "failed", "free"]
ANSWER_STATES: frozenset[str] = frozenset(get_args(AnswerState))

# How a holder releases its lease (``DELETE …?outcome=``): ``failed`` leaves a notice
# for those who waited, for the namespace's failure TTL.
LeaseOutcome = Literal["done", "failed"]
LEASE_OUTCOMES: frozenset[str] = frozenset(get_args(LeaseOutcome))


def is_answer_state(value: object) -> TypeGuard[AnswerState]:
    return isinstance(value, str) and value in ANSWER_STATES
