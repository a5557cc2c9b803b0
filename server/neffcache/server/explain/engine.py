"""Why a graph missed, as a pure function of what the server knows (``facts.Inputs``).

Findings are tried in order; the first that applies gives the reason and the summary,
the others add a sentence each ("Also: ..."):

1. ``published-since``: an entry exists now (own namespace or one read through);
2. ``failed-before``, ``evicted``, ``expired``: what happened last to this key, the
   newest of a failure and a removal;
3. ``other-namespace``: an entry under this key in a namespace not read through;
4. ``compiler-changed``, ``flags-changed``, ``target-changed``, ``env-changed``: the
   same program (fingerprint) under another key, judged by its nearest variant;
5. ``shapes-changed``, ``graph-changed``, ``new-graph``: no variant of the program,
   so the closest other graph (same structure, else same model), or none;
6. ``unknown``: nothing the server knows applies.

An entry published after a reported miss did not cause it: the findings are then those
of what the server knew at the miss (``as_of_miss``), and the entry comes last. What
happened before the key's last publish is not told (``_history``).

In "A vs B" wording A is what the server's graph had and B is yours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from neffcache.server.explain.facts import (
    COMPARED,
    Difference,
    Explanation,
    FailureSeen,
    Inputs,
    OtherGraph,
    Policy,
    Present,
    Removal,
    Variant,
)
from neffcache.server.explain.words import (
    compiler_change,
    day,
    duration,
    flag_changes,
    mapping_changes,
    moment,
    opcode_changes,
    plural,
    short,
    version_order,
)
from neffcache.server.units import human_bytes

NEAREST_SHOWN = 5
EXAMPLES_SHOWN = 5
_ALSO_SHOWN = 3
_NEVER_SEEN = "never seen: no entry shares this program's fingerprint"


@dataclass
class Finding:
    reason: str
    summary: str
    sentences: list[str] = field(default_factory=list)
    # Explanation fields this finding fills: entry, nearest, removed, failure, graph.
    fields: dict[str, Any] = field(default_factory=dict)


def explain(inputs: Inputs) -> Explanation:
    basis = as_of_miss(inputs)
    if basis is None:
        findings = [
            *_published(inputs),
            *_history(inputs),
            *_elsewhere(inputs),
            *(_program(inputs) if inputs.variants else _graph(inputs)),
        ]
    else:  # why it missed then; that it was published since comes last
        findings = [
            *_history(basis),
            *(_program(basis) if basis.variants else _graph(basis)),
            *_published(inputs),
        ]
    if not findings:
        findings = [_unknown(inputs)]
    first = findings[0]
    out = Explanation(
        inputs.asked.namespace, inputs.asked.key, first.reason, first.summary, first.sentences
    )
    for also in findings[1 : 1 + _ALSO_SHOWN]:
        out.sentences.append(f"Also: {also.summary}.")
    for finding in findings:
        for name, value in finding.fields.items():
            if getattr(out, name) in (None, []):
                setattr(out, name, value)
    return out


def as_of_miss(inputs: Inputs) -> Inputs | None:
    """What the server knew when a reported miss was looked up, if the entry there now
    was published after it (by the job that missed, typically): the entry, and what
    happened or was noted after the miss, do not explain it. None otherwise."""
    entry, missed = inputs.entry, inputs.asked.missed_at
    if entry is None or missed is None or entry.created_at < missed:
        return None
    own = inputs.own if inputs.own is not None and inputs.own.created_at < missed else None
    failure = inputs.failure if inputs.failure is not None and inputs.failure.at < missed else None
    return replace(
        inputs,
        entry=None,
        own=own,
        failure=failure,
        removals=tuple(r for r in inputs.removals if r.at < missed),
        variants=tuple(v for v in inputs.variants if v.created_at < missed),
    )


# --- 1. an entry now


def _published(inputs: Inputs) -> list[Finding]:
    entry = inputs.entry
    if entry is None:
        return []
    now, asked = inputs.now, inputs.asked
    where = "" if entry.namespace == asked.namespace else f" in namespace {entry.namespace}"
    summary = f"an entry exists now{where}: published {moment(entry.created_at, now)}"
    missed = asked.missed_at
    if missed is not None and entry.created_at >= missed:
        summary += (
            f", after the miss at {moment(missed, now)}: the job that missed it (or another) "
            "compiled it meanwhile"
        )
    elif missed is not None:
        summary += (
            f", before the miss at {moment(missed, now)}: the client did not reach the "
            "server then, or looked in another namespace"
        )
    writer = f"{entry.writer_name} ({entry.writer})" if entry.writer_name else entry.writer
    sentences = [f"Published by {writer}{_about(entry.manifest)}; a lookup now hits."]
    if where:
        sentences.append(f"{asked.namespace} reads namespace {entry.namespace} through.")
    return [Finding("published-since", summary, sentences, {"entry": _entry_view(entry)})]


def _about(manifest: Mapping[str, Any]) -> str:
    parts = []
    if isinstance(manifest.get("model"), str):
        parts.append(f"model {manifest['model']}")
    seconds = manifest.get("compile_seconds")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        parts.append(f"compiled in {duration(seconds)}")
    return f" ({', '.join(parts)})" if parts else ""


def _entry_view(entry: Present) -> dict[str, Any]:
    view = {
        name: entry.manifest[name]
        for name in ("components", "model", "compile_seconds", "neuron_address", "direct_key")
        if name in entry.manifest
    }
    return {
        "namespace": entry.namespace,
        "key": entry.key,
        "created_at": entry.created_at,
        "writer": entry.writer,
        **view,
    }


# --- 2. what happened last to this key


def _history(inputs: Inputs) -> list[Finding]:
    """The newest of the last failure and the last removal, then the other. What
    happened before the key's last publish (the entry there now, or the one the program
    map knows) is left out: a failure then was not the last compile, and a removal
    then removed an entry that was published again."""
    published = _last_published(inputs)
    found: list[tuple[float, Finding]] = []
    failure = inputs.failure
    if failure is not None and (published is None or failure.at >= published):
        found.append((failure.at, _failed(failure, inputs)))
    removals = [r for r in inputs.removals if published is None or r.at >= published]
    own = inputs.own
    if removals:
        found.append((removals[0].at, _removed(removals[0], inputs)))
    elif own is not None and own.seen == "published" and inputs.entry is None:
        summary = (
            f"evicted: this key had an entry (published {day(own.created_at)} in namespace "
            f"{own.namespace}); it is gone and the audit log no longer says why"
        )
        found.append((own.created_at, Finding("evicted", summary)))
    found.sort(key=lambda pair: pair[0], reverse=True)
    return [finding for _, finding in found]


def _last_published(inputs: Inputs) -> float | None:
    """When this key's entry was last published, as far as the server knows: the
    entry there now, else the program map's note of one."""
    if inputs.entry is not None:
        return inputs.entry.created_at
    if inputs.own is not None and inputs.own.seen == "published":
        return inputs.own.created_at
    return None


