"""Events as the index stores them, for the report tests (``reports.support``)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

from neffcache.server.index.base import Event

HOUR = 3600.0
DAY = 86400.0


def key(n: int | str) -> str:
    return hashlib.sha256(f"key {n}".encode()).hexdigest()


def utc(text: str) -> float:
    """Epoch seconds of an ISO time, UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def graph(at: float, namespace: str = "team-a", **fields: Any) -> Event:
    """A stored ``graph`` event: its fields as a client sends them, stamped ``at``."""
    body = {"kind": "graph", "namespace": namespace, **fields, "at": at}
    return Event(at, namespace, "graph", fields.get("key", ""), json.dumps(body, sort_keys=True))


def hit(at: float, saved: float, **fields: Any) -> Event:
    return graph(at, result="hit", saved_seconds=saved, **fields)


def miss(at: float, compiled: float | None = None, **fields: Any) -> Event:
    """A miss; with ``compiled``, one that compiled for that long (ok unless told)."""
    if compiled is not None:
        fields = {"compile_seconds": compiled, "outcome": "ok", **fields}
    return graph(at, result="miss", source="compiler", **fields)


OLD = "2.21.18209.0+043b1bf7"  # the compiler in use
NEW = "2.22.2026.0+1a2b3c4d"  # the compiler to come


def keyed(program: int | str, version: str = OLD, **changed: Any) -> tuple[str, dict[str, Any]]:
    """A key and the components that make it, as a client publishes them: program
    ``program`` (its fingerprint) compiled by ``version``, other components changed."""
    from neffcache.keying import CompileContext, KeyInputs, compute_key

    components: dict[str, Any] = {
        "fingerprint": hashlib.sha256(f"program {program}".encode()).hexdigest(),
        "compiler_version": version,
        "target": "trn2",
        "flags": ["--model-type=transformer"],
        "env": {},
        "frameworks": {},
        **changed,
    }
    context = CompileContext.create(
        compiler_version=components["compiler_version"],
        target=components["target"],
        flags=components["flags"],
        env=components["env"],
        frameworks=components["frameworks"],
    )
    made = compute_key(KeyInputs(components["fingerprint"], context))
    return made.key, {**components, "key_version": made.components["key_version"]}
