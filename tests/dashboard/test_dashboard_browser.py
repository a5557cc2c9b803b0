"""The dashboard in headless Chromium against a real server seeded through
``POST /v1/events``: the numbers on the page are the report API's, shown by the rules
of ``display.py``; nothing is fetched from anywhere but the server; the console stays
clean; a server with tokens gets the token prompt. A full-page screenshot is kept."""

from __future__ import annotations

import base64
import json
import random
import re
import shlex
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dashboard import display
from dashboard.live import Clock, LiveServer, artifacts_dir, publish, report
from selenium.webdriver.common.by import By
from support.browser import open_page, state, wait_for

from neffcache.client.cli import main
from neffcache.server.explain.reasons import REASONS

pytestmark = pytest.mark.e2e

DAY = 86400.0
NAMESPACES = ("team-a", "team-b")
MODELS = ("llama-3-8b", "mixtral-8x7b", "bert-large")
# A priced type, one listed without a price, and one the table does not know.
INSTANCE_TYPES = ("trn1.32xlarge", "trn2.48xlarge", "trn1.2xlarge", "trn9.fictional")
MISS_REASONS = ("compiler-changed", "new-graph", "flags-changed", "failed-before", "evicted")
ADMIN = "nfc_dashboardtest_admin-secret"
NONE = "none in this period"  # an empty table's one cell


# --- seeding ----------------------------------------------------------------------------


def hexkey(rng: random.Random) -> str:
    return f"{rng.getrandbits(256):064x}"


def job_events(rng: random.Random, namespace: str, job: str, kind: str) -> list[dict[str, Any]]:
    """One training job's graph events: ``warm`` (all hit), ``cold`` (all missed) or
    ``mixed``."""
    common = {
        "kind": "graph",
        "namespace": namespace,
        "job_id": job,
        "host": f"ip-10-0-{rng.randrange(256)}-{rng.randrange(256)}",
        "instance_type": rng.choice(INSTANCE_TYPES),
        "model": rng.choice(MODELS),
        "via": rng.choice(("hook", "wrapper")),
        "compiler_version": "2.21.1.0",
    }
    events = []
    for i in range(rng.randrange(3, 8)):
        hit = kind == "warm" or (kind == "mixed" and i % 2 == 0)
        if hit:
            events.append(
                {
                    **common,
                    "key": hexkey(rng),
                    "result": "hit",
                    "source": rng.choice(("l1", "server", "server")),
                    "fetch_seconds": round(rng.uniform(0.05, 3.0), 3),
                    "saved_seconds": float(rng.choice((240, 900, 1800, 3600, 5400))),
                    "bytes": rng.randrange(1 << 20, 1 << 28),
                }
            )
        else:
            failed = rng.random() < 0.15
            events.append(
                {
                    **common,
                    "key": rng.choice(REPEATED_KEYS) if rng.random() < 0.4 else hexkey(rng),
                    "result": "miss",
                    "source": "compiler",
                    "reason": rng.choice(MISS_REASONS),
                    "compile_seconds": round(rng.uniform(60, 7200), 1),
                    "outcome": "failed" if failed else "ok",
                }
            )
    return events


# Graphs that miss again and again (they lead the most expensive misses).
REPEATED_KEYS = [f"{n:x}" * 64 for n in (10, 11, 12)]


def seed(server: LiveServer, clock: Clock, token: str | None = None) -> list[dict[str, Any]]:
    """Five days of jobs in both namespaces, each day's batch posted with the events
    endpoint's clock (``clock``, the one the server was built with) set to that day;
    returns every graph event sent."""
    assert server.clock is clock
    rng = random.Random(7)
    sent: list[dict[str, Any]] = []
    with server.client(token) as client:
        for days_ago in range(4, -1, -1):
            batch: list[dict[str, Any]] = []
            for namespace in NAMESPACES:
                for j in range(rng.randrange(1, 4)):
                    kind = rng.choice(("warm", "cold", "mixed", "mixed"))
                    batch += job_events(rng, namespace, f"{namespace}-d{days_ago}-j{j}", kind)
            batch[-1] = {**batch[-1], "result": "miss", "source": "compiler"}
            batch[-1]["reason"] = "made-up-reason"  # stored as sent, counted as unknown
            batch[-1].pop("saved_seconds", None)
            batch[-1].pop("fetch_seconds", None)
            batch[-1].pop("bytes", None)
            batch[-1]["compile_seconds"] = 321.0
            counters = {"kind": "counters", "namespace": "team-a", "counts": {"fallbacks": 2}}
            clock.offset = -days_ago * DAY
            posted = client.post("/v1/events", json={"events": [*batch, counters]})
            assert posted.status_code == 202, posted.text
            assert posted.json() == {"accepted": len(batch) + 1}
            sent += batch
        clock.offset = 0.0
        for namespace, quota in (("team-a", 64 * 1024), ("team-b", None)):
            made = client.post(f"/v1/admin/namespaces/{namespace}", json={"quota_bytes": quota})
            assert made.status_code == 201, made.text
        for i, size in enumerate((5000, 12000, 700, 30000)):
            publish(client, NAMESPACES[i % 2], f"{i + 1:x}" * 64, bytes([i]) * size)
    return sent


