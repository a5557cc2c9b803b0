"""The cost report's arithmetic, on events built by hand, against figures computed by
hand (trn1.32xlarge at the shipped $21.50 an hour, trn1.2xlarge at $1.34375)."""

from __future__ import annotations

from typing import Any

import pytest
from reports.support import DAY, HOUR, graph, hit, key, miss, utc

from neffcache.server.index.base import Event
from neffcache.server.reports import cost as cost_module
from neffcache.server.reports.cost import CostReport
from neffcache.server.reports.prices import load_prices

T0 = utc("2026-11-30T10:00:00")
BIG = "trn1.32xlarge"  # $21.50 / hour
SMALL = "trn1.2xlarge"  # $1.34375 / hour


def report(
    events: list[Event],
    by: tuple[str, ...] = ("namespace",),
    since: float = T0 - DAY,
    until: float = T0 + DAY,
    top: int = 10,
    **limits: Any,
) -> dict[str, Any]:
    made = CostReport(since, until, by, load_prices(None), top, **limits)
    made.add_all(events)
    answer: dict[str, Any] = made.result([], generated_at=until)
    return answer


def test_hits_are_credited_with_saved_seconds_and_misses_cost_their_compiles() -> None:
    events = [
        hit(T0, HOUR, source="l1", instance_type=BIG),
        hit(T0 + 1, 1800, source="server", instance_type=BIG),
        miss(T0 + 2, 2 * HOUR, instance_type=BIG, reason="compiler-changed"),
        # A failed compile is spent all the same.
        miss(T0 + 3, 900, outcome="failed", instance_type=BIG, reason="failed-before"),
        # A miss that never compiled; a code outside the vocabulary counts as unknown.
        miss(T0 + 4, instance_type=BIG, reason="made-up-code"),
    ]
    totals = report(events)["totals"]
    assert totals == {
        "lookups": 5,
        "hits": 2,
        "hits_l1": 1,
        "hits_server": 1,
        "misses": 3,
        "compiles": 2,
        "failed_compiles": 1,
        "hit_rate": 0.4,
        "compile_hours_spent": 2.25,
        "compile_hours_saved": 1.5,
        "cost_spent": pytest.approx(2.25 * 21.5),  # 48.375
        "cost_saved": pytest.approx(1.5 * 21.5),  # 32.25
        "unpriced_hours_spent": 0.0,
        "unpriced_hours_saved": 0.0,
        "miss_reasons": {"compiler-changed": 1, "failed-before": 1, "unknown": 1},
    }


def test_each_event_is_priced_at_its_own_instance_type() -> None:
    events = [
        miss(T0, HOUR, instance_type=BIG),
        miss(T0 + 1, HOUR, instance_type=SMALL),
        hit(T0 + 2, 2 * HOUR, instance_type=SMALL),
    ]
    totals = report(events)["totals"]
    assert totals["cost_spent"] == pytest.approx(21.5 + 1.34375)
    assert totals["cost_saved"] == pytest.approx(2 * 1.34375)


def test_unknown_and_unpriced_instance_types_are_reported_as_unpriced_hours() -> None:
    events = [
        miss(T0, HOUR, instance_type="x9.huge"),  # not in the table
        miss(T0 + 1, HOUR, instance_type="trn2.48xlarge"),  # listed, without a price
        hit(T0 + 2, 1800),  # no instance type at all
    ]
    answer = report(events)
    totals = answer["totals"]
    # Nothing had a price: the money is unknown, not zero.
    assert totals["cost_spent"] is None
    assert totals["cost_saved"] is None
    assert totals["unpriced_hours_spent"] == 2.0
    assert totals["unpriced_hours_saved"] == 0.5
    assert totals["compile_hours_spent"] == 2.0
    prices = answer["prices"]
    assert prices["unpriced_instance_types"] == ["trn2.48xlarge", "x9.huge"]
    assert prices["events_without_instance_type"] == 1
    assert prices["table"].startswith("shipped 2026-")