def _failed(failure: FailureSeen, inputs: Inputs) -> Finding:
    record = failure.record
    log = record.get("log")
    summary = f"last compile of this graph failed at {moment(failure.at, inputs.now)}"
    summary += " (log attached)" if isinstance(log, str) and log else " (no log)"
    how = ["The compile"]
    if isinstance(record.get("compiler_version"), str):
        how.append(f"under neuronx-cc {record['compiler_version']}")
    code = record.get("exit_code")
    how.append(f"exited with code {code}" if isinstance(code, int) else "failed")
    seconds = record.get("compile_seconds")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        how.append(f"after {duration(seconds)}")
    for name, label in (("host", "on host"), ("job_id", "in job")):
        if isinstance(record.get(name), str):
            how.append(f"{label} {record[name]}")
    sentences = [" ".join(how) + "."]
    if failure.via == "event":
        sentences.append(
            "A client reported it in its events; no failure record, so no log, is kept."
        )
    ttl = inputs.policy.failure_ttl_seconds
    if ttl:
        sentences.append(
            f"A failure is never served: the next run compiles again. Namespace "
            f"{inputs.policy.namespace} keeps failure records for {duration(ttl)}."
        )
    view = dict(record) if failure.via == "record" else {"created_at": failure.at, **record}
    return Finding("failed-before", summary, sentences, {"failure": view})


def _removed(removal: Removal, inputs: Inputs) -> Finding:
    detail = removal.detail
    view = {
        "at": removal.at,
        "namespace": removal.namespace,
        "action": removal.action,
        "reason": str(detail.get("reason", "")),
        "why": str(detail.get("why", "")),
        "actor": removal.actor,
    }
    code, summary, why, advice = _removal_words(removal, inputs.policy)
    use = _use(detail, inputs.now) if "hits" in detail else ""
    sentences = [s for s in (why, use, advice) if s]
    return Finding(code, summary, sentences, {"removed": view})