# --- reading the page -------------------------------------------------------------------


def auth(driver: Any) -> str | None:
    """What the page last read of the server's auth mode (``GET /v1/status``)."""
    value: str | None = driver.execute_script("return document.body.dataset.auth || null")
    return value


def text(driver: Any, element_id: str) -> str:
    value: str = driver.execute_script(
        "return document.getElementById(arguments[0]).textContent.trim()", element_id
    )
    return value


def table(driver: Any, element_id: str) -> list[list[str]]:
    rows: list[list[str]] = driver.execute_script(
        "return [...document.getElementById(arguments[0]).tBodies[0].rows]"
        ".map(r => [...r.cells].map(c => c.textContent.trim()))",
        element_id,
    )
    return rows


# --- what the page must show, from the API's numbers -------------------------------------


def totals_shown(r: dict[str, Any]) -> dict[str, str]:
    t, currency = r["totals"], r["currency"]
    return {
        "total-hit-rate": display.rate(t["hit_rate"]),
        "total-lookups": display.count(t["lookups"]),
        "total-hits": f"{display.count(t['hits'])}: {display.count(t['hits_l1'])} · "
        f"{display.count(t['hits_server'])}",
        "total-misses": display.count(t["misses"]),
        "total-saved": display.hours(t["compile_hours_saved"]),
        "total-spent": display.hours(t["compile_hours_spent"]),
        "total-cost-saved": display.money(t["cost_saved"], currency),
        "total-cost-spent": display.money(t["cost_spent"], currency),
        "total-compiles": f"{display.count(t['compiles'])} "
        f"({display.count(t['failed_compiles'])} failed)",
        "total-runs": " · ".join(display.count(r["runs"][k]) for k in ("warm", "mixed", "cold")),
    }