def test_partly_priced_money_is_the_priced_part_with_the_rest_counted_apart() -> None:
    events = [miss(T0, HOUR, instance_type=BIG), miss(T0 + 1, 3 * HOUR, instance_type="x9.huge")]
    totals = report(events)["totals"]
    assert totals["cost_spent"] == pytest.approx(21.5)
    assert totals["unpriced_hours_spent"] == 3.0
    assert totals["compile_hours_spent"] == 4.0
    applied = report(events)["prices"]["applied"]
    assert list(applied) == [BIG]
    assert applied[BIG]["usd_per_hour"] == 21.5


def test_an_empty_window_has_no_hit_rate_and_costs_nothing() -> None:
    answer = report([])
    assert answer["totals"]["hit_rate"] is None
    assert answer["totals"]["lookups"] == 0
    assert answer["totals"]["cost_spent"] == 0.0
    assert answer["rows"] == []
    assert answer["top_misses"] == []


def test_the_window_includes_since_and_excludes_until() -> None:
    events = [miss(T0, HOUR), miss(T0 + 10, HOUR), miss(T0 + 20, HOUR)]
    answer = report(events, since=T0 + 10, until=T0 + 20)
    assert answer["totals"]["misses"] == 1


def test_counters_events_and_unreadable_bodies_are_not_lookups() -> None:
    counters = Event(T0, "team-a", "counters", "", '{"counts":{"fallbacks":3}}')
    broken = Event(T0, "team-a", "graph", "", "{not json")
    odd = graph(T0, result="maybe")
    assert report([counters, broken, odd, miss(T0, HOUR)])["totals"]["lookups"] == 1


# --- runs


def test_runs_are_cold_warm_or_mixed_per_job_and_namespace() -> None:
    events = [
        hit(T0, 100, job_id="warm-1"),
        hit(T0 + 1, 100, job_id="warm-1"),
        miss(T0 + 2, HOUR, job_id="cold-1"),
        miss(T0 + 3, HOUR, job_id="cold-1", outcome="failed"),
        miss(T0 + 4, 1800, job_id="mixed-1"),
        hit(T0 + 5, 100, job_id="mixed-1"),
        # The same job id in another namespace is another run (another cluster's job).
        miss(T0 + 6, 1800, namespace="team-b", job_id="warm-1"),
        # No job id: no run.
        miss(T0 + 7, 5 * HOUR),
    ]
    assert report(events)["runs"] == {
        "cold": 2,
        "warm": 1,
        "mixed": 1,
        "cold_compile_hours": 2.5,
        "warm_compile_hours": 0.0,
        "mixed_compile_hours": 0.5,
        "lookups_without_job": 1,
        "job_id_hint": None,  # some lookups named their job: runs are counted
    }


def test_without_job_ids_the_runs_say_how_to_set_one() -> None:
    answer = report([hit(T0, 100), miss(T0 + 1, HOUR)])
    runs = answer["runs"]
    assert (runs["cold"], runs["warm"], runs["mixed"]) == (0, 0, 0)
    assert runs["lookups_without_job"] == 2
    assert "NEFFCACHE_JOB_ID" in runs["job_id_hint"]
    assert "SLURM_JOB_ID" in runs["job_id_hint"]
    assert answer["notes"] == [runs["job_id_hint"]]


def test_no_lookup_needs_no_job_id_hint() -> None:
    answer = report([])
    assert answer["runs"]["job_id_hint"] is None
    assert answer["notes"] == []


def test_the_hint_names_the_variables_the_client_reads() -> None:
    from neffcache.client.config import JOB_ID_VARIABLES
    from neffcache.server.reports.runs import JOB_ID_VARIABLES as NAMED

    assert NAMED == JOB_ID_VARIABLES


def test_runs_past_the_job_limit_are_left_out_and_the_report_says_so() -> None:
    events = [miss(T0 + i, HOUR, job_id=f"job-{i}") for i in range(3)]
    answer = report(events, job_limit=2)
    assert answer["runs"]["cold"] == 2
    assert any("jobs" in note for note in answer["notes"])
    assert answer["totals"]["misses"] == 3  # the totals keep every lookup