def _removal_words(removal: Removal, policy: Policy) -> tuple[str, str, str, str]:
    """The reason code, the summary, the sentence saying why, and the one saying what
    to do (either may be empty)."""
    detail = removal.detail
    reason = str(detail.get("reason", ""))
    why = str(detail.get("why", ""))
    when, ns = day(removal.at), removal.namespace
    if removal.action == "evict" and reason == "expired":
        last = detail.get("last_access")
        unused = removal.at - last if isinstance(last, (int, float)) else None
        summary = (
            f"expired after {duration(unused)} unused"
            if unused is not None
            else "expired: unused for longer than its namespace's TTL"
        )
        said = f"Namespace {ns}'s TTL removed it on {when} ({why})."
        return "expired", summary, said, _PIN_OR_TTL
    if removal.action == "evict" and reason == "quota":
        quota = policy.quota_bytes if policy.namespace == ns else None
        advice = _PIN_OR_QUOTA + (f" (now {human_bytes(quota)})." if quota else ".")
        said = _sentence(why) or "The namespace was over its quota."
        return "evicted", f"evicted {when} by namespace {ns}'s quota", said, advice
    if removal.action == "evict" and reason == "compiler-retention":
        return (
            "evicted",
            f"evicted {when} by namespace {ns}'s compiler retention",
            _sentence(why),
            "",
        )
    if removal.action == "expire":
        version = detail.get("compiler_version") or "its compiler"
        said = f"{removal.actor} expired entries: {why}." if why else ""
        return "evicted", f"evicted {when}: an admin retired compiler {version}", said, ""
    return "evicted", f"evicted {when} by {removal.actor}: {why or reason}", "", ""


_PIN_OR_TTL = "Graphs that must stay can be pinned (neffcache admin pin), or ttl_seconds raised."
_PIN_OR_QUOTA = (
    "A quota removes the entries worth least first (compile time saved per byte, recent "
    "use); pin graphs that must stay or raise quota_bytes"
)


def _sentence(text: str) -> str:
    """``text`` as a sentence: its first letter capitalized (only that one: version
    strings keep their case), a full stop at the end; empty stays empty."""
    return f"{text[0].upper()}{text[1:]}." if text else ""


def _use(detail: Mapping[str, Any], now: float) -> str:
    hits = detail.get("hits")
    last = detail.get("last_access")
    if hits == 0:
        return "It was never served after it was published."
    served = f"It had served {plural(hits, 'hit')}" if isinstance(hits, int) else "It was kept"
    if isinstance(last, (int, float)):
        served += f", last used {moment(last, now)}"
    return served + "."


# --- 3. the same key elsewhere


def _elsewhere(inputs: Inputs) -> list[Finding]:
    if inputs.entry is not None or not inputs.elsewhere:
        return []
    ns = inputs.asked.namespace
    first, more = inputs.elsewhere[0], len(inputs.elsewhere) - 1
    summary = f"an entry exists in namespace {first}, which {ns} does not read through"
    if more:
        summary += f" (and in {plural(more, 'other namespace')})"
    sentences = [
        f"To share its entries, add {first} to {ns}'s read_through (neffcache admin "
        f"namespace set {ns} --read-through {first}), or publish this graph in {ns}."
    ]
    return [Finding("other-namespace", summary, sentences)]


# --- 4. the same program under other keys


def differences(components: Mapping[str, Any], variant: Variant) -> list[Difference]:
    """The compared components (``facts.COMPARED``) in which a variant differs from
    the asked ones; a component the asker did not give is not compared."""
    found = []
    for name in COMPARED:
        if name not in components:
            continue
        yours, theirs = _plain(components[name]), _plain(variant.component(name))
        if yours != theirs:
            found.append(Difference(name, yours, theirs))
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    return value


def rank(
    components: Mapping[str, Any], variants: Sequence[Variant], home: str = ""
) -> list[Variant]:
    """Nearest first: fewest differing components, then entries that exist, then the
    components that differ (a compiler difference explains more than a flag), then
    those of the ``home`` namespace, then the newest."""

    def nearness(variant: Variant) -> tuple[int, int, list[int], bool, float]:
        diffs = differences(components, variant)
        kinds = [COMPARED.index(d.component) for d in diffs]
        present = 0 if variant.present else 1
        return (len(diffs), present, kinds, variant.namespace != home, -variant.created_at)

    return sorted(variants, key=nearness)


_PROGRAM_REASONS = {
    "compiler_version": "compiler-changed",
    "flags": "flags-changed",
    "target": "target-changed",
    "env": "env-changed",
    "frameworks": "env-changed",
}