def day_tables(r: dict[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    days = sorted(r["days"], key=lambda d: d["day"])
    rates = [
        [
            d["day"],
            display.count(d["lookups"]),
            display.count(d["hits"]),
            display.count(d["misses"]),
            display.rate(d["hit_rate"]),
        ]
        for d in days
    ]
    hours = [
        [
            d["day"],
            display.hours(d["compile_hours_saved"]),
            display.hours(d["compile_hours_spent"]),
            display.count(d["compiles"]),
            display.count(d["failed_compiles"]),
        ]
        for d in days
    ]
    return rates, hours


def group_table(r: dict[str, Any], field: str, currency: str) -> list[list[str]]:
    """The most lookups first, ties by label, ten at most (``topGroups``)."""

    def label(row: dict[str, Any]) -> str:
        value = row["group"][field]
        return "(none)" if value in (None, "") else str(value)

    rows = sorted(r["rows"], key=lambda row: (-row["lookups"], label(row)))[:10]
    return [
        [
            label(row),
            display.count(row["lookups"]),
            display.rate(row["hit_rate"]),
            display.hours(row["compile_hours_saved"]),
            display.hours(row["compile_hours_spent"]),
            display.money(row["cost_saved"], currency),
        ]
        for row in rows
    ]


def reasons_table(r: dict[str, Any]) -> list[list[str]]:
    counts = r["totals"]["miss_reasons"]
    whole = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [
        [
            code,
            REASONS.get(code, "not a known reason code"),
            display.count(n),
            display.share(n, whole),
        ]
        for code, n in ordered
    ]


def storage_table(r: dict[str, Any]) -> list[list[str]]:
    return [
        [
            s["namespace"],
            display.count(s["entries"]),
            display.size(s["bytes"]),
            "none" if s["quota_bytes"] is None else display.size(s["quota_bytes"]),
            "n/a" if s["quota_bytes"] is None else display.share(s["bytes"], s["quota_bytes"]),
        ]
        for s in sorted(r["storage"], key=lambda s: s["namespace"])
    ]


def misses_table(r: dict[str, Any]) -> list[list[str]]:
    return [
        [
            m["namespace"],
            "(none)" if m["model"] in (None, "") else m["model"],
            m["key"][:16] + "…",
            m["reason"],
            display.count(m["misses"]),
            display.hours(m["compile_hours"]),
            display.money(m["cost"], r["currency"]),
            display.when(m["last_at"]),
        ]
        for m in r["top_misses"]
    ]


def assert_page_shows(driver: Any, server: LiveServer, period: str, token: str | None) -> None:
    by_day = report(server, "day", period, token)
    by_namespace = report(server, "namespace", period, token)
    by_model = report(server, "model", period, token)
    currency = by_day["currency"]
    assert {k: text(driver, k) for k in totals_shown(by_day)} == totals_shown(by_day)
    rates, hours = day_tables(by_day)
    expected = {
        "hit-rate-table": rates,
        "hours-table": hours,
        "namespaces-table": group_table(by_namespace, "namespace", currency),
        "models-table": group_table(by_model, "model", currency),
        "reasons-table": reasons_table(by_day),
        "storage-table": storage_table(by_day),
        "misses-table": misses_table(by_day),
    }
    for table_id, rows in expected.items():
        empty = "no namespace holds entries" if table_id == "storage-table" else NONE
        assert table(driver, table_id) == (rows or [[empty]]), table_id
    keys = driver.execute_script(
        "return [...document.querySelectorAll('#misses-table tbody code')].map(c => c.title)"
    )
    assert keys == [m["key"] for m in by_day["top_misses"]]
    assert by_day["prices"]["table"] in text(driver, "prices")


# --- the browser's own records -----------------------------------------------------------


def requested_urls(driver: Any) -> list[str]:
    """Every URL the browser asked for since the log was last read (DevTools' network
    events: scripts, styles, images, fetches, the page itself)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def console_problems(driver: Any, allowed: tuple[str, ...] = ()) -> list[str]:
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] in ("SEVERE", "WARNING")
        and not any(text in entry["message"] for text in allowed)
    ]


def png_facts(data: bytes) -> tuple[int, int, int]:
    """Width, height and the number of distinct byte values of the decoded image data."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def full_page_screenshot(driver: Any, path: Path) -> bytes:
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    data = base64.b64decode(shot["data"])
    path.write_bytes(data)
    return data


# --- tests -------------------------------------------------------------------------------


@pytest.fixture
def seeded(live_server: Callable[..., LiveServer], events_clock: Clock) -> Any:
    server = live_server()
    return server, seed(server, events_clock)


def test_the_page_shows_the_report_apis_numbers(browser: Any, seeded: Any) -> None:
    server, sent = seeded
    open_page(browser, server.url + "/")
    # Protected mode: no token asked for, none kept.
    assert not browser.find_element(By.ID, "token-panel").is_displayed()
    assert not browser.find_element(By.ID, "forget-token").is_displayed()

    # The seed is in the report: the comparisons below compare real figures.
    by_day = report(server, "day")
    assert by_day["totals"]["lookups"] == len(sent)
    assert by_day["totals"]["hits"] == sum(e["result"] == "hit" for e in sent)
    assert by_day["totals"]["failed_compiles"] == sum(e.get("outcome") == "failed" for e in sent)
    spent = sum(e.get("compile_seconds", 0.0) for e in sent if e["result"] == "miss")
    assert by_day["totals"]["compile_hours_spent"] == pytest.approx(spent / 3600, abs=1e-5)
    assert sum(d["lookups"] > 0 for d in by_day["days"]) == 5
    assert by_day["totals"]["miss_reasons"]["unknown"] >= 5
    assert by_day["totals"]["cost_saved"] > 0
    assert by_day["totals"]["unpriced_hours_spent"] > 0
    assert {s["namespace"] for s in by_day["storage"]} >= set(NAMESPACES)
    assert len(by_day["top_misses"]) == 10

    assert_page_shows(browser, server, "7d", None)
    shown = {
        "hit rate": text(browser, "total-hit-rate"),
        "top namespace": table(browser, "namespaces-table")[0][0],
        "a miss reason": table(browser, "misses-table")[0][3],
        "storage": table(browser, "storage-table")[0],
    }
    assert shown["hit rate"] == display.rate(by_day["totals"]["hit_rate"]) != "n/a"
    assert shown["top namespace"] in NAMESPACES
    assert shown["a miss reason"] in REASONS
    assert shown["storage"][0] == "team-a"
    assert shown["storage"][3] == "64.0 KiB"

    # Each chart is drawn, labelled, with one mark per day or group.
    charts = browser.execute_script(
        "return [...document.querySelectorAll('.chart svg')].map(s => ({"
        "id: s.parentNode.id, role: s.getAttribute('role'),"
        "title: s.querySelector('title').textContent,"
        "desc: s.querySelector('desc').textContent,"
        "labelled: s.getAttribute('aria-labelledby').split(' ').every("
        "  i => document.getElementById(i) !== null),"
        "dots: s.querySelectorAll('circle').length, bars: s.querySelectorAll('rect.bar').length}))"
    )
    by_id = {c["id"]: c for c in charts}
    assert sorted(by_id) == sorted(
        f"{n}-chart" for n in ("hit-rate", "hours", "namespaces", "models", "reasons", "storage")
    )
    for chart in charts:
        assert chart["role"] == "img"
        assert chart["title"]
        assert chart["desc"]
        assert chart["labelled"]
    assert by_id["hit-rate-chart"]["dots"] == 5
    assert by_id["hours-chart"]["bars"] == 2 * len(by_day["days"])
    assert by_id["reasons-chart"]["bars"] == len(by_day["totals"]["miss_reasons"])

    # The seeded week, kept for people to look at.
    path = artifacts_dir() / "dashboard.png"
    data = full_page_screenshot(browser, path)
    width, height, values = png_facts(data)
    assert len(data) > 30_000
    assert width >= 1000
    assert height > 1500  # the whole page, not the window
    assert values > 100  # charts and text, not a blank page

    # Another period: the page asks again and shows that period's numbers.
    browser.find_element(By.CSS_SELECTOR, 'input[name="period"][value="30d"]').find_element(
        By.XPATH, ".."
    ).click()
    wait_for(
        browser,
        lambda: (
            state(browser) == "ready"
            and browser.execute_script("return document.body.dataset.period") == "30d"
        ),
        "the 30-day report was not shown",
    )
    assert browser.current_url.endswith("#30d")
    assert_page_shows(browser, server, "30d", None)
    assert len(table(browser, "hit-rate-table")) == len(report(server, "day", "30d")["days"])

    # Nothing came from or went anywhere but the server.
    urls = requested_urls(browser)
    assert f"{server.url}/v1/reports/cost?since=30d&by=day&top=10&format=json" in urls
    assert [u for u in urls if not u.startswith(server.url + "/")] == []
    resources = browser.execute_script(
        "return [...document.querySelectorAll('script[src], link[href]')]"
        ".map(e => e.src || e.href)"
        ".concat(performance.getEntriesByType('resource').map(e => e.name))"
    )
    assert resources
    assert [u for u in resources if not u.startswith(server.url + "/")] == []
    assert console_problems(browser) == []


def test_an_empty_server_and_the_display_rules(
    browser: Any, live_server: Callable[..., LiveServer]
) -> None:
    """Nothing reported yet: every panel says so. And the page's formatting functions
    give what ``display.py`` gives on edge cases (ties, unit steps, minutes)."""
    server = live_server()
    open_page(browser, server.url + "/#90d")
    by_day = report(server, "day", "90d")
    assert by_day["totals"]["lookups"] == 0
    assert_page_shows(browser, server, "90d", None)
    assert text(browser, "total-hit-rate") == "n/a"
    assert table(browser, "misses-table") == [[NONE]]
    for chart in ("hit-rate", "hours", "namespaces", "models", "reasons"):
        assert "in this period." in text(browser, f"{chart}-chart"), chart
    assert browser.execute_script("return document.querySelectorAll('.chart svg').length") == 0
    assert console_problems(browser) == []

    cases: dict[str, list[Any]] = {
        "rate": [0, 1, 0.5, 0.00125, 0.285, 2 / 3, 0.99949, 0.9995, None],
        "hours": [0, 0.005, 0.125, 2.675, 1 / 3, 1234567.891, 999.995],
        "bytes": [0, 1, 1023, 1024, 1536, 1048575, 1048576, 5 * 2**30 + 1, 3 * 2**50, 2**61],
        "time": [0, 1764547200.9999, 1764547259.9996, 1764547199.9999],
    }
    python = {
        "rate": display.rate,
        "hours": display.hours,
        "bytes": display.size,
        "time": display.when,
    }
    for name, values in cases.items():
        shown = browser.execute_script(
            "return arguments[1].map(v => window.neffcacheFormat[arguments[0]](v))", name, values
        )
        assert shown == [python[name](v) for v in values], name
    money = [0, 0.005, 0.125, 1234.565, 1e6 / 3, None]
    for currency in ("USD", "EUR"):
        shown = browser.execute_script(
            "return arguments[0].map(v => window.neffcacheFormat.money(v, arguments[1]))",
            money,
            currency,
        )
        assert shown == [display.money(v, currency) for v in money]
    shares = [[1, 3], [1, 8], [0, 5], [5, 0], [70000, 65536]]
    shown = browser.execute_script(
        "return arguments[0].map(([p, w]) => window.neffcacheFormat.share(p, w))", shares
    )
    assert shown == [display.share(p, w) for p, w in shares]
    assert display.hours(0.125) == "0.13 h"  # a tie goes up, unlike Python's format

    # The server goes away: the page says so above the last figures, which stay.
    server.stop()
    browser.find_element(By.ID, "refresh-now").click()
    wait_for(browser, lambda: state(browser) == "error", "a failed refresh was not shown")
    assert text(browser, "problem").startswith("Could not load the report:")
    assert browser.find_element(By.ID, "problem").is_displayed()
    assert browser.find_element(By.ID, "report").is_displayed()
    assert text(browser, "status") == "Not updated."


def test_a_server_with_tokens_asks_for_one(
    browser: Any, live_server: Callable[..., LiveServer], events_clock: Clock
) -> None:
    server = live_server(bootstrap_admin_token=ADMIN)
    seed(server, events_clock, ADMIN)
    with server.client(ADMIN) as admin:
        made = admin.post(
            "/v1/admin/tokens", json={"scope": "read", "namespaces": ["team-a"], "name": "viewer"}
        )
        assert made.status_code == 201, made.text
        viewer = made.json()["token"]

    open_page(browser, server.url + "/", want="token")
    assert not browser.find_element(By.ID, "report").is_displayed()
    assert browser.find_element(By.ID, "token-panel").is_displayed()
    assert "needs a token" in text(browser, "token-message")

    def give(token: str) -> None:
        field = browser.find_element(By.ID, "token-input")
        field.clear()
        field.send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()

    give("nfc_000000000000_not-a-real-secret")
    wait_for(
        browser,
        lambda: "refused" in text(browser, "token-message") and state(browser) == "token",
        "a wrong token was not said to be refused",
    )
    assert "unknown or revoked token" in text(browser, "token-message")
    stored = "return sessionStorage.getItem('neffcache.dashboard.token')"
    assert browser.execute_script(stored) is None

    give(viewer)
    wait_for(browser, lambda: state(browser) == "ready", "the right token was not taken")
    assert browser.execute_script(stored) == viewer
    assert browser.find_element(By.ID, "forget-token").is_displayed()
    assert_page_shows(browser, server, "7d", viewer)
    # The viewer reads team-a only, and the page shows what its token covers.
    assert [row[0] for row in table(browser, "namespaces-table")] == ["team-a"]
    everything = report(server, "day", token=ADMIN)["totals"]["lookups"]
    assert report(server, "day", token=viewer)["totals"]["lookups"] < everything

    browser.refresh()  # the tab keeps the token
    wait_for(browser, lambda: state(browser) == "ready", "the kept token was not used")
    browser.find_element(By.ID, "forget-token").click()
    wait_for(browser, lambda: state(browser) == "token", "forgetting the token did not ask again")
    assert browser.execute_script(stored) is None
    # Only the refusals the test asked for reached the console.
    assert console_problems(browser, allowed=("status of 401",)) == []
    assert [u for u in requested_urls(browser) if not u.startswith(server.url + "/")] == []


def test_a_server_without_tokens_warns_until_one_exists(
    browser: Any,
    live_server: Callable[..., LiveServer],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Protected mode: the page says anyone on the host is an admin and shows the
    command that ends it. Run as shown, the command makes a token; from then on the
    warning is gone, while the page asks for a token and once it has one."""
    for name in ("NEFFCACHE_ADMIN_TOKEN", "NEFFCACHE_TOKEN", "NEFFCACHE_SERVER"):
        monkeypatch.delenv(name, raising=False)
    server = live_server()
    open_page(browser, server.url + "/")
    wait_for(browser, lambda: auth(browser) == "open", "the server's auth mode was not read")
    assert browser.find_element(By.ID, "open-warning").is_displayed()
    assert "has no token" in text(browser, "open-warning")
    assert "admin rights" in text(browser, "open-warning")
    command = text(browser, "open-command")
    assert command == (
        f"neffcache admin token create --server {server.url} --scope admin --namespace '*'"
    )

    assert main(shlex.split(command)[1:]) == 0
    # The command as shown prints the token for a person: its secret on its own line.
    (admin,) = re.findall(r"^secret +(\S+)$", capsys.readouterr().out, re.MULTILINE)
    browser.refresh()
    wait_for(browser, lambda: state(browser) == "token", "the page did not ask for a token")
    wait_for(browser, lambda: auth(browser) == "tokens", "the server's auth mode was not read")
    assert not browser.find_element(By.ID, "open-warning").is_displayed()
    field = browser.find_element(By.ID, "token-input")
    field.send_keys(admin)
    browser.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    wait_for(browser, lambda: state(browser) == "ready", "the admin token was not taken")
    wait_for(browser, lambda: auth(browser) == "tokens", "the server's auth mode was not read")
    assert not browser.find_element(By.ID, "open-warning").is_displayed()
    assert f"{server.url}/v1/status" in requested_urls(browser)
    assert console_problems(browser, allowed=("status of 401",)) == []


# Labels a client may send (any printable text): shown as text, never run or loaded.
HOSTILE = (
    '<img src=x onerror="window.__xss=1">',
    "</script><script>window.__xss=2</script>",
    '"><svg onload="window.__xss=3">',
)


def test_hundreds_of_namespaces_and_hostile_labels(
    browser: Any, live_server: Callable[..., LiveServer]
) -> None:
    """Storage: the chart draws the ten fullest namespaces with a quota and the ten
    largest without one, the table lists them all.
    Model labels and instance types come from any client: the page shows them as
    text, and nothing in them runs or loads."""
    server = live_server()
    count = 120
    with server.client() as client:
        events = [
            {
                "kind": "graph",
                "namespace": f"ns-{i:03d}",
                "result": "miss",
                "source": "compiler",
                "key": f"{i:064x}",
                "reason": "new-graph",
                "compile_seconds": 60.0 + i,
                "model": HOSTILE[i % len(HOSTILE)],
                "instance_type": HOSTILE[0] if i == 0 else "trn1.32xlarge",
            }
            for i in range(count)
        ]
        assert client.post("/v1/events", json={"events": events}).status_code == 202
        for i in range(count):
            publish(client, f"ns-{i:03d}", f"{i + 4096:064x}", bytes([i]) * (100 + i))
        # Ten over or near their quota; the rest have none.
        for i in range(40, 50):
            quota = {"quota_bytes": 100 + (i % 5) * 20}
            made = client.post(f"/v1/admin/namespaces/ns-{i:03d}", json=quota)
            assert made.status_code == 201, made.text
    open_page(browser, server.url + "/")

    by_day = report(server, "day")
    assert len(by_day["storage"]) >= count
    assert table(browser, "storage-table") == storage_table(by_day)  # every namespace
    assert text(browser, "storage-count") == display.count(len(by_day["storage"]))
    charted = browser.execute_script(
        "return [...document.querySelectorAll('#storage-chart svg text.end')]"
        ".map(t => t.querySelector('title').textContent)"
    )
    fullest = sorted(
        (s for s in by_day["storage"] if s["quota_bytes"] is not None),
        key=lambda s: (-s["bytes"] / s["quota_bytes"], s["namespace"]),
    )
    largest = sorted(
        (s for s in by_day["storage"] if s["quota_bytes"] is None),
        key=lambda s: (-s["bytes"], s["namespace"]),
    )
    assert len(largest) > 10
    assert charted == [s["namespace"] for s in fullest[:10] + largest[:10]]
    assert (
        browser.execute_script("return document.querySelectorAll('#storage-chart rect.bar').length")
        == 20
    )

    models = [row[0] for row in table(browser, "models-table")]
    assert sorted(models) == sorted(HOSTILE)
    assert {row[1] for row in table(browser, "misses-table")} <= set(HOSTILE)
    assert HOSTILE[0] in text(browser, "prices")  # an unpriced instance type, as text
    assert browser.execute_script("return document.images.length") == 0
    assert browser.execute_script("return document.querySelectorAll('main script').length") == 0
    assert browser.execute_script("return window.__xss === undefined")
    assert console_problems(browser) == []
