"""The reports as one self-contained HTML page: inline CSS and SVG, no script, no
external asset (clusters are often air-gapped, and a saved report must still open).
Every chart has its numbers in a table beside it. All text is escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from neffcache.server.reports.render_text import (
    SCOPE_NOTE,
    other_notes,
    rate,
    usd,
    when,
)
from neffcache.server.units import human_bytes

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #1b1f24; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { padding: .2em .7em; border-bottom: 1px solid #d0d7de; text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #57606a; }
svg .spent { fill: #cf222e; } svg .saved { fill: #1a7f37; }
"""


def page(title: str, body: Sequence[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def html_table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: int = 0) -> str:
    """A table; the last ``numeric`` columns are right-aligned."""
    first = len(header) - numeric

    def cells(tag: str, values: Sequence[Any]) -> str:
        return "".join(
            f"<{tag}{' class=n' if i >= first else ''}>{escape(str(v))}</{tag}>"
            for i, v in enumerate(values)
        )

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return f"<table><thead><tr>{cells('th', header)}</tr></thead><tbody>{body}</tbody></table>"


_ROW_HEADER = (
    "lookups",
    "hit rate",
    "misses",
    "compiles",
    "spent h",
    "spent $",
    "saved h",
    "saved $",
)


def cost_html(report: dict[str, Any]) -> str:
    by = report["by"]
    totals = report["totals"]
    prices = report["prices"]
    body = [
        f"<p>{escape(when(report['since']))} to {escape(when(report['until']))}, by "
        f"{escape(', '.join(by))}. Prices: {escape(prices['table'])}, on-demand USD per hour"
        + (
            f"; no price for {escape(', '.join(prices['unpriced_instance_types']))}"
            if prices["unpriced_instance_types"]
            else ""
        )
        + ".</p>",
        "<h2>Totals</h2>",
        html_table(["figure", "value"], _totals_rows(totals)),
        "<h2>Compile-hours spent and saved per day</h2>",
        _days_chart(report["days"]),
        html_table(
            ["day", "lookups", "hit rate", "spent h", "saved h", "spent $", "saved $"],
            [
                [
                    d["day"],
                    d["lookups"],
                    rate(d["hit_rate"]),
                    f"{d['compile_hours_spent']:.2f}",
                    f"{d['compile_hours_saved']:.2f}",
                    usd(d["cost_spent"]),
                    usd(d["cost_saved"]),
                ]
                for d in report["days"]
            ],
            numeric=6,
        ),
        f"<h2>By {escape(', '.join(by))}</h2>",
        html_table(
            [*by, *_ROW_HEADER],
            [
                [
                    *("-" if row["group"][n] is None else row["group"][n] for n in by),
                    row["lookups"],
                    rate(row["hit_rate"]),
                    row["misses"],
                    row["compiles"],
                    f"{row['compile_hours_spent']:.2f}",
                    usd(row["cost_spent"]),
                    f"{row['compile_hours_saved']:.2f}",
                    usd(row["cost_saved"]),
                ]
                for row in report["rows"]
            ],
            numeric=8,
        ),
        "<h2>Runs</h2>",
        html_table(
            ["run", "jobs", "compile-hours"],
            [
                [kind, report["runs"][kind], f"{report['runs'][f'{kind}_compile_hours']:.2f}"]
                for kind in ("cold", "warm", "mixed")
            ],
            numeric=2,
        ),
        _runs_note(report["runs"]),
        "<h2>Most expensive misses</h2>",
        _misses(report["top_misses"]),
        "<h2>Storage</h2>",
        html_table(
            ["namespace", "entries", "size", "quota"],
            [
                [
                    s["namespace"],
                    s["entries"],
                    human_bytes(s["bytes"]),
                    "none" if s["quota_bytes"] is None else human_bytes(s["quota_bytes"]),
                ]
                for s in report["storage"]
            ],
            numeric=3,
        ),
        *(f'<p class="note">{escape(note)}</p>' for note in other_notes(report)),
        f'<p class="note">{escape(SCOPE_NOTE)}</p>',
    ]
    return page("neffcache cost report", body)


def _runs_note(runs: dict[str, Any]) -> str:
    if runs.get("job_id_hint"):
        return f'<p class="note">{escape(runs["job_id_hint"])}</p>'
    without = runs.get("lookups_without_job", 0)
    if without:
        return f'<p class="note">Lookups naming no job (in no run): {without}.</p>'
    return ""


def _totals_rows(t: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = [
        ["lookups", t["lookups"]],
        ["hit rate", rate(t["hit_rate"])],
        ["hits (from L1, from the server)", f"{t['hits']} ({t['hits_l1']}, {t['hits_server']})"],
        ["misses", t["misses"]],
        ["compiles (failed)", f"{t['compiles']} ({t['failed_compiles']})"],
        ["compile-hours spent", f"{t['compile_hours_spent']:.2f}"],
        ["cost spent", usd(t["cost_spent"])],
        ["compile-hours saved by hits", f"{t['compile_hours_saved']:.2f}"],
        ["cost saved", usd(t["cost_saved"])],
        [
            "unpriced hours spent, saved",
            f"{t['unpriced_hours_spent']:.2f}, {t['unpriced_hours_saved']:.2f}",
        ],
    ]
    rows += [[f"misses: {code}", count] for code, count in t["miss_reasons"].items()]
    return rows


def _misses(misses: list[dict[str, Any]]) -> str:
    return html_table(
        ["namespace", "key", "model", "reason", "misses", "compile h", "cost", "last"],
        [
            [
                m["namespace"],
                m["key"],
                m["model"] or "-",
                m["reason"],
                m["misses"],
                f"{m['compile_hours']:.2f}",
                usd(m["cost"]),
                when(m["last_at"]),
            ]
            for m in misses
        ],
        numeric=0,
    )


def _days_chart(days: list[dict[str, Any]]) -> str:
    """Bars of hours spent (red) and saved (green) per day; the table below has them."""
    if not days:
        return ""
    top = max(max(d["compile_hours_spent"], d["compile_hours_saved"]) for d in days) or 1.0
    width, height, step = 24, 120, 28
    bars = []
    for i, day in enumerate(days):
        x = 40 + i * step
        for offset, name in ((0, "spent"), (width // 2, "saved")):
            value = day[f"compile_hours_{name}"]
            bar = round(height * value / top, 1)
            bars.append(
                f'<rect class="{name}" x="{x + offset}" y="{10 + height - bar}" '
                f'width="{width // 2 - 1}" height="{bar}">'
                f"<title>{escape(day['day'])}: {value:.2f} hours {name}</title></rect>"
            )
    total_width = 40 + len(days) * step
    return (
        f'<svg role="img" aria-label="compile-hours spent and saved per day" '
        f'width="{total_width}" height="{height + 30}" viewBox="0 0 {total_width} {height + 30}">'
        f'<text x="0" y="20" font-size="10">{top:.1f} h</text>' + "".join(bars) + "</svg>"
    )


def upgrade_html(report: dict[str, Any]) -> str:
    totals = report["totals"]
    body = [
        f"<p>Prices: {escape(report['prices']['table'])}, on-demand USD per hour.</p>",
        html_table(
            [
                "namespace",
                "from",
                "to rebuild",
                "done",
                "compile h",
                "cost",
                "unpriced h",
                "instance",
            ],
            [
                [
                    p["namespace"],
                    p["from_compiler"] or "-",
                    p["graphs"],
                    p["graphs_done"],
                    f"{p['compile_hours']:.2f}",
                    usd(p["cost"]),
                    f"{p['unpriced_hours']:.2f}",
                    p["instance_type"] or "-",
                ]
                for p in report["namespaces"]
            ]
            + [
                [
                    "total",
                    "",
                    totals["graphs"],
                    totals["graphs_done"],
                    f"{totals['compile_hours']:.2f}",
                    usd(totals["cost"]),
                    f"{totals['unpriced_hours']:.2f}",
                    "",
                ]
            ],
        ),
    ]
    for part in report["namespaces"]:
        body.append(f"<h2>{escape(part['namespace'])}: prewarm plan</h2>")
        body.append(
            html_table(
                ["model", "to rebuild", "done", "compile h", "cost", "value h", "what to run"],
                [
                    [
                        s["model"] or "(no model label)",
                        s["graphs"],
                        s["graphs_done"],
                        f"{s['compile_hours']:.2f}",
                        usd(s["cost"]),
                        f"{s['value_hours']:.2f}",
                        s["run"],
                    ]
                    for s in part["prewarm"]["models"]
                ],
            )
        )
        body += [f'<p class="note">{escape(note)}</p>' for note in part.get("notes", [])]
    return page(f"neffcache upgrade report: to neuronx-cc {report['to_compiler']}", body)