def _program(inputs: Inputs) -> list[Finding]:
    components = inputs.asked.components
    ranked = rank(components, inputs.variants, inputs.asked.namespace)
    best = ranked[0]
    diffs = differences(components, best)
    nearest = [_variant_view(v, differences(components, v)) for v in ranked[:NEAREST_SHOWN]]
    fingerprint = str(components.get("fingerprint", ""))
    keys = plural(len({v.key for v in ranked}), "other key")
    spaces = {v.namespace for v in ranked}
    if len(spaces) > 1:
        keys += f" in {len(spaces)} namespaces"
    known = (
        f"The server knows this program (fingerprint {short(fingerprint)}) under {keys}; "
        f"the nearest, {short(best.key)}, {_status(best)}"
    )
    if not diffs:
        summary = "the same program was compiled before under another key"
        sentences = [
            f"{known}. Give the compiler version, target and flags to compare them "
            "(neffcache explain HLO_FILE --compiler-version V --target T -- FLAG ...)."
        ]
        return [Finding("unknown", summary, sentences, {"nearest": nearest})]
    first = diffs[0]
    lines = [line for diff in diffs for line in _difference_lines(diff)]
    summary = _program_summary(first, lines[0])
    sentences = [f"{known}, and differs in {', '.join(d.component for d in diffs)}."]
    sentences += [_sentence(line) for line in lines]
    if first.component == "compiler_version" and version_order(first.theirs, first.yours) > 0:
        sentences.append(
            "Before the next upgrade, neffcache report upgrade --to-compiler V lists what "
            "will miss, and neffcache prewarm fills caches ahead of jobs."
        )
    if best.seen == "missed":
        sentences.append(
            "That variant was compiled by a client that missed too; it was never published."
        )
    return [Finding(_PROGRAM_REASONS[first.component], summary, sentences, {"nearest": nearest})]


def _program_summary(first: Difference, line: str) -> str:
    if first.component == "compiler_version":
        return compiler_change(str(first.theirs), str(first.yours))
    if first.component == "target":
        return f"same program, target {first.theirs} vs {first.yours}"
    if first.component in ("env", "frameworks"):
        return f"same program, compiler, flags and target; {line}"
    return line


def _difference_lines(diff: Difference) -> list[str]:
    if diff.component == "flags":
        return flag_changes(list(diff.theirs), list(diff.yours))
    if diff.component == "env":
        return mapping_changes(diff.theirs, diff.yours, "variable")
    if diff.component == "frameworks":
        return mapping_changes(diff.theirs, diff.yours, "framework")
    if diff.component == "compiler_version":
        return [f"compiler neuronx-cc {diff.theirs} before, {diff.yours} now"]
    return [f"{diff.component} {diff.theirs} before, {diff.yours} now"]


def _status(variant: Variant) -> str:
    where = f"namespace {variant.namespace}"
    if variant.present:
        return f"has an entry in {where} (published {day(variant.created_at)})"
    if variant.seen == "published":
        return f"was published in {where} on {day(variant.created_at)} and has no entry now"
    return f"missed in {where} on {day(variant.created_at)}"


def _variant_view(variant: Variant, diffs: Sequence[Difference]) -> dict[str, Any]:
    return {
        "key": variant.key,
        "namespace": variant.namespace,
        "present": variant.present,
        "seen": variant.seen,
        "created_at": variant.created_at,
        "model": variant.model or None,
        "compile_seconds": variant.compile_seconds,
        "differences": [d.as_json() for d in diffs],
    }


# --- 5. no variant of the program: the closest other graph


def _graph(inputs: Inputs) -> list[Finding]:
    asked = inputs.asked
    if "fingerprint" not in asked.components or _last_published(inputs) is not None:
        return []  # nothing to compare, or this very key had an entry: not a new program
    for candidate in inputs.graphs:
        if candidate.relation == "structure":
            return [_same_structure(inputs, candidate)]
    for candidate in inputs.graphs:
        return [_same_model(inputs, candidate)]
    summary = _NEVER_SEEN
    if asked.graph is not None:
        summary += "; no graph of the same structure either"
    sentences = [
        "The server's program map holds no other key of this program: its first compile "
        "cannot be avoided, and later runs hit once it is published."
    ]
    return [Finding("new-graph", summary, sentences)]


