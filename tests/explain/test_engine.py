"""The explanation engine as a pure function: one case per reason code the server
produces, its message word for word, and which finding wins when several
apply. Inputs are built by hand; no store is involved."""

from __future__ import annotations

import calendar
import time
from dataclasses import replace
from typing import Any

import pytest

from neffcache.server.explain.engine import explain, rank
from neffcache.server.explain.facts import (
    Asked,
    FailureSeen,
    GraphInfo,
    Inputs,
    OtherGraph,
    Policy,
    Present,
    Removal,
    Variant,
)
from neffcache.server.explain.reasons import CLIENT_REASONS, REASONS
from neffcache.server.explain.words import duration, flag_changes, moment, version_order

DAY = 86400.0
FP = "f" * 64
OTHER_FP = "e" * 64
STRUCTURE = "5" * 64
KEY = "a" * 64
NOW = calendar.timegm(time.strptime("2026-11-20 09:00", "%Y-%m-%d %H:%M"))
AT_1402 = calendar.timegm(time.strptime("2026-11-20 14:02", "%Y-%m-%d %H:%M")) - DAY
NOV_12 = calendar.timegm(time.strptime("2026-11-12 03:00", "%Y-%m-%d %H:%M"))
OLD = "2.20.9961.0+0acef03a"
NEW = "2.21.1.0+6b1fa2e4"

YOURS: dict[str, Any] = {
    "key_version": "1",
    "fingerprint": FP,
    "compiler_version": NEW,
    "target": "trn2",
    "flags": ["--model-type=transformer", "--optlevel=2"],
    "env": {},
    "frameworks": {},
}


def variant(key: str = "b" * 64, **changes: Any) -> Variant:
    fields: dict[str, Any] = {
        "namespace": "team-a",
        "key": key,
        "compiler_version": NEW,
        "target": "trn2",
        "flags": ("--model-type=transformer", "--optlevel=2"),
        "env": {},
        "frameworks": {},
        "model": "llama",
        "created_at": NOW - 3 * DAY,
        "compile_seconds": 1800.0,
        "seen": "published",
        "present": True,
    }
    fields.update(changes)
    return Variant(**fields)


def inputs(**changes: Any) -> Inputs:
    asked = changes.pop("asked", Asked("team-a", KEY, YOURS))
    base = Inputs(
        asked,
        NOW,
        Policy("team-a", ttl_seconds=30 * DAY, quota_bytes=2**40, failure_ttl_seconds=3600),
    )
    return replace(base, **changes)


# --- the messages


def test_a_compiler_upgrade() -> None:
    got = explain(inputs(variants=(variant(compiler_version=OLD),)))
    assert got.reason == "compiler-changed"
    assert got.summary == (
        "compiled before under neuronx-cc 2.20.9961.0; you have 2.21.1.0: "
        "a compiler upgrade misses every graph"
    )
    assert got.nearest[0]["differences"] == [
        {"component": "compiler_version", "yours": NEW, "theirs": OLD}
    ]
    assert any("report upgrade" in s for s in got.sentences)


def test_a_compiler_downgrade_and_another_build_of_one_release() -> None:
    down = explain(inputs(variants=(variant(compiler_version="2.22.0.0+11111111"),)))
    assert down.summary.endswith("you have 2.21.1.0: a compiler downgrade misses every graph")
    build = explain(inputs(variants=(variant(compiler_version="2.21.1.0+22222222"),)))
    assert build.summary == (
        f"compiled before under neuronx-cc 2.21.1.0+22222222; you have {NEW}: another build "
        "of the same release misses every graph"
    )


def test_a_flag_change() -> None:
    theirs = ("--model-type=transformer", "--optlevel=1")
    got = explain(inputs(variants=(variant(flags=theirs),)))
    assert got.reason == "flags-changed"
    assert got.summary == "flag --optlevel differs: 1 vs 2"
    assert "Flag --optlevel differs: 1 vs 2." in got.sentences


def test_a_target_change() -> None:
    got = explain(inputs(variants=(variant(target="trn1"),)))
    assert got.reason == "target-changed"
    assert got.summary == "same program, target trn1 vs trn2"


def test_an_environment_change_and_a_framework_change() -> None:
    env = explain(inputs(variants=(variant(env={"XLA_FLAGS": "--xla_a"}),)))
    assert env.reason == "env-changed"
    assert env.summary == (
        "same program, compiler, flags and target; variable XLA_FLAGS was set before "
        "('--xla_a'), not now"
    )
    nki = explain(inputs(variants=(variant(frameworks={"nki": "0.3"}),)))
    assert nki.reason == "env-changed"
    assert "framework nki" in nki.summary


