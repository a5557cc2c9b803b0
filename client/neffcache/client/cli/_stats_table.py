"""``neffcache stats``'s table: the figures ``_stats_cmd`` gathers, laid out as
``ccache -s`` lays out its own, one figure a line, indented by what it is part of,
values aligned. The server's part is its answer (``GET /v1/status``), read
defensively: a field missing or of another type shows as ``?``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TypeGuard

Row = tuple[int, str, str]  # indent, label, value


def table(stats: Mapping[str, Any], window: float) -> str:
    rows = [*_graphs(stats["counters"]), *_l1(stats["l1"])]
    if stats["server"] is not None:
        rows += _server(stats["server"], window)
    width = max(2 * indent + len(label) for indent, label, _ in rows) + 2
    lines = [f"{'  ' * indent}{label}:".ljust(width) + f" {value}" for indent, label, value in rows]
    return "".join(line.rstrip() + "\n" for line in lines)


def _graphs(c: Mapping[str, Any]) -> list[Row]:
    graphs = c["graphs"]
    hits = c["hits_l1"] + c["hits_server"]
    rows: list[Row] = [
        (0, "Graphs", str(graphs)),
        (1, "Hits", _share(hits, graphs)),
        (2, "from L1", str(c["hits_l1"])),
        (2, "from the server", str(c["hits_server"])),
        (1, "Misses", _share(c["misses"], graphs)),
        (2, "compiled", str(c["compiles"])),
        (2, "failed to compile", str(c["compile_failures"])),
        (2, "failures replayed", str(c["failures_replayed"])),
        (1, "Fall-backs", _share(c["fallbacks"], graphs)),
        *[(2, reason, str(n)) for reason, n in c["fallback_reasons"].items()],
    ]
    if c["miss_reasons"]:
        rows.append((1, "Misses by reason", ""))
        rows += [(2, reason, str(n)) for reason, n in c["miss_reasons"].items()]
    rows += [
        (0, "Time", ""),
        (1, "fetching (hits)", _duration(c["fetch_seconds"])),
        (1, "compile time saved (hits)", _duration(c["saved_seconds"])),
        (1, "compiling (misses)", _duration(c["compile_seconds"])),
        (0, "Fetched from the server", _bytes(c["bytes_fetched"])),
        (0, "Counters", c["directory"]),
        (1, "zeroed", _when(c["zeroed_at"]) or "never"),
        (1, "updated", _when(c["updated_at"]) or "never"),
    ]
    if c["skipped_records"]:
        rows.append((1, "corrupt records skipped", str(c["skipped_records"])))
    if c["summary_lost"]:
        rows.append((1, "summary", "unreadable: counted again from the records since"))
    return rows


def _l1(l1: Mapping[str, Any]) -> list[Row]:
    limit = l1["limit_bytes"]
    size = _bytes(l1["bytes"])
    if limit is None:
        size += " (no limit)"
    else:
        size += f" / {_bytes(limit)} ({_percent(l1['bytes'], limit)})"
    rows: list[Row] = [
        (0, "L1", l1["directory"]),
        (1, "entries", f"{l1['entries']} ({l1['blobs']} blobs, {l1['stock_entries']} stock)"),
        (1, "size", size),
        (1, "free space", "?" if l1["free_bytes"] is None else _bytes(l1["free_bytes"])),
    ]
    if not l1["complete"]:
        rows.append((1, "walk", "cut short: the figures are of what it saw"))
    if not l1["writable"]:
        rows.append((1, "writable", "no: nothing is counted here"))
    return rows


def _server(server: Mapping[str, Any], window: float) -> list[Row]:
    if server["error"] is not None:
        return [(0, "Server", server["error"])]
    status = server["status"]
    facts, caller = _dict(status.get("server")), _dict(status.get("caller"))
    namespaces = caller.get("namespaces")
    covers = ", ".join(map(str, namespaces)) if isinstance(namespaces, list) else "?"
    rows: list[Row] = [
        (0, "Server", server["url"]),
        (1, "version", f"{_text(facts.get('version'))} (auth: {_text(facts.get('auth'))})"),
        (1, "token", f"{_text(caller.get('name'))}: {_text(caller.get('scope'))} on {covers}"),
    ]
    view = _dict(status.get("namespace"))
    entries, held, quota = view.get("entries"), view.get("bytes"), view.get("quota_bytes")
    lookups = _dict(view.get("lookups"))
    hits, misses = lookups.get("hits"), lookups.get("misses")
    size = _bytes(held) if _is_int(held) else "?"
    if _is_int(quota) and _is_int(held):
        size += f" / {_bytes(quota)} quota ({_percent(held, quota)})"
    rate = "?"
    if _is_int(hits) and _is_int(misses):
        rate = f"{_percent(hits, hits + misses)} ({hits} of {hits + misses} graphs)"
    rows += [
        (1, "entries", _text(entries)),
        (1, "size", size),
        (1, f"hit rate ({_duration(window)})", rate),
    ]
    return rows


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: Any) -> str:
    return "?" if value is None or isinstance(value, (dict, list)) else str(value)[:200]


def _share(part: int, whole: int) -> str:
    return f"{part} ({_percent(part, whole)})" if whole else str(part)


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "-"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 86400:.1f} d"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _when(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(stamp))