# --- rows


def test_rows_by_model_and_day_in_that_order_with_unlabelled_last() -> None:
    events = [
        miss(T0, HOUR, model="llama"),
        hit(T0 + DAY / 2, HOUR, model="llama"),  # 2026-11-30T22:00Z
        miss(T0 + DAY, HOUR, model="bert"),  # 2026-12-01
        miss(T0, HOUR),
    ]
    answer = report(events, by=("model", "day"), until=T0 + 2 * DAY)
    groups = [(row["group"]["model"], row["group"]["day"]) for row in answer["rows"]]
    assert groups == [("bert", "2026-12-01"), ("llama", "2026-11-30"), (None, "2026-11-30")]
    assert list(answer["rows"][0]["group"]) == ["model", "day"]
    llama = answer["rows"][1]
    assert (llama["lookups"], llama["hits"], llama["misses"]) == (2, 1, 1)
    assert llama["hit_rate"] == 0.5


def test_rows_by_job_and_namespace() -> None:
    events = [
        miss(T0, HOUR, job_id="j1"),
        miss(T0, HOUR, namespace="team-b", job_id="j1"),
        miss(T0, HOUR, namespace="team-b"),
    ]
    rows = report(events, by=("job", "namespace"))["rows"]
    assert [row["group"] for row in rows] == [
        {"job": "j1", "namespace": "team-a"},
        {"job": "j1", "namespace": "team-b"},
        {"job": None, "namespace": "team-b"},
    ]


def test_groups_past_the_limit_share_one_other_row_and_totals_stay_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cost_module, "MAX_GROUPS", 2)
    events = [miss(T0, HOUR, namespace=f"ns-{i}") for i in range(4)]
    answer = report(events)
    assert [row["group"]["namespace"] for row in answer["rows"]] == ["ns-0", "ns-1", "(other)"]
    assert answer["rows"][2]["misses"] == 2
    assert answer["totals"]["misses"] == 4
    assert answer["notes"]


# --- days


def test_days_are_utc_dates_and_fill_the_window() -> None:
    before_midnight = utc("2026-11-30T23:59:59")
    midnight = utc("2026-12-01T00:00:00")
    events = [miss(before_midnight, HOUR), miss(midnight, 2 * HOUR)]
    answer = report(events, since=utc("2026-11-29T00:00:00"), until=utc("2026-12-02T00:00:00"))
    days = {day["day"]: day for day in answer["days"]}
    # The until instant is midnight: the day it begins is not in the window.
    assert list(days) == ["2026-11-29", "2026-11-30", "2026-12-01"]
    assert days["2026-11-29"]["lookups"] == 0
    assert days["2026-11-29"]["hit_rate"] is None
    assert days["2026-11-30"]["compile_hours_spent"] == 1.0
    assert days["2026-12-01"]["compile_hours_spent"] == 2.0


def test_a_window_from_the_epoch_starts_its_days_at_the_first_event() -> None:
    answer = report([miss(T0, HOUR)], since=0.0, until=T0 + 1)
    assert [day["day"] for day in answer["days"]] == ["2026-11-30"]


# --- the most expensive misses


def test_top_misses_are_ordered_by_compile_hours_then_misses() -> None:
    events = [
        miss(T0, HOUR, key=key("one-hour-once"), instance_type=BIG, reason="new-graph"),
        miss(T0, 1800, key=key("half-hour-twice"), instance_type=BIG),
        miss(T0 + 1, 1800, key=key("half-hour-twice"), instance_type=BIG),
        miss(T0, 2 * HOUR, key=key("two-hours"), instance_type="x9.huge", model="bert"),
        miss(T0, 1800, key=key("half-hour-once"), instance_type=BIG),
        hit(T0, 9 * HOUR, key=key("a-hit")),
    ]
    top = report(events, top=3)["top_misses"]
    assert [t["key"] for t in top] == [
        key("two-hours"),
        key("half-hour-twice"),
        key("one-hour-once"),
    ]
    assert top[0]["cost"] is None  # unpriced
    assert top[0]["compile_hours"] == 2.0
    assert top[0]["model"] == "bert"
    assert (top[1]["misses"], top[1]["cost"]) == (2, pytest.approx(21.5))
    assert top[2]["reason"] == "new-graph"