def removal(reason: str, action: str = "evict", **detail: Any) -> Removal:
    fields = {"reason": reason, "why": "", "hits": 3, "last_access": NOV_12 - 31 * DAY, **detail}
    return Removal(NOV_12, "team-a", action, "evictor@host-1", fields)


def test_evicted_by_quota() -> None:
    why = f"namespace over its quota of {2**40} bytes"
    got = explain(inputs(removals=(removal("quota", why=why),)))
    assert got.reason == "evicted"
    assert got.summary == "evicted 2026-11-12 by namespace team-a's quota"
    assert got.removed is not None
    assert (got.removed["reason"], got.removed["actor"]) == ("quota", "evictor@host-1")
    assert got.sentences[0] == f"Namespace over its quota of {2**40} bytes."
    assert any("It had served 3 hits" in s for s in got.sentences)


def test_expired_after_thirty_days_unused() -> None:
    done = removal(
        "expired", why="unused for 30.9 days; TTL 30.0 days", last_access=NOV_12 - 30.9 * DAY
    )
    got = explain(inputs(removals=(done,)))
    assert got.reason == "expired"
    assert got.summary == "expired after 30 days unused"
    assert got.sentences[0] == (
        "Namespace team-a's TTL removed it on 2026-11-12 (unused for 30.9 days; TTL 30.0 days)."
    )


def test_evicted_by_compiler_retention_and_by_an_admin_expiry() -> None:
    kept = removal(
        "compiler-retention", why="compiler 2.19.1.0+1 is not among the 2 most recently used"
    )
    got = explain(inputs(removals=(kept,)))
    assert (got.reason, got.summary) == (
        "evicted",
        "evicted 2026-11-12 by namespace team-a's compiler retention",
    )
    retired = removal(
        "admin-expire", "expire", why=f"compiler {OLD} retired (2.20.*)", compiler_version=OLD
    )
    got = explain(inputs(removals=(replace(retired, actor="abc123 (ops)"),)))
    assert (got.reason, got.summary) == (
        "evicted",
        f"evicted 2026-11-12: an admin retired compiler {OLD}",
    )
    assert got.sentences[0] == f"abc123 (ops) expired entries: compiler {OLD} retired (2.20.*)."


def test_an_entry_known_published_but_gone_without_an_audit_record_is_evicted() -> None:
    own = variant(key=KEY, created_at=NOV_12, present=False)
    got = explain(inputs(own=own))
    assert got.reason == "evicted"
    assert "the audit log no longer says why" in got.summary


def test_failed_before_with_its_log() -> None:
    record = {
        "compiler_version": OLD,
        "exit_code": 70,
        "compile_seconds": 321.0,
        "host": "ip-10-0-0-7",
        "log": "ERROR: out of memory\n",
        "created_at": AT_1402,
    }
    got = explain(inputs(failure=FailureSeen(AT_1402, record, "record"), now=AT_1402 + 600))
    assert got.reason == "failed-before"
    assert got.summary == "last compile of this graph failed at 14:02 UTC (log attached)"
    assert got.failure == record
    assert got.sentences[0] == (
        f"The compile under neuronx-cc {OLD} exited with code 70 after 5 minutes on host "
        "ip-10-0-0-7."
    )


def test_failed_before_from_an_event_on_another_day_without_a_log() -> None:
    seen = FailureSeen(AT_1402, {"host": "h", "job_id": "j-1"}, "event")
    got = explain(inputs(failure=seen, now=AT_1402 + 2 * DAY))
    assert got.summary == ("last compile of this graph failed at 2026-11-19 14:02 UTC (no log)")
    assert got.failure == {"created_at": AT_1402, "host": "h", "job_id": "j-1"}
    assert any("no failure record" in s for s in got.sentences)


def test_published_since_the_miss() -> None:
    # Asked as the miss happens (a client's POST): an entry there now means another
    # job compiled the graph meanwhile.
    entry = Present("team-a", KEY, NOW - 60, "tok-1", {"model": "llama", "compile_seconds": 90.0})
    got = explain(inputs(entry=entry))
    assert got.reason == "published-since"
    assert got.summary == "an entry exists now: published 08:59 UTC"
    assert got.entry is not None
    assert (got.entry["writer"], got.entry["model"]) == ("tok-1", "llama")
    # Published before a reported miss: the client did not find what was there.
    before = explain(inputs(asked=Asked("team-a", KEY, YOURS, missed_at=NOW - 30), entry=entry))
    assert before.reason == "published-since"
    assert before.summary.endswith(
        "before the miss at 08:59 UTC: the client did not reach the server then, or looked "
        "in another namespace"
    )