def _same_structure(inputs: Inputs, other: OtherGraph) -> Finding:
    asked = inputs.asked
    mine = asked.graph.shapes if asked.graph is not None else None
    count = asked.graph.instructions if asked.graph is not None else other.instructions
    view: dict[str, Any] = {
        "instructions": count,
        "differing": None,
        "examples": [],
        "fingerprint": other.fingerprint,
        "relation": "structure",
    }
    where = f"fingerprint {short(other.fingerprint)} in namespace {other.namespace}"
    fields = {"graph": view, "nearest": _graph_nearest(inputs, other)}
    if mine is None or other.shapes is None or len(mine) != len(other.shapes):
        missing = "yours were not sent" if mine is None else "its HLO module is not stored"
        summary = (
            f"{_NEVER_SEEN}; a graph of the same structure ({plural(count or 0, 'instruction')}) "
            "was compiled with other shapes"
        )
        sentences = [f"The closest graph is {where}; its shapes cannot be compared: {missing}."]
        return Finding("shapes-changed", summary, sentences, fields)
    differing = [
        (i, theirs, yours)
        for i, (theirs, yours) in enumerate(zip(other.shapes, mine, strict=True))
        if theirs != yours
    ]
    view["differing"] = len(differing)
    view["examples"] = [
        {"instruction": i, "yours": yours, "theirs": theirs}
        for i, theirs, yours in differing[:EXAMPLES_SHOWN]
    ]
    if not differing:
        summary = (
            f"{_NEVER_SEEN}; the closest graph has the same operations, wiring and shapes: "
            "it differs in constants, layouts or attributes"
        )
        return Finding("graph-changed", summary, [f"The closest graph is {where}."], fields)
    return Finding("shapes-changed", *_shape_words(differing, len(mine), where), fields)


def _shape_words(
    differing: Sequence[tuple[int, str, str]], count: int, where: str
) -> tuple[str, list[str]]:
    whose = "instruction's" if count == 1 else "instructions'"
    summary = f"{_NEVER_SEEN}; closest graph differs in {len(differing)} of {count} {whose} shapes"
    sentences = [f"The closest graph, {where}, has the same operations and wiring."]
    sentences += [
        f"Instruction {i}: {theirs} before, {yours} now."
        for i, theirs, yours in differing[:_ALSO_SHOWN]
    ]
    sentences.append(
        "Shapes that change from step to step (batch size, sequence length) make a new "
        "graph each time: padding them to a few sizes lets later runs hit."
    )
    return summary, sentences


def _same_model(inputs: Inputs, other: OtherGraph) -> Finding:
    asked = inputs.asked
    mine = asked.graph
    theirs_count = other.instructions
    summary = f"{_NEVER_SEEN}; the latest graph of model {other.model} is another program"
    if mine is not None and theirs_count is not None:
        summary += f" ({theirs_count} instructions vs your {mine.instructions})"
    sentences = [
        f"It is fingerprint {short(other.fingerprint)} in namespace {other.namespace}; its "
        "structure (operations or wiring) differs from yours."
    ]
    if mine is not None and mine.shapes is not None and other.shapes is not None:
        changes = opcode_changes(other.shapes, mine.shapes)
        if changes:
            sentences.append(f"Operations, counted: {', '.join(changes)}.")
    view: dict[str, Any] = {
        "instructions": mine.instructions if mine is not None else None,
        "differing": None,
        "examples": [],
        "fingerprint": other.fingerprint,
        "relation": "model",
        "their_instructions": theirs_count,
    }
    return Finding(
        "graph-changed",
        summary,
        sentences,
        {"graph": view, "nearest": _graph_nearest(inputs, other)},
    )


def _graph_nearest(inputs: Inputs, other: OtherGraph) -> list[dict[str, Any]]:
    components = inputs.asked.components
    graph = Difference("fingerprint", components.get("fingerprint"), other.fingerprint)
    return [
        _variant_view(v, [graph, *differences(components, v)])
        for v in rank(components, other.variants, inputs.asked.namespace)[:NEAREST_SHOWN]
    ]


# --- 6. nothing applies


def _unknown(inputs: Inputs) -> Finding:
    asked = inputs.asked
    if asked.key is not None and not asked.components:
        summary = (
            f"no record of key {short(asked.key)} in namespace {asked.namespace}: no entry, "
            "miss event, failure or removal"
        )
    else:
        summary = "nothing to compare: no program fingerprint was given"
    sentences = [
        "The server learns a missed key's components from its clients' events and failure "
        "records; to compare a graph it never saw, explain its HLO file instead "
        "(neffcache explain HLO_FILE --compiler-version V --target T -- FLAG ...)."
    ]
    return Finding("unknown", summary, sentences)