def test_a_top_miss_names_its_latest_reason_and_model() -> None:
    graph_key = key("g")
    events = [
        miss(T0, HOUR, key=graph_key, reason="new-graph", model="llama"),
        miss(T0 + 10, HOUR, key=graph_key, reason="compiler-changed"),
    ]
    (top,) = report(events)["top_misses"]
    assert (top["reason"], top["model"], top["misses"]) == ("compiler-changed", "llama", 2)
    assert top["last_at"] == T0 + 10
    assert top["namespace"] == "team-a"


def test_past_the_tally_limit_the_cheapest_misses_are_dropped_first() -> None:
    events = [miss(T0, 60.0 * (i + 1), key=key(i)) for i in range(6)]
    answer = report(events, top=2, miss_limit=4)
    assert [t["key"] for t in answer["top_misses"]] == [key(5), key(4)]
    assert any("approximate" in note for note in answer["notes"])


def test_a_window_from_the_epoch_fills_the_days_between_its_events() -> None:
    # A chart of days draws them side by side: a day without lookups is a day of zeros,
    # not a gap that joins Nov 30 to Dec 3.
    events = [miss(T0, HOUR), miss(T0 + 3 * DAY, 2 * HOUR)]
    answer = report(events, since=0.0, until=T0 + 4 * DAY)
    days = [(day["day"], day["lookups"]) for day in answer["days"]]
    assert days == [
        ("2026-11-30", 1),
        ("2026-12-01", 0),
        ("2026-12-02", 0),
        ("2026-12-03", 1),
        ("2026-12-04", 0),
    ]


def test_an_epoch_window_without_events_has_no_days() -> None:
    assert report([], since=0.0, until=T0)["days"] == []


# --- money that is unknown


def test_money_is_unknown_when_only_lookups_without_hours_had_a_price() -> None:
    graph_key = key("g")
    events = [
        # Priced, but no hour to price: a miss that never compiled, a hit saving nothing.
        miss(T0, instance_type=BIG, key=graph_key),
        hit(T0, 0.0, instance_type=BIG),
        # Every hour there was is on an instance type without a price.
        miss(T0 + 1, HOUR, instance_type="x9.huge", key=graph_key),
        hit(T0 + 1, 1800, instance_type="x9.huge"),
    ]
    answer = report(events)
    totals = answer["totals"]
    assert (totals["unpriced_hours_spent"], totals["unpriced_hours_saved"]) == (1.0, 0.5)
    assert totals["cost_spent"] is None  # not $0.00: an hour was spent, at no known price
    assert totals["cost_saved"] is None
    (top,) = answer["top_misses"]
    assert (top["compile_hours"], top["cost"]) == (1.0, None)


def test_lookups_without_hours_cost_nothing_when_nothing_is_unpriced() -> None:
    totals = report([miss(T0, instance_type=BIG), hit(T0, 0.0, instance_type=BIG)])["totals"]
    assert (totals["cost_spent"], totals["cost_saved"]) == (0.0, 0.0)


def test_an_instance_type_is_named_once_however_a_client_spells_it() -> None:
    events = [
        miss(T0, HOUR, instance_type="X9.Huge"),
        miss(T0, HOUR, instance_type="x9.huge "),
        miss(T0, HOUR, instance_type="TRN1.32XLARGE"),
        miss(T0, HOUR, instance_type=" "),  # names none
    ]
    answer = report(events)
    assert answer["prices"]["unpriced_instance_types"] == ["x9.huge"]
    assert list(answer["prices"]["applied"]) == [BIG]
    assert answer["prices"]["events_without_instance_type"] == 1
    assert answer["totals"]["cost_spent"] == pytest.approx(21.5)