def test_a_key_published_after_its_reported_miss_is_explained_as_of_the_miss() -> None:
    # The job that missed compiled and published it (or another did): that is not why
    # it missed. Why it did comes first; the entry last.
    entry = Present("team-a", KEY, NOW - 60, "tok-1", {})
    asked = Asked("team-a", KEY, YOURS, missed_at=NOW - 600)
    own = variant(key=KEY, created_at=NOW - 60)  # the program map's note of that publish
    upgraded = explain(
        inputs(asked=asked, entry=entry, own=own, variants=(variant(compiler_version=OLD),))
    )
    assert upgraded.reason == "compiler-changed"
    assert upgraded.sentences[-1] == (
        "Also: an entry exists now: published 08:59 UTC, after the miss at 08:50 UTC: the job "
        "that missed it (or another) compiled it meanwhile."
    )
    assert upgraded.entry is not None
    new = explain(inputs(asked=asked, entry=entry, own=own))
    assert new.reason == "new-graph"
    # A variant, a failure or a removal after the miss did not cause it either.
    later = variant(compiler_version=OLD, created_at=NOW - 300)
    failed = FailureSeen(NOW - 300, {"log": "boom"}, "record")
    after = explain(inputs(asked=asked, entry=entry, variants=(later,), failure=failed))
    assert after.reason == "new-graph"
    failed_before = FailureSeen(NOW - 900, {"log": "boom"}, "record")
    assert explain(inputs(asked=asked, entry=entry, failure=failed_before)).reason == (
        "failed-before"
    )


def test_published_in_a_namespace_read_through() -> None:
    entry = Present("shared", KEY, NOW - 2 * DAY, "ci", {})
    got = explain(inputs(entry=entry))
    assert got.summary == "an entry exists now in namespace shared: published 2026-11-18 09:00 UTC"
    assert "team-a reads namespace shared through." in got.sentences


def test_another_namespace_not_read_through() -> None:
    got = explain(inputs(elsewhere=("team-b",)))
    assert got.reason == "other-namespace"
    assert got.summary == "an entry exists in namespace team-b, which team-a does not read through"
    several = explain(inputs(elsewhere=("team-b", "team-c")))
    assert several.summary == (
        "an entry exists in namespace team-b, which team-a does not read through "
        "(and in 1 other namespace)"
    )


def graph_asked(shapes: tuple[str, ...] | None) -> Asked:
    count = 118 if shapes is None else len(shapes)
    return Asked("team-a", KEY, YOURS, GraphInfo(STRUCTURE, count, shapes))


SHAPES = tuple(f"add f32[{i},8]" for i in range(118))


def other_graph(
    shapes: tuple[str, ...] | None, relation: str = "structure", **kw: Any
) -> OtherGraph:
    count = kw.pop("instructions", 118)
    return OtherGraph("team-a", OTHER_FP, relation, count, shapes, (variant(),), **kw)


def test_never_seen_closest_graph_differs_in_two_shapes() -> None:
    theirs = list(SHAPES)
    theirs[5], theirs[99] = "dot f32[8,128]", "dot f32[8,128]"
    mine = list(SHAPES)
    mine[5], mine[99] = "dot f32[16,128]", "dot f32[16,128]"
    got = explain(inputs(asked=graph_asked(tuple(mine)), graphs=(other_graph(tuple(theirs)),)))
    assert got.reason == "shapes-changed"
    assert got.summary == (
        "never seen: no entry shares this program's fingerprint; closest graph differs in "
        "2 of 118 instructions' shapes"
    )
    assert got.graph is not None
    assert (got.graph["instructions"], got.graph["differing"]) == (118, 2)
    assert got.graph["examples"][0] == {
        "instruction": 5,
        "yours": "dot f32[16,128]",
        "theirs": "dot f32[8,128]",
    }
    assert "Instruction 99: dot f32[8,128] before, dot f32[16,128] now." in got.sentences
    assert got.nearest[0]["differences"][0] == {
        "component": "fingerprint",
        "yours": FP,
        "theirs": OTHER_FP,
    }


def test_same_structure_with_shapes_unknown_is_still_shapes_changed() -> None:
    got = explain(inputs(asked=graph_asked(None), graphs=(other_graph(SHAPES),)))
    assert got.reason == "shapes-changed"
    assert got.summary.endswith(
        "a graph of the same structure (118 instructions) was compiled with other shapes"
    )
    assert "yours were not sent" in got.sentences[0]


