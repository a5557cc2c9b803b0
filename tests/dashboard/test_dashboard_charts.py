"""The dashboard's charts in headless Chromium: a value axis never repeats a label,
whatever its range; and every namespace in the storage chart has a bar that shows,
a quota or none."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from dashboard import display
from dashboard.live import Clock, LiveServer, publish, report
from support.browser import open_page

pytestmark = pytest.mark.e2e

DAY = 86400.0
LEAST_BAR = 2.0  # dashboard.js: the narrowest bar for a value above zero


def label_values(labels: list[str], unit: str = "") -> list[Decimal]:
    """The numbers the axis labels show (commas and the unit dropped), exactly."""
    values = []
    for label in labels:
        assert label.endswith(unit), label
        values.append(Decimal(label.removesuffix(unit).replace(",", "")))
    return values


def assert_axis(labels: list[str], largest: float, unit: str = "") -> None:
    values = label_values(labels, unit)
    assert len(set(labels)) == len(labels), labels
    assert values == sorted(set(values)), labels  # ascending, so no two alike
    assert values[0] == 0, labels
    # Up to the largest value (the millionth for smaller ones), within a float's error.
    assert float(values[-1]) >= max(largest, 1e-6) * (1 - 1e-12), (labels, largest)
    assert 3 <= len(labels) <= 6, labels
    steps = {b - a for a, b in itertools.pairwise(values)}
    assert len(steps) == 1, labels  # evenly spaced: the gridlines are a scale


@pytest.fixture
def page(browser: Any, live_server: Callable[..., LiveServer]) -> Any:
    server = live_server()
    open_page(browser, server.url + "/")
    return browser


def test_axis_labels_are_distinct_and_ascending_over_many_ranges(page: Any) -> None:
    """The hours axis for any largest value: from 0 up past it, evenly spaced, every
    label different (labels rounded to the same text once repeated ``0.01 h``)."""
    rng = random.Random(11)
    largest = [0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.1, 0.2, 0.5, 1.0, 2.5]
    largest += [5.0, 10.0, 99.99, 100.0, 1234.5, 1e-9, 3e-7, 1e6 / 3, 1e9]
    largest += [10 ** rng.uniform(-7, 9) for _ in range(3000)]
    axes = page.execute_script(
        "const c = window.neffcacheCharts;"
        "return arguments[0].map(m => { const t = c.ticks(m);"
        "  return t.values.map(v => c.tickLabel(v, t.decimals)); });",
        largest,
    )
    for value, labels in zip(largest, axes, strict=True):
        assert_axis(labels, value)
    # The values of the report that repeated a label: steps of 0.005 h.
    assert axes[5] == ["0", "0.005", "0.01", "0.015", "0.02"]


def test_small_compile_hours_get_an_axis_without_repeated_labels(
    browser: Any, live_server: Callable[..., LiveServer], events_clock: Clock
) -> None:
    """A week of a few seconds' compiles (0.004 to 0.02 h a day), as drawn."""
    server = live_server()  # its events stamped by events_clock
    assert server.clock is events_clock
    seconds = (14.4, 36.0, 72.0, 18.0)  # 0.004, 0.01, 0.02, 0.005 hours
    with server.client() as client:
        for days_ago, spent in enumerate(seconds):
            events_clock.offset = -days_ago * DAY
            event = {
                "kind": "graph",
                "namespace": "team-a",
                "result": "miss",
                "source": "compiler",
                "key": f"{days_ago + 1:064x}",
                "reason": "new-graph",
                "compile_seconds": spent,
            }
            assert client.post("/v1/events", json={"events": [event]}).status_code == 202
    events_clock.offset = 0.0
    open_page(browser, server.url + "/")
    spent_hours = [d["compile_hours_spent"] for d in report(server, "day")["days"]]
    assert max(spent_hours) == pytest.approx(0.02)
    labels = browser.execute_script(
        "return [...document.querySelectorAll('#hours-chart svg text.tick.end')]"
        ".map(t => t.textContent)"
    )
    assert_axis(labels, max(spent_hours), " h")
    assert labels.count("0.01 h") == 1
    # The bars stand on that axis: the tallest reaches its top, none goes past it.
    heights = browser.execute_script(
        "return [...document.querySelectorAll('#hours-chart rect.bar.spent')]"
        ".map(r => Number(r.getAttribute('height')))"
    )
    assert max(heights) > 0
    grid = browser.execute_script(
        "const ys = [...document.querySelectorAll('#hours-chart line.grid')]"
        ".map(l => Number(l.getAttribute('y1'))); return Math.max(...ys) - Math.min(...ys);"
    )
    assert max(heights) == pytest.approx(grid)


