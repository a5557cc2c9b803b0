"""The upgrade plan's arithmetic, on entry stats and events built by hand, and how it
tells graphs built under the new compiler already (``programs.program_of``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from reports.support import DAY, HOUR, NEW, OLD, hit, key, keyed, miss

from neffcache.server.index import EntryFacts, EntryStats
from neffcache.server.reports import upgrade as upgrade_module
from neffcache.server.reports.prices import load_prices
from neffcache.server.reports.programs import program_of
from neffcache.server.reports.upgrade import NamespaceUpgrade, totals

NOW = 1_800_000_000.0
SERVER = "http://cache.internal:8787"


def stats(
    name: str,
    version: str,
    seconds: float | None,
    hits: int,
    served: float = NOW - HOUR,
    model: str = "",
) -> EntryStats:
    facts = EntryFacts(1000, seconds, version, model, ())
    return EntryStats("team-a", key(name), NOW - 9 * DAY, "w", facts, served, hits)


def plan(
    entries: list[EntryStats], events: Any = (), to: str = "2.22.0", top: int = 10, **kw: Any
) -> dict[str, Any]:
    made = NamespaceUpgrade("team-a", to, NOW - 30 * DAY, top, **kw)
    made.add_entries(entries)
    made.add_events(events)
    answer: dict[str, Any] = made.result(load_prices(None), SERVER)
    return answer


ENTRIES = [
    stats("a", "2.21.1", 2 * HOUR, hits=1, model="llama"),  # value 2 h
    stats("b", "2.21.1", 600, hits=30, model="llama", served=NOW - 60),  # value 5 h
    stats("c", "2.21.1", HOUR, hits=4, model="bert"),  # value 4 h
    stats("d", "2.21.1", None, hits=50),  # unknown compile time: last
    # An older compiler still served a while ago, and one unused for 40 days.
    stats("e", "2.20.9", 3 * HOUR, hits=9, served=NOW - 2 * DAY),
    stats("f", "2.19.0", 5 * HOUR, hits=9, served=NOW - 40 * DAY),
]
EVENTS = [
    miss(NOW - DAY, HOUR, model="llama", instance_type="trn1.32xlarge"),
    miss(NOW - DAY, HOUR, model="llama", instance_type="trn1.32xlarge"),
    hit(NOW - DAY, HOUR, model="llama", instance_type="trn1.2xlarge"),
    miss(NOW - DAY, HOUR, model="bert", instance_type="trn1.2xlarge"),
]


def test_the_graphs_of_the_version_in_use_will_miss_with_hours_and_money() -> None:
    answer = plan(ENTRIES, EVENTS)
    assert answer["from_compiler"] == "2.21.1"  # served most recently
    assert answer["already_on_target"] is False
    assert answer["graphs"] == 4
    assert answer["compile_hours"] == pytest.approx(2 + 600 / HOUR + 1)
    assert answer["unknown_compile_time"] == 1
    # llama compiles on trn1.32xlarge, bert on trn1.2xlarge; d has no model: the
    # namespace's most used type (trn1.32xlarge), with no known hours.
    llama_hours = 2 + 600 / HOUR
    assert answer["cost"] == pytest.approx(llama_hours * 21.5 + 1 * 1.34375)
    assert answer["unpriced_hours"] == 0.0
    assert answer["instance_type"] == "trn1.32xlarge"
    assert set(answer["versions_in_use"]) == {"2.21.1", "2.20.9"}  # 2.19.0 unused


def test_the_prewarm_plan_orders_models_and_graphs_by_value() -> None:
    answer = plan(ENTRIES, EVENTS)
    models = answer["prewarm"]["models"]
    assert [m["model"] for m in models] == ["llama", "bert", None]
    assert models[0]["value_hours"] == pytest.approx(7.0)
    assert models[0]["graphs"] == 2
    assert "NEFFCACHE_URL=neffcache+http://cache.internal:8787/team-a" in models[0]["run"]
    assert "NEFFCACHE_MODEL=llama" in models[0]["run"]
    assert "2.22.0" in models[0]["run"]
    assert "NEFFCACHE_MODEL=" not in models[2]["run"]
    graphs = [g["key"] for g in answer["prewarm"]["graphs"]]
    assert graphs == [key("b"), key("c"), key("a"), key("d")]
    assert answer["prewarm"]["graphs"][0]["value_hours"] == pytest.approx(5.0)
    assert answer["prewarm"]["graphs"][3]["value_hours"] is None


def test_the_plan_lists_at_most_top_graphs_but_counts_all() -> None:
    answer = plan(ENTRIES, EVENTS, top=2)
    assert [g["key"] for g in answer["prewarm"]["graphs"]] == [key("b"), key("c")]
    assert answer["graphs"] == 4


def test_nothing_to_rebuild_when_the_version_in_use_is_the_target() -> None:
    answer = plan(ENTRIES, EVENTS, to="2.21.*")
    assert answer["already_on_target"] is True
    assert (answer["graphs"], answer["compile_hours"], answer["cost"]) == (0, 0.0, 0.0)
    assert answer["prewarm"] == {"models": [], "graphs": []}


def test_another_version_can_be_named_as_the_one_in_use() -> None:
    answer = plan(ENTRIES, EVENTS, from_compiler="2.20.9")
    assert answer["from_compiler"] == "2.20.9"
    assert answer["graphs"] == 1
    assert answer["compile_hours"] == 3.0


def test_without_events_the_hours_are_unpriced() -> None:
    answer = plan(ENTRIES)
    assert answer["cost"] is None
    assert answer["unpriced_hours"] == pytest.approx(answer["compile_hours"])
    assert answer["instance_type"] is None


def test_no_entry_in_use_means_no_version_and_nothing_to_rebuild() -> None:
    answer = plan([stats("old", "2.19.0", HOUR, hits=3, served=NOW - 90 * DAY)])
    assert answer["from_compiler"] is None
    assert answer["graphs"] == 0


def test_totals_sum_each_kind_apart() -> None:
    parts = [plan(ENTRIES, EVENTS), plan(ENTRIES)]
    summed = totals(parts)
    assert summed["graphs"] == 8
    assert summed["cost"] == pytest.approx(parts[0]["cost"])  # the priced part only
    assert summed["unpriced_hours"] == pytest.approx(parts[1]["unpriced_hours"])


def test_graphs_without_a_model_are_priced_at_the_namespace_s_busiest_type() -> None:
    events = [
        miss(NOW - DAY, HOUR, model="a", instance_type="trn1n.32xlarge"),
        miss(NOW - DAY, HOUR, model="a", instance_type="trn1n.32xlarge"),
        miss(NOW - DAY, HOUR, model="b", instance_type="trn1.2xlarge"),
        miss(NOW - DAY, HOUR, model="b", instance_type="trn1.2xlarge"),
        miss(NOW - DAY, HOUR, model="c", instance_type="trn1.2xlarge"),
    ]
    answer = plan([stats("x", "2.21.1", HOUR, hits=1)], events)
    # trn1.2xlarge: 3 compiles over two models; trn1n.32xlarge: 2.
    assert answer["instance_type"] == "trn1.2xlarge"
    assert answer["cost"] == pytest.approx(1.34375)


def test_the_version_asked_for_may_be_a_pattern() -> None:
    assert plan(ENTRIES, EVENTS, from_compiler="2.20.*")["from_compiler"] == "2.20.9"
    assert plan(ENTRIES, EVENTS, from_compiler="1.*")["from_compiler"] is None


def test_money_is_unknown_when_every_known_hour_is_unpriced() -> None:
    # llama's jobs run on a priced type, but its graph's compile time is unknown (no
    # hour to price); bert's hour is on a type without a price.
    entries = [
        stats("l", "2.21.1", None, hits=2, model="llama"),
        stats("b", "2.21.1", HOUR, hits=1, model="bert"),
    ]
    events = [
        miss(NOW - DAY, HOUR, model="llama", instance_type="trn1.32xlarge"),
        miss(NOW - DAY, HOUR, model="bert", instance_type="x9.huge"),
    ]
    answer = plan(entries, events)
    assert [m["cost"] for m in answer["prewarm"]["models"]] == [None, 0.0]  # bert, llama
    assert (answer["compile_hours"], answer["unpriced_hours"]) == (1.0, 1.0)
    assert answer["cost"] is None  # not $0.00: the one hour to rebuild has no price
    nothing = plan([stats("n", "2.21.1", None, hits=1, model="llama")], events)
    assert nothing["cost"] == 0.0  # no hour at all: nothing to pay
    summed = totals([answer, nothing])
    assert (summed["cost"], summed["unpriced_hours"]) == (None, 1.0)
    assert totals([answer, plan(ENTRIES, EVENTS)])["cost"] == pytest.approx(
        plan(ENTRIES, EVENTS)["cost"]
    )


# --- graphs built under the target version already


def manifest(components: dict[str, Any]) -> str:
    return json.dumps({"components": components, "files": {}})


def built(*graphs: tuple[str, dict[str, Any]]) -> list[bytes]:
    found = [program_of(entry_key, manifest(components)) for entry_key, components in graphs]
    assert None not in found
    return [program for program in found if program is not None]


def in_use(name: str, graph: tuple[str, dict[str, Any]], hits: int = 1) -> EntryStats:
    facts = EntryFacts(1000, HOUR, graph[1]["compiler_version"], name, ())
    return EntryStats("team-a", graph[0], NOW - 9 * DAY, "w", facts, NOW - HOUR, hits)


def test_a_graph_built_under_the_target_is_done_and_only_an_exact_twin_counts() -> None:
    same, flags, target, shapes = keyed("same"), keyed("flags"), keyed("target"), keyed("s")
    made = NamespaceUpgrade("team-a", "2.22.*", NOW - 30 * DAY, 10)
    made.add_built(
        built(
            keyed("same", NEW),
            # The same program under other flags, for another target: other keys.
            keyed("flags", NEW, flags=["--model-type=transformer", "-O1"]),
            keyed("target", NEW, target="trn1"),
            # Another program: another fingerprint (another shape, say).
            keyed("s-other-shapes", NEW),
        )
    )
    graphs = {"same": same, "flags": flags, "target": target, "shapes": shapes}
    programs = {}
    for name, graph in graphs.items():
        stats = in_use(name, graph)
        assert made.wants_program(stats)
        programs[graph[0]] = program_of(graph[0], manifest(graph[1]))
    made.add_entries([in_use(name, graph) for name, graph in graphs.items()], programs)
    answer = made.result(load_prices(None), SERVER)
    assert answer["from_compiler"] == OLD
    assert (answer["graphs"], answer["graphs_done"]) == (3, 1)
    assert answer["compile_hours"] == 3.0  # the done graph's hour is not to rebuild
    assert {g["key"] for g in answer["prewarm"]["graphs"]} == {flags[0], target[0], shapes[0]}
    steps = {step["model"]: step for step in answer["prewarm"]["models"]}
    assert set(steps) == {"flags", "target", "shapes"}  # "same" has nothing to run
    assert totals([answer])["graphs_done"] == 1


def test_the_toolchain_s_frameworks_may_change_with_the_compiler() -> None:
    old = keyed("nki", frameworks={"nki": "0.1.0"})
    made = NamespaceUpgrade("team-a", NEW, NOW - 30 * DAY, 10)
    made.add_built(built(keyed("nki", NEW, frameworks={"nki": "0.2.0"})))
    made.add_entries([in_use("m", old)], {old[0]: program_of(old[0], manifest(old[1]))})
    answer = made.result(load_prices(None), SERVER)
    assert (answer["graphs"], answer["graphs_done"]) == (0, 1)
    assert answer["prewarm"] == {"models": [], "graphs": []}


def test_a_graph_whose_components_do_not_make_its_key_is_never_done() -> None:
    entry_key, components = keyed("liar")
    forged = {**components, "fingerprint": keyed("other")[1]["fingerprint"]}
    assert program_of(entry_key, manifest(forged)) is None
    assert program_of(entry_key, manifest({"compiler_version": OLD})) is None
    assert program_of(entry_key, "not json") is None
    assert program_of(entry_key, "[]") is None
    assert program_of(entry_key, None) is None
    wrong_version = {**components, "key_version": "0"}
    assert program_of(entry_key, manifest(wrong_version)) is None


def test_nothing_built_reads_no_manifest() -> None:
    made = NamespaceUpgrade("team-a", NEW, NOW - 30 * DAY, 10)
    assert not made.wants_program(in_use("m", keyed("x")))
    made.add_built(built(keyed("y", NEW)))
    assert made.wants_program(in_use("m", keyed("x")))
    assert not made.wants_program(in_use("m", keyed("y", NEW)))  # the target's own


def test_a_prewarm_s_entries_never_served_do_not_make_the_target_the_version_in_use() -> None:
    # Published a minute ago by a prewarm (never served), vs served an hour ago.
    prewarmed = stats("p", NEW, HOUR, hits=0, served=NOW - 60)
    answer = plan([stats("a", OLD, HOUR, hits=3), prewarmed], to=NEW)
    assert answer["from_compiler"] == OLD
    assert answer["already_on_target"] is False
    # Once jobs are served by the new version, it is the one in use.
    answer = plan([stats("a", OLD, HOUR, hits=3), stats("p", NEW, HOUR, hits=1)], to=NEW)
    assert answer["already_on_target"] is True
    # With nothing served at all, the latest published.
    answer = plan([stats("a", OLD, HOUR, hits=0), prewarmed], to=NEW)
    assert answer["already_on_target"] is True


def test_past_the_bound_of_built_graphs_the_report_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upgrade_module, "MAX_BUILT", 1)
    made = NamespaceUpgrade("team-a", NEW, NOW - 30 * DAY, 10)
    made.add_built(built(keyed("a", NEW), keyed("b", NEW)))
    assert len(made.built) == 1
    (note,) = made.result(load_prices(None), SERVER)["notes"]
    assert "may be built already" in note
