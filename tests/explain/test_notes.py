"""The program map (explain/notes.py): what publishing and missing write, bounded lists,
compare-and-set under concurrent writers, best-effort on store errors, retention."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from explain.graphs import NEW, Graph, digest, hlo
from support.backends import backends, open_index_of

from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.errors import StoreError
from neffcache.server.explain import hlo as hlo_module
from neffcache.server.explain import notes
from neffcache.server.explain.hlo import hlo_digest, summary_of_blob
from neffcache.server.explain.notes import MissNote, note_misses, note_published
from neffcache.server.index import Entry, Index, open_index
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.manifest import canonical_json

# Notes are stamped with the server's clock; the first note of a process also trims
# records older than notes.RETAIN_SECONDS, so times here are recent ones.
T0 = time.time()


@pytest.fixture(params=backends("memory", "sqlite"))
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    made = open_index_of(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture
def blobs() -> Iterator[MemoryBlobStore]:
    made = MemoryBlobStore()
    yield made
    made.close()


def stored(index: Index, kind: str, namespace: str, name: str) -> list[dict[str, Any]]:
    record = index.get_record(kind, namespace, name)
    assert record is not None, f"no {kind} record {name}"
    value: list[dict[str, Any]] = json.loads(record.value)
    return value


def publish(index: Index, blobs: MemoryBlobStore, graph: Graph, **extra: Any) -> float:
    for data in graph.files(b"neff"):
        staged = blobs.staging_dir() / f"up-{digest(data)}"
        staged.write_bytes(data)
        blobs.commit(staged, digest(data))
    manifest = canonical_json(graph.manifest(b"neff", **extra))
    entry = Entry("team-a", graph.key, manifest, time.time(), "tok-1")
    index.put_entry(entry, ())
    return entry.created_at


def test_a_published_entry_notes_its_variant_structure_and_model(
    index: Index, blobs: MemoryBlobStore
) -> None:
    graph = Graph(hlo("block_a"))
    created = publish(index, blobs, graph, model="llama", compile_seconds=12.5)
    note_published(index, blobs, "team-a", graph.key)
    fingerprint = graph.components["fingerprint"]
    assert stored(index, notes.PROGRAM, "team-a", fingerprint) == [
        {
            "key": graph.key,
            "compiler_version": graph.components["compiler_version"],
            "target": "trn1",
            "flags": ["--model-type=transformer", "--optlevel=1"],
            "env": {},
            "frameworks": {},
            "model": "llama",
            "created_at": created,
            "compile_seconds": 12.5,
            "seen": "published",
        }
    ]
    # The structure comes from the HLO module stored with the entry.
    assert stored(index, notes.STRUCTURE, "team-a", graph.summary.structure) == [
        {"fingerprint": fingerprint, "instructions": 18, "at": created}
    ]
    assert stored(index, notes.MODEL, "team-a", "llama")[0]["structure"] == graph.summary.structure


def test_an_entry_without_its_hlo_notes_only_its_variant(
    index: Index, blobs: MemoryBlobStore
) -> None:
    graph = Graph(hlo("block_a"))
    manifest = graph.manifest(b"neff")
    del manifest["files"]["model.hlo_module.pb"]
    index.put_entry(Entry("team-a", graph.key, canonical_json(manifest), 1.0, "w"), ())
    note_published(index, blobs, "team-a", graph.key)
    assert index.get_record(notes.PROGRAM, "team-a", graph.components["fingerprint"]) is not None
    assert index.records(notes.STRUCTURE) == []


def test_while_published_modules_are_being_parsed_the_next_is_noted_without_one(
    index: Index, blobs: MemoryBlobStore
) -> None:
    # A burst of publishes must not take every shared worker thread parsing modules:
    # past the bound, the entry's variant is still noted, its structure is not.
    graph = Graph(hlo("block_a"))
    publish(index, blobs, graph, model="llama")
    held = 0
    try:
        while notes._parsing.acquire(blocking=False):  # every slot busy elsewhere
            held += 1
        assert held == notes.PUBLISH_PARSES
        note_published(index, blobs, "team-a", graph.key)
    finally:
        for _ in range(held):
            notes._parsing.release()
    assert index.get_record(notes.PROGRAM, "team-a", graph.components["fingerprint"]) is not None
    assert index.records(notes.STRUCTURE) == []
    note_published(index, blobs, "team-a", graph.key)  # a free slot: parsed again
    assert stored(index, notes.STRUCTURE, "team-a", graph.summary.structure) != []


def miss(graph: Graph, at: float, namespace: str = "team-a", model: str = "") -> MissNote:
    components = {**graph.components, "graph": graph.summary.as_json()}
    return MissNote(namespace, graph.key, components, model, at)


def test_misses_note_their_variants_newest_first(index: Index) -> None:
    old = Graph(hlo("block_a"))
    new = old.with_(version=NEW)
    note_misses(index, [miss(old, T0 + 100), miss(new, T0 + 200)])
    items = stored(index, notes.PROGRAM, "team-a", old.components["fingerprint"])
    assert [(i["key"], i["seen"], i["created_at"]) for i in items] == [
        (new.key, "missed", T0 + 200),
        (old.key, "missed", T0 + 100),
    ]
    assert stored(index, notes.STRUCTURE, "team-a", old.summary.structure) == [
        {"fingerprint": old.components["fingerprint"], "instructions": 18, "at": T0 + 200}
    ]


def test_a_miss_of_a_published_key_keeps_it_published(index: Index, blobs: MemoryBlobStore) -> None:
    graph = Graph(hlo("block_a"))
    publish(index, blobs, graph, compile_seconds=7.0)
    note_published(index, blobs, "team-a", graph.key)
    note_misses(index, [miss(graph, time.time() + 10)])
    (item,) = stored(index, notes.PROGRAM, "team-a", graph.components["fingerprint"])
    assert (item["seen"], item["compile_seconds"]) == ("published", 7.0)


def test_a_miss_after_a_publish_keeps_when_it_was_published(
    index: Index, blobs: MemoryBlobStore
) -> None:
    graph = Graph(hlo("block_a"))
    created = publish(index, blobs, graph)
    note_published(index, blobs, "team-a", graph.key)
    note_misses(index, [miss(graph, created + 5 * 86400)])  # evicted since, say
    (item,) = stored(index, notes.PROGRAM, "team-a", graph.components["fingerprint"])
    assert (item["seen"], item["created_at"]) == ("published", created)


def test_variants_are_noted_in_the_spelling_keys_use(index: Index) -> None:
    graph = Graph(hlo("block_a"), target="trn2", env={"XLA_FLAGS": "--xla_cpu_fast_math"})
    typed = {
        **graph.components,
        "flags": ["compile", "--model-type", "transformer", "-O", "1", "--target", "trn2"],
        "env": {"XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_cpu_fast_math"},
    }
    note_misses(index, [MissNote("team-a", graph.key, typed, "", T0)])
    (item,) = stored(index, notes.PROGRAM, "team-a", graph.components["fingerprint"])
    assert item["flags"] == ["--model-type=transformer", "--optlevel=1"]
    assert item["env"] == {"XLA_FLAGS": "--xla_cpu_fast_math"}


def test_components_that_do_not_make_their_key_are_no_variant(index: Index) -> None:
    # The structure is still noted: it does not depend on the key.
    graph = Graph(hlo("block_a"))
    other = graph.with_(version=NEW)
    wrong = {**other.components, "graph": graph.summary.as_json()}
    partial = {"fingerprint": graph.components["fingerprint"], "graph": graph.summary.as_json()}
    note_misses(
        index,
        [
            MissNote("team-a", graph.key, wrong, "", T0),
            MissNote("team-a", graph.key, partial, "", T0),
            MissNote("team-a", "", dict(graph.components), "", T0),  # an event without a key
        ],
    )
    assert index.records(notes.PROGRAM) == []
    assert (
        stored(index, notes.STRUCTURE, "team-a", graph.summary.structure)[0]["fingerprint"]
        == (graph.components["fingerprint"])
    )


def test_lists_keep_the_newest_32_one_per_key(index: Index) -> None:
    base = Graph(hlo("block_a"))
    graphs = [base.with_(flags=(f"--optlevel={n}",)) for n in range(40)]
    note_misses(index, [miss(g, T0 + n) for n, g in enumerate(graphs)])
    note_misses(index, [miss(graphs[39], T0 + 100)])  # the same key again: moved, not repeated
    items = stored(index, notes.PROGRAM, "team-a", base.components["fingerprint"])
    assert len(items) == notes.KEEP
    assert [i["key"] for i in items] == [g.key for g in graphs[39:7:-1]]
    assert items[0]["created_at"] == T0 + 100


def test_what_cannot_be_noted_is_skipped(index: Index) -> None:
    graph = Graph(hlo("block_a"))
    huge = {**graph.components, "flags": ["--x=" + "y" * 10_000]}
    note_misses(
        index,
        [
            MissNote("team-a", graph.key, {"fingerprint": "not hex"}, "", T0),
            MissNote("team-a", graph.key, huge, "", T0),
        ],
    )
    assert index.records(notes.PROGRAM) == []


def test_concurrent_notes_of_one_program_all_land(index: Index) -> None:
    # Compare-and-set: writers racing on one record never lose each other's variant.
    base = Graph(hlo("block_a"))
    graphs = [base.with_(flags=(f"--optlevel={n}",)) for n in range(24)]
    start = threading.Barrier(len(graphs))

    def note(n: int) -> None:
        start.wait()
        note_misses(index, [miss(graphs[n], T0 + n)])

    threads = [threading.Thread(target=note, args=(n,)) for n in range(len(graphs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    items = stored(index, notes.PROGRAM, "team-a", base.components["fingerprint"])
    assert {i["key"] for i in items} == {g.key for g in graphs}


def test_concurrent_notes_all_land_on_redis(redis_server: str) -> None:
    # Over a network every round trip leaves room for another writer: retrying at
    # once, 32 writers of one program lost several of their notes.
    import redis

    with redis.Redis.from_url(redis_server) as connection:
        connection.flushdb()
    index = open_index(redis_server)
    base = Graph(hlo("block_a"))
    graphs = [base.with_(flags=(f"--optlevel={n}",)) for n in range(notes.KEEP)]
    start = threading.Barrier(len(graphs))

    def note(n: int) -> None:
        start.wait()
        note_misses(index, [miss(graphs[n], T0 + n, model="llama")])

    threads = [threading.Thread(target=note, args=(n,)) for n in range(len(graphs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        items = stored(index, notes.PROGRAM, "team-a", base.components["fingerprint"])
        assert {i["key"] for i in items} == {g.key for g in graphs}
    finally:
        index.close()


class BrokenIndex(MemoryIndex):
    def get_record(self, kind: str, namespace: str, name: str) -> Any:
        raise StoreError("index down")

    def get_entry(self, namespace: str, key: str) -> Any:
        raise StoreError("index down")


def test_notes_are_best_effort(blobs: MemoryBlobStore) -> None:
    graph = Graph(hlo("block_a"))
    note_misses(BrokenIndex(), [miss(graph, T0)])  # logged, not raised
    note_published(BrokenIndex(), blobs, "team-a", graph.key)


def test_trim_drops_old_records_and_bounds_each_kind(index: Index) -> None:
    base = Graph(hlo("block_a"))
    others = [Graph(hlo(name)) for name in ("variant_op", "variant_dtype", "allreduce_groups_pair")]
    note_misses(index, [miss(base, T0)])
    note_misses(index, [miss(g, T0 + 1000 + n, "team-b") for n, g in enumerate(others)])
    # Base's program and structure records, and team-b's oldest program record (its
    # structure records are three distinct ones too: the oldest goes).
    assert notes.trim(index, before=T0 + 500, keep=2) == 4
    kept = {(r.namespace, r.name) for r in index.records(notes.PROGRAM)}
    assert kept == {("team-b", g.components["fingerprint"]) for g in others[1:]}
    assert index.records(notes.STRUCTURE, "team-a") == []


def test_trim_runs_at_most_once_per_interval(index: Index) -> None:
    graph = Graph(hlo("block_a"))
    long_ago = T0 - notes.RETAIN_SECONDS - 60
    note_misses(index, [miss(graph, long_ago)])  # trims first (nothing yet), then notes
    assert len(index.records(notes.PROGRAM)) == 1
    later = time.time() + notes.TRIM_EVERY_SECONDS + 1
    notes.maybe_trim(index, later)  # due again: the old record goes
    assert index.records(notes.PROGRAM) == []
    note_misses(index, [miss(graph, long_ago)])
    notes.maybe_trim(index, later + 60)  # too soon: kept
    assert len(index.records(notes.PROGRAM)) == 1


class CountingBlobStore(MemoryBlobStore):
    """Counts reads; the first one waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.release = threading.Event()

    def read(self, digest: str) -> Any:
        self.reads += 1
        self.release.wait(10)
        return super().read(digest)


