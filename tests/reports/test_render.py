"""CSV, the terminal table and the HTML page say what the JSON says."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from reports.support import DAY, HOUR, hit, key, miss, utc

from neffcache.server.reports.cost import CostReport
from neffcache.server.reports.prices import load_prices
from neffcache.server.reports.render_html import cost_html, upgrade_html
from neffcache.server.reports.render_text import cost_csv, cost_table, upgrade_csv, upgrade_table

T0 = utc("2026-11-30T10:00:00")
NASTY = '<script>alert("x")</script>'
STORAGE = [{"namespace": "team-a", "entries": 3, "bytes": 3 * 2**30, "quota_bytes": 2**40}]


def cost(by: tuple[str, ...] = ("namespace", "model")) -> dict[str, Any]:
    made = CostReport(T0 - DAY, T0 + HOUR, by, load_prices(None), 5)
    made.add_all(
        [
            hit(T0, HOUR, source="l1", model="llama", instance_type="trn1.32xlarge", job_id="j"),
            miss(T0, 2 * HOUR, key=key(1), model=NASTY, reason="new-graph", job_id="k"),
            miss(T0, HOUR, key=key(2), model="llama", instance_type="trn1.32xlarge"),
        ]
    )
    answer: dict[str, Any] = made.result(STORAGE, generated_at=T0 + HOUR)
    return answer


def upgrade() -> dict[str, Any]:
    step = {
        "model": "llama",
        "graphs": 2,
        "graphs_done": 1,
        "compile_hours": 1.5,
        "unknown_compile_time": 0,
        "value_hours": 9.0,
        "instance_type": "trn1.32xlarge",
        "cost": 32.25,
        "run": "with neuronx-cc 2.22.0 installed: NEFFCACHE_URL=neffcache+http://h:1/team-a ...",
    }
    graph = {
        "key": key(1),
        "model": "llama",
        "compile_seconds": 3600.0,
        "hits": 9,
        "last_access": T0,
        "value_hours": 9.0,
    }
    part = {
        "namespace": "team-a",
        "from_compiler": "2.21.1",
        "already_on_target": False,
        "graphs": 2,
        "graphs_done": 1,
        "compile_hours": 1.5,
        "unknown_compile_time": 0,
        "cost": 32.25,
        "unpriced_hours": 0.0,
        "instance_type": "trn1.32xlarge",
        "prewarm": {"models": [step], "graphs": [graph]},
    }
    names = ("graphs", "graphs_done", "compile_hours", "unknown_compile_time", "cost")
    totals = {k: part[k] for k in names}
    return {
        "to_compiler": "2.22.0",
        "namespaces": [part],
        "totals": {**totals, "unpriced_hours": 0.0},
        "prices": {"table": "shipped 2026-12-01"},
    }


def test_cost_csv_has_one_line_per_row_with_groups_figures_and_reasons() -> None:
    report = cost()
    lines = list(csv.DictReader(io.StringIO(cost_csv(report))))
    assert len(lines) == len(report["rows"]) == 2
    first = lines[0]
    assert (first["namespace"], first["model"]) == ("team-a", NASTY)
    assert first["compile_hours_spent"] == "2.0"
    assert first["cost_spent"] == ""  # unpriced: empty, not 0
    assert first["misses_new-graph"] == "1"
    assert lines[1]["cost_saved"] == "21.5"


def test_cost_table_shows_totals_rows_runs_misses_and_storage() -> None:
    text = cost_table(cost())
    assert text.startswith("neffcache cost report, 2026-11-29 10:00Z to 2026-11-30 11:00Z")
    assert "hits 1 (1 from L1, 0 from the server), misses 2, hit rate 33.3%" in text
    assert "compile-hours spent 3.00 (3h, $21.50); saved by hits 1.00 (1h, $21.50)" in text
    assert re.search(r"team-a\s+llama\s+2\s+50\.0%", text)
    assert "RUNS  cold 1 (2.00 compile-hours), warm 1 (0.00), mixed 0 (0.00)" in text
    assert key(1)[:16] in text
    assert re.search(r"team-a\s+3\s+3\.0 GiB\s+1\.0 TiB", text)
    assert "Compile time only" in text


def test_without_job_ids_the_table_and_the_page_say_how_to_set_one_once() -> None:
    made = CostReport(T0 - DAY, T0 + HOUR, ("namespace",), load_prices(None), 5)
    made.add_all([hit(T0, HOUR), miss(T0, HOUR, key=key(1))])
    report = made.result([], generated_at=T0 + HOUR)
    hint = report["runs"]["job_id_hint"]
    text = cost_table(report)
    assert f"RUNS  cold 0 (0.00 compile-hours), warm 0 (0.00), mixed 0 (0.00)\n  {hint}" in text
    assert text.count("NEFFCACHE_JOB_ID") == 1
    page = cost_html(report)
    assert page.count("NEFFCACHE_JOB_ID") == 1
    assert page.index("NEFFCACHE_JOB_ID") < page.index("Most expensive misses")


def test_lookups_without_a_job_beside_runs_are_counted_in_the_runs_line() -> None:
    text = cost_table(cost())
    assert "mixed 0 (0.00); lookups naming no job (in no run): 1" in text
    assert "NEFFCACHE_JOB_ID" not in text
    assert "Lookups naming no job (in no run): 1." in cost_html(cost())


def test_cost_html_is_self_contained_and_escapes_what_clients_sent() -> None:
    page = cost_html(cost())
    assert page.startswith("<!DOCTYPE html>")
    assert NASTY not in page
    assert "&lt;script&gt;" in page
    # No script, and nothing fetched from anywhere.
    assert "<script" not in page
    assert not re.search(r"(src|href)\s*=", page)
    assert "<svg" in page
    assert "3.0 GiB" in page


def test_upgrade_renderings_carry_the_plan() -> None:
    report = upgrade()
    lines = list(csv.DictReader(io.StringIO(upgrade_csv(report))))
    assert lines == [
        {
            "namespace": "team-a",
            "from_compiler": "2.21.1",
            "to_compiler": "2.22.0",
            "model": "llama",
            "graphs": "2",
            "graphs_done": "1",
            "compile_hours": "1.5",
            "unknown_compile_time": "0",
            "value_hours": "9.0",
            "instance_type": "trn1.32xlarge",
            "cost": "32.25",
            "run": report["namespaces"][0]["prewarm"]["models"][0]["run"],
        }
    ]
    text = upgrade_table(report)
    assert "neffcache upgrade report: to neuronx-cc 2.22.0" in text
    assert re.search(r"TO REBUILD\s+DONE", text)
    assert re.search(r"team-a\s+2\.21\.1\s+2\s+1\s+1\.50\s+\$32\.25", text)
    assert "most valuable first (1 graph built under the new version already)" in text
    assert "1. llama: 2 graphs to rebuild (1 done), 1.50 compile-hours ($32.25)" in text
    assert "NEFFCACHE_URL=neffcache+http://h:1/team-a" in text
    page = upgrade_html(report)
    assert "<script" not in page
    assert "2.21.1" in page
    assert "<th class=n>done</th>" in page or "<th>done</th>" in page


def test_an_upgrade_with_every_graph_built_says_nothing_is_left() -> None:
    report = upgrade()
    part = report["namespaces"][0]
    part.update(graphs=0, graphs_done=3, compile_hours=0.0, cost=0.0)
    part["prewarm"] = {"models": [], "graphs": []}
    text = upgrade_table(report)
    assert "every graph in use of neuronx-cc 2.21.1 (3) is built under the new version" in text


def test_csv_cells_from_clients_are_never_formulas() -> None:
    from neffcache.server.reports.render_text import _csv

    text = _csv([["model", "hours"], ['=HYPERLINK("http://x")', -1.5], ["@SUM(A1)", 2]])
    assert text.splitlines() == [
        "model,hours",
        '"\'=HYPERLINK(""http://x"")",-1.5',
        "'@SUM(A1),2",
    ]