def test_same_structure_and_shapes_is_graph_changed() -> None:
    got = explain(inputs(asked=graph_asked(SHAPES), graphs=(other_graph(SHAPES),)))
    assert got.reason == "graph-changed"
    assert "it differs in constants, layouts or attributes" in got.summary


def test_the_latest_graph_of_the_same_model_is_graph_changed() -> None:
    theirs = (*SHAPES[:-1], "multiply f32[8]", "multiply f32[8]")
    model = other_graph(theirs, "model", instructions=119, model="llama")
    got = explain(inputs(asked=graph_asked(SHAPES), graphs=(model,)))
    assert got.reason == "graph-changed"
    assert got.summary == (
        "never seen: no entry shares this program's fingerprint; the latest graph of model "
        "llama is another program (119 instructions vs your 118)"
    )
    assert "Operations, counted: -2 multiply, +1 add." in got.sentences


def test_a_new_graph() -> None:
    got = explain(inputs(asked=graph_asked(SHAPES)))
    assert got.reason == "new-graph"
    assert got.summary == (
        "never seen: no entry shares this program's fingerprint; no graph of the same "
        "structure either"
    )
    bare = explain(inputs())
    assert bare.summary == "never seen: no entry shares this program's fingerprint"


def test_unknown_key() -> None:
    got = explain(inputs(asked=Asked("team-a", KEY, {})))
    assert got.reason == "unknown"
    assert got.summary == (
        "no record of key aaaaaaaaaaaa in namespace team-a: no entry, miss event, failure "
        "or removal"
    )
    assert got.as_json()["entry"] is None


def test_same_program_but_components_not_given_is_unknown() -> None:
    got = explain(inputs(asked=Asked("team-a", None, {"fingerprint": FP}), variants=(variant(),)))
    assert got.reason == "unknown"
    assert got.key is None
    assert got.nearest[0]["differences"] == []


# --- every code, and which one wins


def test_every_server_reason_is_produced_by_some_case_above() -> None:
    produced = {
        explain(inputs(variants=(variant(compiler_version=OLD),))).reason,
        explain(inputs(variants=(variant(flags=()),))).reason,
        explain(inputs(variants=(variant(target="trn1"),))).reason,
        explain(inputs(variants=(variant(env={"XLA_FLAGS": "x"}),))).reason,
        explain(inputs(removals=(removal("quota"),))).reason,
        explain(inputs(removals=(removal("expired"),))).reason,
        explain(inputs(failure=FailureSeen(NOW, {}, "event"))).reason,
        explain(inputs(entry=Present("team-a", KEY, NOW, "w", {}))).reason,
        explain(inputs(elsewhere=("b",))).reason,
        explain(inputs(asked=graph_asked(SHAPES), graphs=(other_graph(SHAPES[::-1]),))).reason,
        explain(inputs(asked=graph_asked(SHAPES), graphs=(other_graph(SHAPES),))).reason,
        explain(inputs()).reason,
        explain(inputs(asked=Asked("team-a", KEY, {}))).reason,
    }
    assert produced == set(REASONS) - CLIENT_REASONS | {"unknown"}


def test_an_entry_now_wins_over_everything_else() -> None:
    # The entry is read through from "shared"; team-a's own one was evicted after.
    got = explain(
        inputs(
            entry=Present("shared", KEY, NOV_12 - DAY, "w", {}),
            removals=(removal("quota"),),
            variants=(variant(compiler_version=OLD),),
        )
    )
    assert got.reason == "published-since"
    assert got.removed is not None  # still told
    assert "Also: evicted 2026-11-12 by namespace team-a's quota." in got.sentences


def test_what_happened_before_the_last_publish_is_not_told() -> None:
    # Failed on Nov 11, evicted on Nov 12, published again since: neither failure nor
    # removal is about the entry there now.
    failed = FailureSeen(NOV_12 - DAY, {"log": "boom"}, "record")
    entry = Present("team-a", KEY, NOV_12 + DAY, "w", {})
    got = explain(inputs(entry=entry, removals=(removal("quota"),), failure=failed))
    assert got.reason == "published-since"
    assert not any(s.startswith("Also:") for s in got.sentences), got.sentences
    assert (got.removed, got.failure) == (None, None)
    # Gone again, without an audit record: the program map's publish is the last one.
    own = variant(key=KEY, created_at=NOV_12 + DAY, present=False)
    gone = explain(inputs(own=own, removals=(removal("quota"),), failure=failed))
    assert gone.reason == "evicted"
    assert "the audit log no longer says why" in gone.summary
    assert not any(s.startswith("Also:") for s in gone.sentences), gone.sentences
    # A failure after that publish is the last compile, and is told.
    later = FailureSeen(NOV_12 + 2 * DAY, {"log": "boom"}, "record")
    assert explain(inputs(own=own, failure=later)).reason == "failed-before"