def storage_bars(driver: Any) -> list[dict[str, Any]]:
    """Each charted namespace: its name, its bar's width, the track's (0 without one),
    the text at the bar's end."""
    rows: list[dict[str, Any]] = driver.execute_script(
        "const svg = document.querySelector('#storage-chart svg');"
        "const at = (sel) => [...svg.querySelectorAll(sel)];"
        "const names = at('text.end').map(t => t.querySelector('title').textContent);"
        "const bars = at('rect.bar');"
        "const ends = at('text.tick:not(.end):not(.heading)').map(t => t.textContent);"
        "return names.map((name, i) => { const y = Number(bars[i].getAttribute('y'));"
        "  const track = at('rect.track').find(r => Number(r.getAttribute('y')) === y);"
        "  return {name: name, width: Number(bars[i].getAttribute('width')),"
        "    cls: bars[i].getAttribute('class'),"
        "    track: track ? Number(track.getAttribute('width')) : 0, end: ends[i]}; });"
    )
    return rows


def test_namespaces_without_a_quota_have_bars_that_show(
    browser: Any, live_server: Callable[..., LiveServer]
) -> None:
    """A namespace without a quota beside one with a 1 TiB quota: once its bar was
    scaled to that quota and drew no wider than a hair. Now the largest without a
    quota spans the chart, the others are in proportion and at least visible, and each
    says its bytes and "no quota"."""
    server = live_server()
    sizes = {"capped": 5000, "open-big": 30000, "open-small": 10, "open-mid": 12000}
    with server.client() as client:
        made = client.post("/v1/admin/namespaces/capped", json={"quota_bytes": 1 << 40})
        assert made.status_code == 201, made.text
        for i, (namespace, size) in enumerate(sizes.items()):
            publish(client, namespace, f"{i + 1:x}" * 64, bytes([i]) * size)
    open_page(browser, server.url + "/")

    bars = {row["name"]: row for row in storage_bars(browser)}
    assert list(bars) == ["capped", "open-big", "open-mid", "open-small"]
    inner = bars["capped"]["track"]
    assert inner > 300
    assert bars["capped"]["width"] == pytest.approx(LEAST_BAR)  # 5000 B of 1 TiB, still seen
    assert bars["capped"]["end"] == f"{display.size(5000)} of {display.size(1 << 40)}"
    assert bars["open-big"]["width"] == pytest.approx(inner)
    assert bars["open-mid"]["width"] == pytest.approx(inner * 12000 / 30000)
    assert bars["open-small"]["width"] == pytest.approx(LEAST_BAR)
    for name in ("open-big", "open-mid", "open-small"):
        assert bars[name]["track"] == 0, name
        assert bars[name]["cls"] == "bar used", name
        assert bars[name]["end"] == f"{display.size(sizes[name])}, no quota", name
    headings = browser.execute_script(
        "return [...document.querySelectorAll('#storage-chart text.heading')]"
        ".map(t => t.textContent)"
    )
    assert headings == [
        "With a quota: the share of it used",
        "Without a quota: against the largest of these",
    ]
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []


def test_the_storage_chart_keeps_namespaces_without_a_quota_among_many(page: Any) -> None:
    """Whatever the mix, the chart holds the ten fullest namespaces with a quota and
    the ten largest without one, each bar on its own group's scale."""
    rng = random.Random(5)
    for _ in range(40):
        storage = [
            {
                "namespace": f"ns-{i:03d}",
                "entries": 1,
                "bytes": rng.choice((0, 1, rng.randrange(1, 1 << 40))),
                "quota_bytes": rng.choice((None, rng.randrange(1, 1 << 41))),
            }
            for i in range(rng.randrange(1, 40))
        ]
        rows = page.execute_script(
            "return window.neffcacheCharts.storageRows(arguments[0])"
            ".map(r => r.heading !== undefined ? {heading: r.heading}"
            "  : {name: r.label, max: r.max, track: r.track, least: r.least})",
            storage,
        )
        quota = [s for s in storage if s["quota_bytes"] is not None]
        none = [s for s in storage if s["quota_bytes"] is None]
        fullest = sorted(quota, key=lambda s: (-s["bytes"] / s["quota_bytes"], s["namespace"]))
        largest = sorted(none, key=lambda s: (-s["bytes"], s["namespace"]))[:10]
        charted = [r["name"] for r in rows if "name" in r]
        assert charted == [s["namespace"] for s in fullest[:10] + largest]
        biggest = max((s["bytes"] for s in largest), default=0)
        by_name = {s["namespace"]: s for s in storage}
        for row in rows:
            if "name" not in row:
                continue
            held = by_name[row["name"]]
            assert row["least"] is True
            if held["quota_bytes"] is None:
                assert (row["max"], row["track"]) == (biggest, False)
            else:
                assert (row["max"], row["track"]) == (held["quota_bytes"], True)
        assert len(rows) - len(charted) == bool(quota) + bool(none)  # one heading per group