def test_concurrent_explanations_read_one_stored_module_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hlo_module, "_cache", OrderedDict())  # nothing summarized yet
    blobs = CountingBlobStore()
    module = hlo("variant_shape")
    staged = blobs.staging_dir() / "up"
    staged.write_bytes(module)
    blobs.commit(staged, digest(module))
    started = threading.Barrier(5)
    found: list[Any] = []

    def ask() -> None:
        started.wait()
        found.append(summary_of_blob(blobs, digest(module)))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    time.sleep(0.2)  # the askers reach the read, or wait for it (either way: one read)
    blobs.release.set()
    for thread in threads:
        thread.join()
    assert blobs.reads == 1
    assert len(found) == 4
    assert len({s.structure for s in found}) == 1
    blobs.close()


def test_a_stored_module_that_is_not_hlo_or_fails_its_digest_is_not_summarized(
    blobs: MemoryBlobStore,
) -> None:
    garbage = b"not a module at all"
    staged = blobs.staging_dir() / "up"
    staged.write_bytes(garbage)
    blobs.commit(staged, digest(garbage))
    assert summary_of_blob(blobs, digest(garbage)) is None
    forged = digest(b"other bytes")
    staged.write_bytes(hlo("block_a"))
    blobs.commit(staged, forged)  # stored under a digest its bytes do not have
    assert summary_of_blob(blobs, forged) is None
    assert summary_of_blob(blobs, digest(b"absent")) is None
    assert hlo_digest({"files": {"model.hlo_module.pb": {"digest": "d", "size": 2**40}}}) is None
