// The neffcache dashboard: three calls to GET /v1/reports/cost (by=day, by=namespace,
// by=model) drawn as SVG charts, each with a table holding the same numbers; and
// GET /v1/status, for a warning while the server has no token.
// Plain script, no build step and nothing fetched from elsewhere: clusters are often
// air-gapped, and the server's Content-Security-Policy allows only its own origin.
//
// Every number shown is one field of the report, or one of these rules applied to
// fields (docs/dashboard.md; tests/dashboard/ repeats them in Python):
//   counts       integers, commas between thousands                    1,234
//   rates        field x 100, one decimal                              87.5%
//   hours        two decimals                                          12.35 h
//   money        two decimals; "$" for USD, else the currency after    $1,234.56
//   bytes        1024-based units, one decimal (bytes below 1 KiB)     1.5 GiB
//   shares       part / whole x 100, one decimal                       12.5%
//   times        the epoch seconds as UTC, to the minute               2026-11-30 14:02 UTC
//   axes         0 up to a multiple of 1, 2 or 5 x 10^n, each label     0, 0.005, 0.01 h
//                with the decimals its step needs (ticks below)
// Decimals are JavaScript's toFixed: the exact binary value rounded to nearest, a
// tie (a value exactly halfway) rounded away from zero. A null field shows "n/a".
"use strict";

