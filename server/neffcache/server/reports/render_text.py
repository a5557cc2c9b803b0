"""The reports as text: CSV (one table, for spreadsheets) and a plain table for a
terminal. Both read the JSON the API answers with, so every format says the same."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from neffcache.server.units import human_bytes, human_seconds

FIGURE_COLUMNS = (
    "lookups",
    "hits",
    "hits_l1",
    "hits_server",
    "misses",
    "compiles",
    "failed_compiles",
    "hit_rate",
    "compile_hours_spent",
    "compile_hours_saved",
    "cost_spent",
    "cost_saved",
    "unpriced_hours_spent",
    "unpriced_hours_saved",
)
SCOPE_NOTE = (
    "Compile time only: the rest of a job's cost (training time, idle instances, storage, "
    "data transfer) is not measured here, and spent and saved are never netted."
)
UPGRADE_COLUMNS = (
    "namespace",
    "from_compiler",
    "to_compiler",
    "model",
    "graphs",
    "graphs_done",
    "compile_hours",
    "unknown_compile_time",
    "value_hours",
    "instance_type",
    "cost",
    "run",
)

# --- CSV


def cost_csv(report: dict[str, Any]) -> str:
    """One line per row of the report: its groups, its figures, then one column per
    miss reason found (``misses_<reason>``)."""
    reasons = sorted({code for row in report["rows"] for code in row["miss_reasons"]})
    header = [*report["by"], *FIGURE_COLUMNS, *(f"misses_{code}" for code in reasons)]
    lines = [header]
    for row in report["rows"]:
        cells = [row["group"][name] for name in report["by"]]
        cells += [row[column] for column in FIGURE_COLUMNS]
        cells += [row["miss_reasons"].get(code, 0) for code in reasons]
        lines.append(cells)
    return _csv(lines)


def upgrade_csv(report: dict[str, Any]) -> str:
    """One line per namespace and model of the prewarm plans, most valuable first."""
    lines: list[list[Any]] = [list(UPGRADE_COLUMNS)]
    for part in report["namespaces"]:
        for step in part["prewarm"]["models"]:
            line = {**step, "namespace": part["namespace"], "from_compiler": part["from_compiler"]}
            line["to_compiler"] = report["to_compiler"]
            lines.append([line[column] for column in UPGRADE_COLUMNS])
    return _csv(lines)


def _csv(lines: Sequence[Sequence[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for line in lines:
        writer.writerow([_inert(cell) for cell in line])
    return out.getvalue()


def _inert(cell: Any) -> Any:
    """A cell a spreadsheet shows as text: model labels and job ids come from clients,
    and one starting with ``=``, ``+``, ``-`` or ``@`` would be run as a formula
    (OWASP's CSV injection advice: a leading quote)."""
    if cell is None:
        return ""
    if isinstance(cell, str) and cell[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + cell
    return cell


# --- terminal tables


def cost_table(report: dict[str, Any]) -> str:
    by = report["by"]
    blocks = [
        f"neffcache cost report, {when(report['since'])} to {when(report['until'])}, "
        f"by {', '.join(by)}",
        _prices_line(report["prices"]),
        _totals_block(report["totals"]),
    ]
    rows = [[*(name.upper() for name in by), *_ROW_HEADER]]
    for row in report["rows"]:
        rows.append([*(_cell(row["group"][name]) for name in by), *_row_cells(row)])
    blocks.append(table(rows) if report["rows"] else "no lookups in this window")
    days = [["DAY", "LOOKUPS", "HIT RATE", "SPENT H", "SAVED H", "SPENT $", "SAVED $"]]
    for day in report["days"]:
        days.append(
            [
                day["day"],
                str(day["lookups"]),
                rate(day["hit_rate"]),
                f"{day['compile_hours_spent']:.2f}",
                f"{day['compile_hours_saved']:.2f}",
                usd(day["cost_spent"]),
                usd(day["cost_saved"]),
            ]
        )
    if report["days"]:
        blocks.append(table(days))
    blocks.append(_runs_line(report["runs"]))
    blocks.append(_misses_block(report["top_misses"]))
    blocks.append(_storage_block(report["storage"]))
    blocks += [f"note: {note}" for note in other_notes(report)]
    blocks.append(SCOPE_NOTE)
    return "\n\n".join(block for block in blocks if block) + "\n"


_ROW_HEADER = (
    "LOOKUPS",
    "HIT RATE",
    "HITS",
    "MISSES",
    "COMPILES",
    "FAILED",
    "SPENT H",
    "SPENT $",
    "SAVED H",
    "SAVED $",
)


def _row_cells(row: dict[str, Any]) -> list[str]:
    return [
        str(row["lookups"]),
        rate(row["hit_rate"]),
        str(row["hits"]),
        str(row["misses"]),
        str(row["compiles"]),
        str(row["failed_compiles"]),
        f"{row['compile_hours_spent']:.2f}",
        usd(row["cost_spent"]),
        f"{row['compile_hours_saved']:.2f}",
        usd(row["cost_saved"]),
    ]


def _prices_line(prices: dict[str, Any]) -> str:
    line = f"prices: {prices['table']} (on-demand USD per hour; docs/reports.md)"
    if prices.get("unpriced_instance_types"):
        line += f"; no price for {', '.join(prices['unpriced_instance_types'])}"
    if prices.get("events_without_instance_type"):
        line += f"; lookups naming no instance type: {prices['events_without_instance_type']}"
    return line


def _totals_block(t: dict[str, Any]) -> str:
    reasons = ", ".join(f"{code} {count}" for code, count in t["miss_reasons"].items())
    lines = [
        f"lookups {t['lookups']}: hits {t['hits']} ({t['hits_l1']} from L1, "
        f"{t['hits_server']} from the server), misses {t['misses']}, "
        f"hit rate {rate(t['hit_rate'])}",
        f"compiles {t['compiles']} ({t['failed_compiles']} failed)",
        f"compile-hours spent {t['compile_hours_spent']:.2f} "
        f"({human_seconds(t['compile_hours_spent'] * 3600)}, {usd(t['cost_spent'])}); "
        f"saved by hits {t['compile_hours_saved']:.2f} "
        f"({human_seconds(t['compile_hours_saved'] * 3600)}, {usd(t['cost_saved'])})",
        f"unpriced hours: {t['unpriced_hours_spent']:.2f} spent, "
        f"{t['unpriced_hours_saved']:.2f} saved",
    ]
    if reasons:
        lines.append(f"miss reasons: {reasons}")
    return "TOTAL\n" + "\n".join(f"  {line}" for line in lines)


def _runs_line(runs: dict[str, Any]) -> str:
    line = (
        f"RUNS  cold {runs['cold']} ({runs['cold_compile_hours']:.2f} compile-hours), "
        f"warm {runs['warm']} ({runs['warm_compile_hours']:.2f}), "
        f"mixed {runs['mixed']} ({runs['mixed_compile_hours']:.2f})"
    )
    without = runs.get("lookups_without_job", 0)
    if runs.get("job_id_hint"):
        return f"{line}\n  {runs['job_id_hint']}"
    if without:
        return f"{line}; lookups naming no job (in no run): {without}"
    return line


def other_notes(report: dict[str, Any]) -> list[str]:
    """The report's notes but the runs' hint, which is shown with the runs."""
    hint = report["runs"].get("job_id_hint")
    return [note for note in report.get("notes", []) if note != hint]


def _misses_block(misses: list[dict[str, Any]]) -> str:
    if not misses:
        return ""
    rows = [["NAMESPACE", "KEY", "MODEL", "REASON", "MISSES", "COMPILE H", "COST", "LAST"]]
    for miss in misses:
        rows.append(
            [
                miss["namespace"],
                miss["key"][:16],
                _cell(miss["model"]),
                miss["reason"],
                str(miss["misses"]),
                f"{miss['compile_hours']:.2f}",
                usd(miss["cost"]),
                when(miss["last_at"]),
            ]
        )
    return "MOST EXPENSIVE MISSES\n" + table(rows)


def _storage_block(storage: list[dict[str, Any]]) -> str:
    if not storage:
        return ""
    rows = [["NAMESPACE", "ENTRIES", "SIZE", "QUOTA"]]
    for held in storage:
        quota = held["quota_bytes"]
        rows.append(
            [
                held["namespace"],
                str(held["entries"]),
                human_bytes(held["bytes"]),
                "none" if quota is None else human_bytes(quota),
            ]
        )
    return "STORAGE\n" + table(rows)


def upgrade_table(report: dict[str, Any]) -> str:
    blocks = [
        f"neffcache upgrade report: to neuronx-cc {report['to_compiler']}",
        f"prices: {report['prices']['table']} (on-demand USD per hour; docs/reports.md)",
    ]
    rows = [
        ["NAMESPACE", "FROM", "TO REBUILD", "DONE", "COMPILE H", "COST", "UNPRICED H", "INSTANCE"]
    ]
    for part in report["namespaces"]:
        rows.append(_upgrade_cells(part["namespace"], part, part["from_compiler"]))
    rows.append(_upgrade_cells("TOTAL", report["totals"], None))
    blocks.append(table(rows))
    for part in report["namespaces"]:
        blocks.append(_plan_block(part))
        blocks += [f"note: {part['namespace']}: {note}" for note in part.get("notes", [])]
    return "\n\n".join(block for block in blocks if block) + "\n"


def _upgrade_cells(name: str, part: dict[str, Any], version: str | None) -> list[str]:
    return [
        name,
        _cell(version),
        str(part["graphs"]),
        str(part["graphs_done"]),
        f"{part['compile_hours']:.2f}",
        usd(part["cost"]),
        f"{part['unpriced_hours']:.2f}",
        _cell(part.get("instance_type")),
    ]


def _plan_block(part: dict[str, Any]) -> str:
    name = part["namespace"]
    if part["from_compiler"] is None:
        return f"{name}: no entry served within the active window: nothing to rebuild"
    if part["already_on_target"]:
        return f"{name}: already on {part['from_compiler']}: nothing to rebuild"
    done = part["graphs_done"]
    if not part["graphs"]:
        return (
            f"{name}: every graph in use of neuronx-cc {part['from_compiler']} ({done}) is "
            "built under the new version already: nothing to rebuild"
        )
    lines = [
        f"{name}: prewarm plan from neuronx-cc {part['from_compiler']}, most valuable first"
        + (f" ({graph_count(done)} built under the new version already)" if done else "")
    ]
    for number, step in enumerate(part["prewarm"]["models"], 1):
        unknown = step["unknown_compile_time"]
        lines.append(
            f"  {number}. {step['model'] or '(no model label)'}: {graph_count(step['graphs'])} "
            "to rebuild"
            + (f" ({step['graphs_done']} done)" if step["graphs_done"] else "")
            + f", {step['compile_hours']:.2f} compile-hours ({usd(step['cost'])})"
            + (f", {unknown} of unknown compile time" if unknown else "")
            + f", worth {step['value_hours']:.2f} hours of hits"
        )
        lines.append(f"     {step['run']}")
    graphs = part["prewarm"]["graphs"]
    if graphs:
        rows = [["KEY", "MODEL", "COMPILE", "HITS", "LAST USED", "VALUE H"]]
        for graph in graphs:
            seconds = graph["compile_seconds"]
            value = graph["value_hours"]
            rows.append(
                [
                    graph["key"][:16],
                    _cell(graph["model"]),
                    "?" if seconds is None else f"{seconds:.0f}s",
                    str(graph["hits"]),
                    when(graph["last_access"]),
                    "?" if value is None else f"{value:.2f}",
                ]
            )
        lines.append("  " + table(rows).replace("\n", "\n  "))
    return "\n".join(lines)


# --- cells


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    numeric = [
        all(_numeric(row[i]) for row in rows[1:]) and len(rows) > 1 for i in range(len(widths))
    ]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    stripped = cell.replace("$", "").replace(",", "").replace("%", "").replace(".", "")
    # One point at most: a version such as 2.21.1 is text.
    return (stripped.isdigit() and cell.count(".") <= 1) or cell in ("-", "?", "unpriced")


def graph_count(count: int) -> str:
    return f"{count} graph" if count == 1 else f"{count} graphs"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def usd(value: float | None) -> str:
    """Money, or ``unpriced`` when no price applied."""
    return "unpriced" if value is None else f"${value:,.2f}"


def when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%MZ")
