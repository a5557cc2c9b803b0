"""Why a graph missed: the server's explanation, asked for while the graph compiles.

On a miss that goes on to compile, ``Explanation`` posts the key's components (and the
graph's summary, when keying can make one) to ``POST /v1/ns/{ns}/explain`` on a daemon
thread, so the compile never waits for it. When the compile ends, ``result`` waits at
most ``REASON_WAIT`` seconds more: the run-manifest line then gets ``reason`` and
``reason_summary``, the graph event ``reason``. The request is in the ``telemetry``
scope (remote.py): trouble with it never makes the cache skip the server.

When the server cannot tell, the client says why itself, with one of
``CLIENT_REASONS``. The server's vocabulary (``server/neffcache/server/explain/
reasons.py``, which the client may not import) holds them too; a test checks. One
server code is the client's to give as well: ``failed-before``, for a compile failure
replayed to a rank that waited for it (that compile failed moments ago, here).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from neffcache.client._log import log

if TYPE_CHECKING:
    from neffcache.client.remote import Remote

SERVER_UNAVAILABLE = "server-unavailable"  # the server could not be asked
UNKEYABLE = "unkeyable"  # the graph could not be keyed
UNCACHED = "uncached"  # caching is off for this call
UNKNOWN = "unknown"  # no explanation arrived in time, or none applies
# The server refused the token (remote.py skips it meanwhile): 401, no token or an
# unknown one; 403, a namespace the token does not cover.
UNAUTHORIZED = "unauthorized"
FORBIDDEN = "forbidden"
CLIENT_REASONS = (SERVER_UNAVAILABLE, UNKEYABLE, UNCACHED, UNKNOWN, UNAUTHORIZED, FORBIDDEN)
FAILED_BEFORE = "failed-before"

# Seconds a finished compile waits for an explanation still on its way. Compiles take
# seconds to hours and the request starts with them: the answer is nearly always in.
REASON_WAIT = 2.0
# Shapes go with an explanation's graph summary up to this many instructions (the
# request's bound is 8 MiB; a graph event keeps them only up to 2,048).
_EXPLAIN_SHAPES = 65_536
_SHAPE_MAX = 4096  # characters of one instruction's shape, as the server takes it
# A reason code as the server's vocabulary spells them (``new-graph``), 64 at most.
_CODE_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_SUMMARY_MAX = 1000


class Prepared(NamedTuple):
    """What an explanation is asked for: the key and its components, ``graph`` (the
    summary) among them when there is one."""

    key: str
    direct_key: str | None
    components: dict[str, Any]


class Explanation:
    """One miss's explanation, asked for on a daemon thread from the moment it is made.

    ``prepare`` runs on that thread too (fingerprinting a large graph takes time): it
    returns what to ask about, or None when the graph cannot be keyed."""

    def __init__(self, remote: Remote, prepare: Callable[[], Prepared | None]) -> None:
        self._remote = remote
        self._prepare = prepare
        self._done = threading.Event()
        self.prepared: Prepared | None = None
        self.reason = UNKNOWN
        self.summary: str | None = None
        threading.Thread(target=self._run, name="neffcache-explain", daemon=True).start()

    def result(self, wait: float = REASON_WAIT) -> tuple[str, str | None]:
        """The reason and its one-line summary; ``unknown`` if not in within ``wait``."""
        if not self._done.wait(wait):
            return UNKNOWN, None
        return self.reason, self.summary

    def _run(self) -> None:
        try:
            prepared = self._prepare()
            if prepared is None:
                self.reason = UNKEYABLE
                return
            self.prepared = prepared
            self.reason, self.summary = self._ask(prepared)
        except Exception:  # an explanation is never worth a failure
            log.exception("neffcache: asking why a graph missed failed")
        finally:
            self._remote.close()  # this thread's connection
            self._done.set()

    def _ask(self, prepared: Prepared) -> tuple[str, str | None]:
        components = {k: v for k, v in prepared.components.items() if k != "graph"}
        body: dict[str, Any] = {"key": prepared.key, "components": components}
        if isinstance(prepared.components.get("graph"), Mapping):
            body["graph"] = prepared.components["graph"]
        response = self._remote.explain(json.dumps(body).encode())
        if response is None:
            return self._remote.refusal() or SERVER_UNAVAILABLE, None
        if response.status != 200:
            return UNKNOWN, None  # a server without explanations, or one that cannot
        try:
            answer = json.loads(response.body)
        except ValueError:
            return UNKNOWN, None
        reason = answer.get("reason") if isinstance(answer, dict) else None
        if not isinstance(reason, str) or not _is_code(reason):
            # Not a code: the line would keep what the event (control characters
            # replaced, cut) or the server's counting could not, and they would differ.
            return UNKNOWN, None
        summary = answer.get("summary")
        return reason, summary[:_SUMMARY_MAX] if isinstance(summary, str) else None


def _is_code(text: str) -> bool:
    return 0 < len(text) <= 64 and text[0] != "-" and _CODE_CHARACTERS.issuperset(text)


def summarize(module: bytes) -> dict[str, Any] | None:
    """The graph's summary for an explanation (``structure``, ``instructions``, and
    ``shapes`` up to a bound), or None when keying has no ``graph_summary`` or it
    cannot read the graph: the summary only sharpens an explanation."""
    import importlib

    make = getattr(importlib.import_module("neffcache.keying"), "graph_summary", None)
    if make is None:
        return None
    try:
        summary = make(module)
    except Exception:  # KeyingError, or a keying bug: the explanation goes without
        return None
    structure = getattr(summary, "structure", None)
    instructions = getattr(summary, "instructions", None)
    shapes = getattr(summary, "shapes", None)
    if not isinstance(structure, str) or not isinstance(instructions, int):
        return None
    graph: dict[str, Any] = {"structure": structure, "instructions": instructions}
    # All of them or none: the server checks there is one per instruction.
    if shapes is not None and len(shapes) == instructions <= _EXPLAIN_SHAPES:
        texts = [str(shape) for shape in shapes]
        if all(len(text) <= _SHAPE_MAX for text in texts):
            graph["shapes"] = texts
    return graph
