"""What the ``neffcache admin`` commands print for people: tables, times, who did
something, tokens, pins with what they cover, and audit records. ``--json`` prints the
API's answer instead (``out``).

Each renderer is a function of the API's answer alone. A field an older server does not
send shows as ``?`` rather than failing: the CLI and the server it asks may be of
different releases.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from neffcache.protocol import is_hex64

from .units import human_bytes, human_seconds


def out(args: argparse.Namespace, answer: Any, text: Callable[[Any], str]) -> int:
    if args.json:
        json.dump(answer, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text(answer).rstrip("\n") + "\n")
    return 0


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


# How records name a token's holder: ``ID (NAME)`` (auth.Caller.label).
_LABEL = re.compile(r"([0-9a-f]{12}) \((.+)\)")


def who(actor: str) -> str:
    """An actor as people read it: a token's name first, then its id."""
    found = _LABEL.fullmatch(actor)
    return f"{found[2]} ({found[1]})" if found else actor


def _entries(count: int) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}"


# --- tokens


def token_text(token: dict[str, Any]) -> str:
    """One token's record; with its secret when it was just created."""
    trusted = "yes" if token.get("trusted") else "no"
    if token.get("scope") == "admin" and not token.get("trusted"):
        trusted = "yes (an admin token)"
    lines = [
        f"token id     {token.get('token_id', '?')}",
        f"name         {token.get('name') or '-'}",
        f"scope        {token.get('scope', '?')} on {', '.join(token.get('namespaces', []))}",
        f"trusted      {trusted}",
        f"created      {_when(token.get('created_at'))}",
    ]
    if token.get("revoked"):
        lines.append("revoked      yes")
    if "token" in token:
        lines.append(f"secret       {token['token']}")
        lines.append("             shown this once: the server keeps only its hash")
    return "\n".join(lines)


def tokens_text(answer: dict[str, Any]) -> str:
    tokens = answer.get("tokens", [])
    if not tokens:
        return "no tokens (protected mode: the server takes requests without one)"
    rows = [("ID", "NAME", "SCOPE", "NAMESPACES", "TRUSTED", "CREATED", "STATE")]
    for t in tokens:
        rows.append(
            (
                t.get("token_id", "?"),
                t.get("name") or "-",
                t.get("scope", "?"),
                ",".join(t.get("namespaces", [])),
                "yes" if t.get("trusted") or t.get("scope") == "admin" else "no",
                _when(t.get("created_at")),
                "revoked" if t.get("revoked") else "active",
            )
        )
    return table(rows)


def _when(stamp: Any) -> str:
    return when(stamp) if isinstance(stamp, (int, float)) else "?"


# --- pins


def pin_text(answer: dict[str, Any], namespace: str) -> str:
    """The answer to ``pin``: the pin, what it protects now, and why not more."""
    name = f"{answer.get('kind', '?')} {answer.get('value', '?')}"
    if answer.get("detail"):
        head = f"{name} is pinned already in {namespace}"
    else:
        head = f"pinned {name} in {namespace}"
    if "protects" not in answer:
        return head
    lines = [f"{head}: protects {_entries(answer['protects'])} now"]
    if answer.get("note"):
        lines.append(answer["note"])
    return "\n".join(lines)


def pins_text(answer: dict[str, Any], namespace: str) -> str:
    pins = answer.get("pins", [])
    if not pins:
        return f"no pins in {namespace}"
    rows = [("KIND", "VALUE", "PROTECTS", "SINCE", "BY", "REASON")]
    notes = []
    for p in pins:
        rows.append(
            (
                p["kind"],
                p["value"],
                _protects(p),
                _when(p.get("at")),
                who(p.get("actor", "")),
                p.get("reason", ""),
            )
        )
        if p.get("note"):
            notes.append(f"{p['kind']} {p['value']}: {p['note']}")
    return table(rows) + ("\n\n" + "\n".join(notes) if notes else "")


def _protects(pin: dict[str, Any]) -> str:
    """``3``; ``0 of 2`` when entries it matches are not protected."""
    protects, unprotected = pin.get("protects"), pin.get("unprotected") or 0
    if protects is None:
        return "?"
    return f"{protects} of {protects + unprotected}" if unprotected else str(protects)


# --- audit


def audit_text(answer: dict[str, Any]) -> str:
    if not answer["records"]:
        return "no audit records"
    rows = [("WHEN", "WHO", "ACTION", "NAMESPACE", "WHAT", "WHY")]
    for r in answer["records"]:
        rows.append(
            (
                when(r["at"]),
                who(r["actor"]),
                r["action"],
                r["namespace"] or "-",
                _short(r["target"]),
                audit_why(r["action"], r["detail"]),
            )
        )
    return table(rows)


def _short(target: str) -> str:
    return target[:16] if is_hex64(target) else target


def audit_why(action: str, detail: dict[str, Any]) -> str:
    """A record's detail in words: why an entry went, what a change set, a reason."""
    if detail.get("why"):
        return str(detail["why"])
    if action == "namespace.create":
        chosen = detail.get("set") or {}
        return ", ".join(f"{_setting(n, v)}" for n, v in chosen.items()) or "the defaults"
    if action == "namespace.set":
        old, new = detail.get("old") or {}, detail.get("new") or {}
        return ", ".join(f"{_setting(n, old.get(n))} -> {_shown(n, v)}" for n, v in new.items())
    if action == "token.create":
        made = f"{detail.get('scope', '?')} token"
        if detail.get("namespaces"):
            made += f" for {', '.join(detail['namespaces'])}"
        if detail.get("trusted"):
            made += ", trusted"
        return made + (f", named {detail['name']}" if detail.get("name") else "")
    if "reason" in detail:
        return str(detail["reason"]) or "-"
    return ", ".join(f"{k} {v}" for k, v in detail.items())


def _writers(value: Any) -> str:
    return "only trusted" if value else "any"


# Policy settings as the namespace commands show them (admincli._policy_text).
_SETTINGS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "ttl_seconds": ("ttl", human_seconds),
    "quota_bytes": ("quota", human_bytes),
    "max_entry_bytes": ("max entry", human_bytes),
    "compiler_versions": ("compiler versions kept", lambda v: "all" if v is None else str(v)),
    "failure_ttl_seconds": ("failure ttl", human_seconds),
    "read_through": ("read through", lambda v: ", ".join(v) or "none"),
    "trusted_writers_only": ("writers", _writers),
    "ranking": ("ranking", str),
}


def _setting(name: str, value: Any) -> str:
    return f"{_SETTINGS.get(name, (name, str))[0]} {_shown(name, value)}"


def _shown(name: str, value: Any) -> str:
    shown = _SETTINGS.get(name, (name, str))[1]
    try:
        return shown(value)
    except (TypeError, ValueError):  # a record older than the setting's type
        return str(value)