def test_a_key_that_had_an_entry_is_never_called_never_seen() -> None:
    entry = Present("team-a", KEY, NOW - DAY, "w", {})
    own = variant(key=KEY, created_at=NOW - DAY, present=False)
    for got in (explain(inputs(entry=entry)), explain(inputs(own=own))):
        assert got.reason in ("published-since", "evicted")
        assert not any("never seen" in s for s in got.sentences), got.sentences
        assert got.graph is None
    # Only missed before (never published): the program is still new to the server.
    missed = variant(key=KEY, seen="missed", present=False)
    assert explain(inputs(own=missed)).reason == "new-graph"


def test_the_newest_of_a_failure_and_a_removal_wins() -> None:
    failed_later = FailureSeen(NOV_12 + DAY, {"log": "boom"}, "record")
    got = explain(inputs(removals=(removal("quota"),), failure=failed_later))
    assert got.reason == "failed-before"
    assert any(s.startswith("Also: evicted") for s in got.sentences)
    failed_earlier = FailureSeen(NOV_12 - DAY, {"log": "boom"}, "record")
    got = explain(inputs(removals=(removal("quota"),), failure=failed_earlier))
    assert got.reason == "evicted"
    assert got.failure is not None


def test_a_removal_wins_over_a_program_difference_which_is_added() -> None:
    got = explain(inputs(removals=(removal("quota"),), variants=(variant(target="trn1"),)))
    assert got.reason == "evicted"
    assert "Also: same program, target trn1 vs trn2." in got.sentences
    assert got.nearest[0]["differences"][0]["component"] == "target"


def test_the_nearest_variant_differs_in_fewest_components() -> None:
    far = variant("c" * 64, target="trn1", flags=())  # two differences
    near = variant("d" * 64, compiler_version=OLD, created_at=NOW - 100 * DAY)
    got = explain(inputs(variants=(far, near)))
    assert got.reason == "compiler-changed"
    assert [n["key"] for n in got.nearest] == ["d" * 64, "c" * 64]


def test_between_equally_near_variants_an_entry_that_exists_wins() -> None:
    gone = variant("c" * 64, target="trn1", present=False, created_at=NOW)
    kept = variant("d" * 64, compiler_version=OLD, present=True, created_at=NOW - DAY)
    assert [v.key for v in rank(YOURS, [gone, kept])] == ["d" * 64, "c" * 64]


def test_a_variant_only_missed_says_it_was_never_published() -> None:
    got = explain(inputs(variants=(variant(target="trn1", seen="missed", present=False),)))
    assert got.reason == "target-changed"
    assert any("never published" in s for s in got.sentences)
    assert "missed in namespace team-a" in got.sentences[0]


# --- words


@pytest.mark.parametrize(
    ("theirs", "yours", "said"),
    [
        (["--optlevel=1"], ["--optlevel=2"], ["flag --optlevel differs: 1 vs 2"]),
        ([], ["--enable-fast-loading"], ["flag --enable-fast-loading is new"]),
        (["--lnc=2"], [], ["flag --lnc=2 is gone"]),
        (
            ["--a=1", "--b=2"],
            ["--b=2", "--a=1"],
            ["the same flags in another order: --a=1 --b=2 vs --b=2 --a=1"],
        ),
        (["--x="], ["--x"], ['flag --x differs: "" vs (set, no value)']),
        (
            ["--a=1", "--a=2"],
            ["--a=2"],
            ["the same flags, some given more than once: --a=1 --a=2 vs --a=2"],
        ),
    ],
)
def test_flag_changes_in_plain_words(theirs: list[str], yours: list[str], said: list[str]) -> None:
    assert flag_changes(theirs, yours) == said


def test_durations_times_and_versions() -> None:
    assert [duration(s) for s in (30.9 * DAY, DAY, 7200, 61, 5)] == [
        "30 days",
        "1 day",
        "2 hours",
        "1 minute",
        "5 s",
    ]
    assert moment(AT_1402, AT_1402 + 3600) == "14:02 UTC"
    assert moment(AT_1402, AT_1402 + DAY) == "2026-11-19 14:02 UTC"
    assert version_order(OLD, NEW) == 1
    assert version_order(NEW, OLD) == -1
    assert version_order("2.20.9961.0+a", "2.20.9961.0+b") == 0
    assert version_order("weird", NEW) == 0