(function () {
  const PERIODS = ["7d", "30d", "90d"];
  const REFRESH_MS = 60000;
  const TOKEN_KEY = "neffcache.dashboard.token";
  const TOP = 10;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const REASONS = JSON.parse(document.getElementById("reasons").textContent);

  const state = { period: "7d", generation: 0, loading: false, showing: "loading", last: null };

  // --- formatting ---------------------------------------------------------------

  function grouped(text) {
    const [whole, fraction] = text.split(".");
    const withCommas = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    return fraction === undefined ? withCommas : withCommas + "." + fraction;
  }

  const fmt = {
    count: (n) => grouped(String(n)),
    rate: (r) => (r === null || r === undefined ? "n/a" : (r * 100).toFixed(1) + "%"),
    hours: (h) => grouped(h.toFixed(2)) + " h",
    money(x, currency) {
      if (x === null || x === undefined) return "n/a";
      const amount = grouped(x.toFixed(2));
      return currency === "USD" ? "$" + amount : amount + " " + currency;
    },
    bytes(n) {
      const units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
      if (n < 1024) return grouped(String(n)) + " B";
      let value = n / 1024;
      let unit = 0;
      while (value >= 1024 && unit < units.length - 1) {
        value /= 1024;
        unit += 1;
      }
      return value.toFixed(1) + " " + units[unit];
    },
    share: (part, whole) => (whole > 0 ? ((part / whole) * 100).toFixed(1) + "%" : "n/a"),
    time: (epoch) => new Date(epoch * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC",
  };

  // --- the report API -------------------------------------------------------------

  class Refused extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  async function detailOf(response) {
    try {
      const body = await response.json();
      if (body && typeof body.detail === "string") return body.detail;
    } catch (_) {
      // Not JSON (a proxy's page, say): the status line says enough.
    }
    return response.status + " " + response.statusText;
  }

  function asked() {
    // The options of every request to the API: the tab's token, if it holds one.
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    return { headers: headers, cache: "no-store", credentials: "omit" };
  }

  async function report(by) {
    const query = new URLSearchParams({ since: state.period, by: by, top: String(TOP), format: "json" });
    const response = await fetch("/v1/reports/cost?" + query, asked());
    if (response.status === 401 || response.status === 403) {
      throw new Refused(response.status, await detailOf(response));
    }
    if (!response.ok) throw new Error("the report API answered " + (await detailOf(response)));
    return response.json();
  }

  // --- DOM helpers ----------------------------------------------------------------

  function $(id) {
    return document.getElementById(id);
  }

  function html(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    for (const child of children) node.append(child);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    for (const child of children) node.append(child);
    return node;
  }

  function fillTable(id, rows, numeric) {
    // numeric: the indexes of right-aligned columns.
    const body = $(id).tBodies[0];
    body.replaceChildren();
    if (rows.length === 0) {
      const columns = $(id).tHead.rows[0].cells.length;
      const empty = $(id).dataset.empty || "none in this period";
      body.append(html("tr", { class: "empty" }, html("td", { colspan: String(columns) }, empty)));
      return;
    }
    for (const cells of rows) {
      const tr = html("tr");
      cells.forEach((cell, i) => {
        const tag = i === 0 ? "th" : "td";
        const attrs = i === 0 ? { scope: "row" } : {};
        if (numeric.includes(i)) attrs.class = "num";
        tr.append(html(tag, attrs, cell));
      });
      body.append(tr);
    }
  }

  // --- charts ---------------------------------------------------------------------

  let chartCount = 0;

  function frame(width, height, title, description) {
    chartCount += 1;
    const titleId = "chart-title-" + chartCount;
    const descId = "chart-desc-" + chartCount;
    return svg(
      "svg",
      { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-labelledby": `${titleId} ${descId}`, class: "plot" },
      svg("title", { id: titleId }, title),
      svg("desc", { id: descId }, description),
    );
  }

  // A value axis from 0 to at least ``max``: ticks at multiples of a step of 1, 2 or 5
  // times a power of ten, at most MAX_INTERVALS of them. Each label has the decimals
  // the step needs (trailing zeros dropped), so no two labels read the same: a step
  // of 0.005 is labelled 0, 0.005, 0.01, never 0.01 twice.
  const MAX_INTERVALS = 5;

  function ticks(max) {
    // Hours below a millionth (3.6 ms) are drawn on the millionth's axis: toFixed
    // takes at most 100 decimals, and no compile is that short.
    const top = max > 0 && Number.isFinite(max) ? Math.max(max, 1e-6) : 1;
    let exponent = Math.floor(Math.log10(top / MAX_INTERVALS));
    for (;;) {
      for (const m of [1, 2, 5]) {
        const step = scaled(m, exponent);
        const count = Math.ceil(top / step - 1e-9);
        if (count <= MAX_INTERVALS) {
          const values = Array.from({ length: count + 1 }, (_, i) => scaled(i * m, exponent));
          return { values: values, decimals: Math.max(0, -exponent), top: values[count] };
        }
      }
      exponent += 1;
    }
  }

  function scaled(n, exponent) {
    // n x 10^exponent, divided rather than multiplied for negative exponents: 3 / 10
    // is the double nearest 0.3, where 3 * 0.1 is not.
    return exponent < 0 ? n / Math.pow(10, -exponent) : n * Math.pow(10, exponent);
  }

  function tickLabel(value, decimals) {
    const text = value.toFixed(decimals);
    return grouped(decimals > 0 ? text.replace(/\.?0+$/, "") : text);
  }

  function place(id, chart) {
    $(id).replaceChildren(chart);
  }

  function emptyChart(id, text) {
    $(id).replaceChildren(html("p", { class: "empty" }, text));
  }

  // Charts are drawn at their box's width in pixels (again on a resize), so text keeps
  // its size whatever the window.
  const PLOT = { width: 720, height: 240, left: 56, right: 16, top: 28, bottom: 32 };

  function widthOf(id) {
    return Math.max(320, Math.round($(id).clientWidth || 720));
  }

  function xPositions(count) {
    const inner = PLOT.width - PLOT.left - PLOT.right;
    const band = inner / count;
    return Array.from({ length: count }, (_, i) => PLOT.left + band * (i + 0.5));
  }

  function yScale(max) {
    const inner = PLOT.height - PLOT.top - PLOT.bottom;
    return (v) => PLOT.top + inner * (1 - v / max);
  }

  function axes(chart, days, xs, max, marks) {
    // marks: [value, label] for each horizontal grid line, from 0 to max.
    const y = yScale(max);
    for (const [v, label] of marks) {
      chart.append(svg("line", { x1: PLOT.left, x2: PLOT.width - PLOT.right, y1: y(v), y2: y(v), class: "grid" }));
      chart.append(svg("text", { x: PLOT.left - 6, y: y(v) + 4, class: "tick end" }, label));
    }
    const fit = Math.max(2, Math.floor((PLOT.width - PLOT.left - PLOT.right) / 56));
    const every = Math.ceil(days.length / fit);
    days.forEach((day, i) => {
      if (i % every !== 0) return;
      chart.append(svg("text", { x: xs[i], y: PLOT.height - 10, class: "tick middle" }, day.slice(5)));
    });
  }

  function hitRateChart(days) {
    if (!days.some((d) => d.lookups > 0)) return emptyChart("hit-rate-chart", "No lookups in this period.");
    PLOT.width = widthOf("hit-rate-chart");
    const chart = frame(PLOT.width, PLOT.height, "Hit rate per day", "Daily hit rate in percent; the table below lists the same values.");
    const xs = xPositions(days.length);
    const y = yScale(1);
    const quarters = [0, 25, 50, 75, 100].map((p) => [p / 100, p + "%"]);
    axes(chart, days.map((d) => d.day), xs, 1, quarters);
    let path = "";
    let pen = "M";
    days.forEach((d, i) => {
      if (d.hit_rate === null) {
        pen = "M"; // a day without lookups leaves a gap
        return;
      }
      path += `${pen}${xs[i].toFixed(1)},${y(d.hit_rate).toFixed(1)} `;
      pen = "L";
    });
    chart.append(svg("path", { d: path.trim(), class: "line hit" }));
    days.forEach((d, i) => {
      if (d.hit_rate === null) return;
      const dot = svg("circle", { cx: xs[i], cy: y(d.hit_rate), r: 4, class: "dot hit" });
      dot.append(svg("title", {}, `${d.day}: ${fmt.rate(d.hit_rate)} of ${fmt.count(d.lookups)} lookups`));
      chart.append(dot);
    });
    place("hit-rate-chart", chart);
  }

  function legend(chart, entries) {
    let x = PLOT.width - PLOT.right;
    for (const [label, cls] of entries.slice().reverse()) {
      const width = 16 + label.length * 7;
      x -= width + 12;
      chart.append(svg("rect", { x: x, y: 6, width: 10, height: 10, class: "swatch " + cls }));
      chart.append(svg("text", { x: x + 14, y: 15, class: "tick" }, label));
    }
  }

  function hoursChart(days) {
    const any = days.some((d) => d.compile_hours_saved > 0 || d.compile_hours_spent > 0);
    if (!any) return emptyChart("hours-chart", "No compile-hours saved or spent in this period.");
    PLOT.width = widthOf("hours-chart");
    const chart = frame(PLOT.width, PLOT.height, "Compile-hours saved and spent per day", "Two bars per day: hours saved by hits and hours spent compiling; the table below lists the same values.");
    const xs = xPositions(days.length);
    const scale = ticks(Math.max(...days.map((d) => Math.max(d.compile_hours_saved, d.compile_hours_spent))));
    const max = scale.top;
    const y = yScale(max);
    const marks = scale.values.map((v) => [v, tickLabel(v, scale.decimals) + " h"]);
    axes(chart, days.map((d) => d.day), xs, max, marks);
    const band = (PLOT.width - PLOT.left - PLOT.right) / days.length;
    const width = Math.max(2, Math.min(22, band * 0.36));
    days.forEach((d, i) => {
      for (const [value, cls, offset, what] of [
        [d.compile_hours_saved, "saved", -width, "saved"],
        [d.compile_hours_spent, "spent", 0, "spent"],
      ]) {
        const bar = svg("rect", { x: xs[i] + offset, y: y(value), width: width, height: y(0) - y(value), class: "bar " + cls });
        bar.append(svg("title", {}, `${d.day}: ${fmt.hours(value)} ${what}`));
        chart.append(bar);
      }
    });
    legend(chart, [["saved", "saved"], ["spent", "spent"]]);
    place("hours-chart", chart);
  }

  const ROW = 26;

  function rowLabel(chart, text, y) {
    const shown = text.length > 22 ? text.slice(0, 21) + "…" : text;
    const label = svg("text", { x: 150, y: y + 15, class: "tick end" }, shown);
    label.append(svg("title", {}, text));
    chart.append(label);
  }

  // The narrowest bar drawn for a value above zero: a namespace holding a few bytes
  // beside one holding terabytes still shows a bar.
  const LEAST_BAR = 2;

  function barRows(id, rows, title, description, segments, end, empty = "Nothing in this period.") {
    // rows: {label, parts: [numbers], max, track?, classes?, least?} (least: each part
    // above zero is at least LEAST_BAR wide), or {heading} for a line of text above a
    // group; segments: the css classes of the parts, unless a row has its own.
    if (rows.length === 0) return emptyChart(id, empty);
    const width = widthOf(id);
    const height = rows.length * ROW + 34;
    const chart = frame(width, height, title, description);
    const left = 158;
    const inner = width - left - 150;
    rows.forEach((row, i) => {
      const y = 28 + i * ROW;
      if (row.heading !== undefined) {
        chart.append(svg("text", { x: 8, y: y + 15, class: "tick heading" }, row.heading));
        return;
      }
      rowLabel(chart, row.label, y);
      if (row.track) chart.append(svg("rect", { x: left, y: y + 3, width: inner, height: ROW - 8, class: "track" }));
      let x = left;
      row.parts.forEach((value, k) => {
        let w = row.max > 0 ? (Math.min(value, row.max) / row.max) * inner : 0;
        if (row.least && value > 0) w = Math.max(w, LEAST_BAR);
        const cls = (row.classes || segments)[k];
        chart.append(svg("rect", { x: x, y: y + 3, width: Math.max(0, w), height: ROW - 8, class: "bar " + cls }));
        x += w;
      });
      chart.append(svg("text", { x: left + inner + 6, y: y + 15, class: "tick" }, end(row)));
    });
    place(id, chart);
  }

  // --- panels ---------------------------------------------------------------------

  function dayRows(dayReport) {
    const days = dayReport.days && dayReport.days.length
      ? dayReport.days
      : dayReport.rows.map((r) => Object.assign({ day: r.group.day }, r));
    return days.slice().sort((a, b) => (a.day < b.day ? -1 : a.day > b.day ? 1 : 0));
  }

  function topGroups(groupReport, field) {
    // The most lookups first; a tie by name, so the order never flickers between refreshes.
    const label = (r) => (r.group[field] === null || r.group[field] === undefined || r.group[field] === "" ? "(none)" : String(r.group[field]));
    return groupReport.rows
      .map((r) => Object.assign({ label: label(r) }, r))
      .sort((a, b) => b.lookups - a.lookups || (a.label < b.label ? -1 : a.label > b.label ? 1 : 0))
      .slice(0, TOP);
  }

  function priceNote(r) {
    // The hourly prices as the table lists them (not rounded), then what had none.
    const t = r.totals;
    const applied = Object.entries(r.prices.applied || {}).map(
      ([type, p]) => `${type} $${p.usd_per_hour} an hour` + (p.listed ? ` (as listed on ${p.listed})` : ""),
    );
    let note = `Prices: ${r.prices.table}` + (applied.length ? `; ${applied.join(", ")}.` : ".");
    if (t.unpriced_hours_saved + t.unpriced_hours_spent > 0) {
      note += ` Not priced: ${fmt.hours(t.unpriced_hours_saved)} saved and ${fmt.hours(t.unpriced_hours_spent)} spent`;
      const sources = r.prices.unpriced_instance_types.slice();
      if (r.prices.events_without_instance_type) sources.push("events naming no instance type");
      note += sources.length ? `: ${sources.join(", ")}.` : ".";
    }
    for (const extra of r.notes || []) note += ` Note: ${extra}.`;
    return note;
  }

  function renderTotals(r) {
    const t = r.totals;
    $("total-hit-rate").textContent = fmt.rate(t.hit_rate);
    $("total-lookups").textContent = fmt.count(t.lookups);
    $("total-hits").textContent = `${fmt.count(t.hits)}: ${fmt.count(t.hits_l1)} · ${fmt.count(t.hits_server)}`;
    $("total-misses").textContent = fmt.count(t.misses);
    $("total-saved").textContent = fmt.hours(t.compile_hours_saved);
    $("total-spent").textContent = fmt.hours(t.compile_hours_spent);
    $("total-cost-saved").textContent = fmt.money(t.cost_saved, r.currency);
    $("total-cost-spent").textContent = fmt.money(t.cost_spent, r.currency);
    $("total-compiles").textContent = `${fmt.count(t.compiles)} (${fmt.count(t.failed_compiles)} failed)`;
    $("total-runs").textContent = `${fmt.count(r.runs.warm)} · ${fmt.count(r.runs.mixed)} · ${fmt.count(r.runs.cold)}`;
    $("prices").textContent = priceNote(r);
  }

  function renderDays(days) {
    hitRateChart(days);
    hoursChart(days);
    fillTable("hit-rate-table", days.map((d) => [d.day, fmt.count(d.lookups), fmt.count(d.hits), fmt.count(d.misses), fmt.rate(d.hit_rate)]), [1, 2, 3, 4]);
    fillTable("hours-table", days.map((d) => [d.day, fmt.hours(d.compile_hours_saved), fmt.hours(d.compile_hours_spent), fmt.count(d.compiles), fmt.count(d.failed_compiles)]), [1, 2, 3, 4]);
  }

  function renderGroups(kind, rows, currency) {
    const max = Math.max(0, ...rows.map((r) => r.lookups));
    barRows(
      kind + "-chart",
      rows.map((r) => ({ label: r.label, parts: [r.hits, r.misses], max: max, lookups: r.lookups, rate: r.hit_rate })),
      kind === "namespaces" ? "Lookups by namespace" : "Lookups by model",
      "Each bar: hits, then misses; the table beside lists the same values.",
      ["hit", "miss"],
      (row) => `${fmt.count(row.lookups)} (${fmt.rate(row.rate)})`,
    );
    fillTable(kind + "-table", rows.map((r) => [r.label, fmt.count(r.lookups), fmt.rate(r.hit_rate), fmt.hours(r.compile_hours_saved), fmt.hours(r.compile_hours_spent), fmt.money(r.cost_saved, currency)]), [1, 2, 3, 4, 5]);
  }

  function renderReasons(missReasons) {
    const entries = Object.entries(missReasons).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
    const whole = entries.reduce((sum, [, n]) => sum + n, 0);
    const max = Math.max(0, ...entries.map(([, n]) => n));
    barRows(
      "reasons-chart",
      entries.map(([code, n]) => ({ label: code, parts: [n], max: max, n: n })),
      "Misses by reason",
      "One bar per reason code; the table below lists the same values.",
      ["miss"],
      (row) => `${fmt.count(row.n)} (${fmt.share(row.n, whole)})`,
    );
    fillTable("reasons-table", entries.map(([code, n]) => [code, REASONS[code] || "not a known reason code", fmt.count(n), fmt.share(n, whole)]), [2, 3]);
  }

  function storageEnd(s) {
    if (s.quota_bytes === null) return `${fmt.bytes(s.bytes)}, no quota`;
    return `${fmt.bytes(s.bytes)} of ${fmt.bytes(s.quota_bytes)}`;
  }

  function byName(a, b) {
    return a.namespace < b.namespace ? -1 : a.namespace > b.namespace ? 1 : 0;
  }

  function storageGroups(storage) {
    // The chart's namespaces (a server may have hundreds; the table lists them all):
    // the ten with the largest share of their quota, and apart from them the ten
    // holding the most bytes without one; ties by name.
    const share = (s) => s.bytes / Math.max(s.quota_bytes, 1);
    const quota = storage.filter((s) => s.quota_bytes !== null);
    const none = storage.filter((s) => s.quota_bytes === null);
    return {
      quota: quota.sort((a, b) => share(b) - share(a) || byName(a, b)).slice(0, TOP),
      none: none.sort((a, b) => b.bytes - a.bytes || byName(a, b)).slice(0, TOP),
    };
  }

  function storageRows(storage) {
    // With a quota, a bar on a track as long as the quota (red past it). Without one
    // there is nothing to measure against but the others: bars scaled to the largest
    // namespace without a quota shown.
    const groups = storageGroups(storage);
    const largest = Math.max(0, ...groups.none.map((s) => s.bytes));
    const rows = [];
    if (groups.quota.length) rows.push({ heading: "With a quota: the share of it used" });
    for (const s of groups.quota) {
      const over = s.bytes > s.quota_bytes;
      rows.push({ label: s.namespace, parts: [s.bytes], max: s.quota_bytes, track: true, classes: [over ? "over" : "used"], least: true, s: s });
    }
    if (groups.none.length) rows.push({ heading: "Without a quota: against the largest of these" });
    for (const s of groups.none) {
      rows.push({ label: s.namespace, parts: [s.bytes], max: largest, track: false, classes: ["used"], least: true, s: s });
    }
    return rows;
  }

  function renderStorage(storage) {
    const all = storage.slice().sort(byName);
    $("storage-count").textContent = fmt.count(all.length);
    barRows(
      "storage-chart",
      storageRows(storage),
      "Storage by namespace",
      "One bar per namespace: with a quota, bytes held on a track as long as the quota; without one, bytes held against the largest such namespace shown. The table below lists the same values.",
      ["used"],
      (row) => storageEnd(row.s),
      "No namespace holds entries.",
    );
    fillTable("storage-table", all.map((s) => [
      s.namespace,
      fmt.count(s.entries),
      fmt.bytes(s.bytes),
      s.quota_bytes === null ? "none" : fmt.bytes(s.quota_bytes),
      s.quota_bytes === null ? "n/a" : fmt.share(s.bytes, s.quota_bytes),
    ]), [1, 2, 3, 4]);
  }

  function keyCell(key) {
    const code = html("code", { title: key }, key.slice(0, 16) + "…");
    return code;
  }

  function reasonCell(code) {
    return html("span", { title: REASONS[code] || "not a known reason code", class: "reason" }, code);
  }

  function renderMisses(misses, currency) {
    const body = $("misses-table").tBodies[0];
    fillTable("misses-table", misses.map((m) => [
      m.namespace,
      m.model === null || m.model === "" ? "(none)" : m.model,
      "",
      "",
      fmt.count(m.misses),
      fmt.hours(m.compile_hours),
      fmt.money(m.cost, currency),
      fmt.time(m.last_at),
    ]), [4, 5, 6]);
    // Key and reason are elements (a title with the whole key, the reason's meaning).
    misses.forEach((m, i) => {
      body.rows[i].cells[2].replaceChildren(keyCell(m.key));
      body.rows[i].cells[3].replaceChildren(reasonCell(m.reason));
    });
  }

  function render(byDay, byNamespace, byModel) {
    renderTotals(byDay);
    renderDays(dayRows(byDay));
    renderGroups("namespaces", topGroups(byNamespace, "namespace"), byDay.currency);
    renderGroups("models", topGroups(byModel, "model"), byDay.currency);
    renderReasons(byDay.totals.miss_reasons);
    renderStorage(byDay.storage);
    renderMisses(byDay.top_misses, byDay.currency);
  }

  // --- loading, the token, refreshing --------------------------------------------

  function show(what, message) {
    state.showing = what;
    document.body.dataset.state = what;
    // After an error the last figures stay, under the error.
    $("report").hidden = !(what === "ready" || (what === "error" && state.last));
    $("token-panel").hidden = what !== "token";
    $("problem").hidden = what !== "error";
    $("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY);
    if (what === "token") $("token-message").textContent = message;
    if (what === "error") $("problem").textContent = message;
  }

  function refused(error) {
    const hadToken = Boolean(sessionStorage.getItem(TOKEN_KEY));
    // A refused token is forgotten, so the next refresh does not send it again.
    sessionStorage.removeItem(TOKEN_KEY);
    let message;
    if (!hadToken) message = "This server needs a token to show its reports. Paste a read token for the namespaces you want to see.";
    else if (error.status === 401) message = `The server refused the token: ${error.message}. Paste another one.`;
    else message = `This token may not read these reports: ${error.message}. Paste another one.`;
    show("token", message);
    $("status").textContent = "Waiting for a token.";
    $("token-input").focus();
  }

  async function load() {
    state.generation += 1;
    const generation = state.generation;
    state.loading = true;
    document.body.dataset.state = "loading";
    $("status").textContent = "Loading…";
    checkOpen(generation);
    try {
      const [byDay, byNamespace, byModel] = await Promise.all([report("day"), report("namespace"), report("model")]);
      if (generation !== state.generation) return;
      show("ready"); // first: a hidden box has no width to draw in
      state.last = [byDay, byNamespace, byModel];
      render(byDay, byNamespace, byModel);
      document.body.dataset.generatedAt = String(byDay.generated_at);
      document.body.dataset.period = state.period;
      $("status").textContent = `Last ${state.period.replace("d", " days")}, updated ${fmt.time(byDay.generated_at)}.`;
    } catch (error) {
      if (generation !== state.generation) return;
      if (error instanceof Refused) refused(error);
      else {
        show("error", `Could not load the report: ${error.message}`);
        $("status").textContent = "Not updated.";
      }
    } finally {
      if (generation === state.generation) state.loading = false;
    }
  }

  // A server without tokens (protected mode) takes anyone who reaches it on its host
  // for an admin: warn above everything while /v1/status says "open". With tokens it
  // says "tokens", or refuses a tab without one (only a server with tokens refuses).
  // When it cannot tell, the warning stays as it was (the report's error says why).
  async function checkOpen(generation) {
    let auth;
    try {
      const response = await fetch("/v1/status", asked());
      if (response.ok) auth = (await response.json()).server.auth;
      else if (response.status === 401 || response.status === 403) auth = "tokens";
      else return;
    } catch (_) {
      return;
    }
    if (generation !== state.generation) return;
    document.body.dataset.auth = auth;
    $("open-warning").hidden = auth !== "open";
  }

  function tick() {
    const wanted = $("auto-refresh").checked && document.visibilityState === "visible";
    if (wanted && !state.loading && state.showing !== "token") load();
  }

  function start() {
    // Anonymous callers are admins until the first token exists, so this needs none;
    // the page's own address is the server's, as the browser reaches it.
    $("open-command").textContent =
      `neffcache admin token create --server ${location.origin} --scope admin --namespace '*'`;
    const fromHash = location.hash.replace(/^#/, "");
    if (PERIODS.includes(fromHash)) state.period = fromHash;
    for (const radio of document.querySelectorAll('input[name="period"]')) {
      radio.checked = radio.value === state.period;
      radio.addEventListener("change", () => {
        state.period = radio.value;
        history.replaceState(null, "", "#" + state.period);
        load();
      });
    }
    $("controls").addEventListener("submit", (event) => event.preventDefault());
    $("refresh-now").addEventListener("click", load);
    $("forget-token").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      load();
    });
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token-input").value.trim();
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      $("token-input").value = "";
      load();
    });
    let resizing = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizing);
      resizing = setTimeout(() => {
        if (state.showing === "ready" && state.last) render(...state.last);
      }, 150);
    });
    setInterval(tick, REFRESH_MS);
    load();
  }

  // For the tests, which check these rules against their own copy of them, and the
  // axes' and the storage chart's choices over many inputs.
  window.neffcacheFormat = Object.freeze(fmt);
  window.neffcacheCharts = Object.freeze({ ticks: ticks, tickLabel: tickLabel, storageRows: storageRows });
  start();
})();
