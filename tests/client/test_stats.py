"""``neffcache stats`` and the host's counters in L1 (docs/client.md, "Stats").

* A scripted job through the real wrapper, the hook and the stand-in compiler against
  a real ``neffcache serve``, every graph into one L1 and one run manifest: the
  counters ``stats --json`` prints are what the run manifest says (hits by source,
  compiles, failed compiles, misses by reason, fall-backs, fetched bytes and times),
  and the server's view (``GET /v1/status``) counts the same graphs from telemetry.
* Concurrent processes appending while others fold: no count lost or doubled, and
  the files stay bounded.
* ``--zero`` resets the counters, not L1; corrupt records and a corrupt summary are
  skipped, never a crash; a fold that died half-way counts nothing twice; an L1 that
  cannot be written records nothing and fails nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.e2e import (
    BLOCK_A,
    BLOCK_B,
    NEFFCACHE,
    OTHER,
    VARIANT,
    Done,
    Sandbox,
    Server,
    compile_args,
    read_run_manifest,
    wait_for,
)

from neffcache.client import hoststats, hosttally
from neffcache.client.cli import main
from neffcache.client.stats import STATS

# docs/client.md: a miss the cache could not help with for a reason of the client's own.
FALLBACKS = {"server-unavailable", "unkeyable", "uncached", "failed-before"}
HIT = {"result": "hit", "source": "l1", "fetch_seconds": 0.001, "saved_seconds": 10.0, "bytes": 7}


def stats(sandbox: Sandbox, env: Mapping[str, str], *args: str) -> dict[str, Any]:
    done = sandbox.run([*NEFFCACHE, "stats", "--json", *args], env)
    assert done.returncode == 0, done.describe()
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def expected(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """What the counters must say of a run manifest: every line but the hook's that
    say ``resolved_by`` (the wrapper's line counts that graph)."""
    counted = [line for line in lines if "resolved_by" not in line]
    hits = [line for line in counted if line["result"] == "hit"]
    misses = [line for line in counted if line["result"] == "miss"]
    reasons = Counter(line["reason"] for line in misses)
    by_source = Counter(line["source"] for line in hits)
    return {
        "graphs": len(counted),
        "hits_l1": by_source["l1"],
        "hits_server": by_source["server"],
        "misses": len(misses),
        "compiles": sum(line["outcome"] == "ok" for line in misses),
        "compile_failures": sum(line["outcome"] == "failed" for line in misses),
        "failures_replayed": sum(line["outcome"] is None for line in misses),
        "miss_reasons": dict(reasons),
        "fallback_reasons": {r: n for r, n in reasons.items() if r in FALLBACKS},
        "fallbacks": sum(n for r, n in reasons.items() if r in FALLBACKS),
        "bytes_fetched": sum(line["bytes"] for line in hits if line["source"] == "server"),
        "skipped_records": 0,
    }


def approx_sum(lines: list[dict[str, Any]], result: str, name: str) -> Any:
    """The sum of a figure over the counted lines of ``result``."""
    counted = [line for line in lines if "resolved_by" not in line]
    total = sum(line[name] or 0 for line in counted if line["result"] == result)
    return pytest.approx(total, abs=0.01)


# --- a job through the real client ------------------------------------------------------


@pytest.mark.e2e
def test_a_jobs_counters_are_what_its_run_manifest_says(
    server: Server, sandbox: Sandbox, unused_port: int
) -> None:
    url = server.cache_url(sandbox.namespace)
    # Another host compiles BLOCK_A first (its own L1; no events: not this host's).
    other = sandbox.env(l1=sandbox.new_dir("l1"), url=url, extra={"NEFFCACHE_TELEMETRY": "0"})
    sandbox.wrap(other, BLOCK_A, sandbox.new_dir("out") / "model.neff").check()

    l1 = sandbox.new_dir("l1")
    manifest = sandbox.root / "run.jsonl"
    down = f"neffcache+http://127.0.0.1:{unused_port}/{sandbox.namespace}"

    def env(cache: str = url, **extra: str) -> dict[str, str]:
        more = {"NEFFCACHE_RUN_MANIFEST": str(manifest), "NEFFCACHE_BACKOFF": "0", **extra}
        return sandbox.env(l1=l1, url=cache, extra=more)

    def wrap(name: str, environment: dict[str, str]) -> Done:
        return sandbox.wrap(environment, name, sandbox.new_dir("out") / "model.neff")

    wrap(BLOCK_A, env()).check()  # a server hit
    wrap(BLOCK_A, env()).check()  # an L1 hit
    wrap(VARIANT, env()).check()  # compiled
    assert wrap(OTHER, env(NEFFCACHE_STANDIN_FAIL="1")).returncode == 70  # failed
    wrap("variant_dtype", env(down)).check()  # compiled: the server could not be asked
    opaque = sandbox.root / "opaque.bin"
    opaque.write_bytes(b"\x00 not a graph \xff" * 64)
    argv = [*NEFFCACHE, "wrap", "--", "neuronx-cc"]
    argv += compile_args(opaque, sandbox.new_dir("out") / "model.neff")
    sandbox.run(argv, env()).check()  # a fall-back: not keyable
    # The hook with the shim: the SDK's compile runs the shim, which finds BLOCK_B's
    # program in L1; the hook's line for it says resolved_by and is not counted.
    recorded = {"NEFFCACHE_RUN_MANIFEST": str(manifest), "NEFFCACHE_BACKOFF": "0"}
    hooked = sandbox.env(l1=l1, url=url, hook=True, shim=True, extra=recorded)
    sandbox.train(hooked, [BLOCK_B]).done.check()
    # The hook alone, again: its stock entry is in L1 now, a hook hit.
    hook_only = sandbox.env(l1=l1, url=url, hook=True, extra=recorded)
    sandbox.train(hook_only, [BLOCK_B]).done.check()

    lines = read_run_manifest(manifest)
    want = expected(lines)
    assert want["hits_l1"] >= 3, lines
    assert want["hits_server"] >= 1, lines
    assert want["compiles"] >= 2, lines
    assert want["compile_failures"] == 1, lines
    assert {"unkeyable", "server-unavailable"} <= set(want["fallback_reasons"]), lines
    assert any("resolved_by" in line for line in lines), "the hook's line was not written"
    assert any(line["via"] == "hook" and line["result"] == "hit" for line in lines), lines

    shown = stats(sandbox, env())
    counters = shown["counters"]
    assert {name: counters[name] for name in want} == want
    assert counters["fetch_seconds"] == approx_sum(lines, "hit", "fetch_seconds")
    assert counters["saved_seconds"] == approx_sum(lines, "hit", "saved_seconds")
    assert counters["compile_seconds"] == approx_sum(lines, "miss", "compile_seconds")
    assert counters["summary_lost"] is False
    assert counters["updated_at"] is not None
    assert shown["l1"]["directory"] == str(l1)
    assert shown["l1"]["entries"] >= 3
    assert shown["l1"]["bytes"] > 0
    assert shown["l1"]["writable"] is True

    # The server's view: its clients' graph events of the namespace, here every counted
    # line but the one whose server could not be reached (its event went nowhere).
    sent = [line for line in lines if "resolved_by" not in line]
    live = [line for line in sent if line["reason"] != "server-unavailable"]
    assert len(sent) - len(live) == 1, sent
    hits = sum(line["result"] == "hit" for line in live)

    def lookups() -> dict[str, Any]:
        answer = server.get(f"/v1/status?namespace={sandbox.namespace}&window=3600")
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()["namespace"]["lookups"]
        return found

    wait_for(lambda: sum(lookups().values()) >= len(live), 30, "the job's events")
    assert lookups() == {"hits": hits, "misses": len(live) - hits}
    status = stats(sandbox, env())["server"]
    assert status["error"] is None
    assert status["url"] == url
    assert status["status"]["server"]["auth"] == "open"
    assert status["status"]["caller"] == {
        "name": "anonymous",
        "scope": "admin",
        "namespaces": ["*"],
        "trusted": True,
    }
    view = status["status"]["namespace"]
    assert view["name"] == sandbox.namespace
    assert view["exists"] is True
    assert view["lookups"] == {"hits": hits, "misses": len(live) - hits}

    table = sandbox.run([*NEFFCACHE, "stats"], env()).check().stdout
    assert "Graphs:" in table
    assert f" {want['graphs']}\n" in table.splitlines(True)[0]
    assert "Server:" in table
    assert "hit rate (7.0 d):" in table


# --- concurrency ------------------------------------------------------------------------

_APPENDER = textwrap.dedent(
    """
    import sys
    from neffcache.client import hoststats, hosttally
    hoststats.FOLD_AT = 2048  # fold every ~60 records: appends and folds meet often
    local_dir, n, me = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    kinds = [("hit", "l1"), ("hit", "server"), ("miss", "compiler")]
    for i in range(n):
        result, source = kinds[(i + me) % 3]
        fields = {"result": result, "source": source, "outcome": "ok", "bytes": 1,
                  "fetch_seconds": 0.5, "saved_seconds": 2.0, "compile_seconds": 3.0,
                  "reason": "new-graph"}
        hoststats.count(local_dir, fields)
        if i % 50 == me % 50:
            hosttally.fold(local_dir)  # as `neffcache stats` does, meanwhile
    from neffcache.client.stats import STATS
    sys.exit(1 if STATS.snapshot().get("host_stats_errors") else 0)
    """
)


@pytest.mark.e2e
def test_concurrent_processes_lose_no_counts(tmp_path: Path) -> None:
    processes, each = 8, 200
    children = [
        subprocess.Popen([sys.executable, "-c", _APPENDER, str(tmp_path), str(each), str(me)])
        for me in range(processes)
    ]
    assert [child.wait(timeout=120) for child in children] == [0] * processes
    tally = hosttally.read(str(tmp_path)).tally
    total = processes * each
    assert sum(tally.kinds.values()) == total
    assert tally.skipped == 0
    # Each process did its share of each kind, whatever interleaving.
    assert tally.kinds["l1"] + tally.kinds["server"] + tally.kinds["compiled"] == total
    hits = tally.kinds["l1"] + tally.kinds["server"]
    assert tally.fetch_seconds == pytest.approx(0.5 * hits)
    assert tally.saved_seconds == pytest.approx(2.0 * hits)
    assert tally.compile_seconds == pytest.approx(3.0 * tally.kinds["compiled"])
    assert tally.bytes_fetched == tally.kinds["server"]
    assert tally.reasons == {"new-graph": tally.kinds["compiled"]}
    # Bounded: a log shorter than a fold's threshold plus a few records, no leftovers.
    hosttally.fold(str(tmp_path))
    directory = Path(hoststats.stats_dir(str(tmp_path)))
    assert sorted(p.name for p in directory.iterdir()) == ["summary.json"]
    assert sum(hosttally.read(str(tmp_path)).tally.kinds.values()) == total


# --- --zero, corruption, crashes, bounds ------------------------------------------------


def _count(local_dir: Path, n: int, **fields: Any) -> None:
    for _ in range(n):
        hoststats.count(str(local_dir), {**HIT, **fields})


@pytest.mark.e2e
def test_zero_resets_the_counters_not_l1(sandbox: Sandbox) -> None:
    l1 = sandbox.new_dir("l1")
    blob = l1 / ".neffcache" / "blobs" / "ab" / ("ab" * 32)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"a NEFF")
    _count(l1, 5)
    env = sandbox.env(l1=l1)
    assert stats(sandbox, env)["counters"]["hits_l1"] == 5

    zeroed = sandbox.run([*NEFFCACHE, "stats", "--zero", "--json"], env)
    assert zeroed.returncode == 0, zeroed.describe()
    assert "counters zeroed" in zeroed.stderr
    shown = json.loads(zeroed.stdout)
    assert shown["counters"]["graphs"] == 0
    assert shown["counters"]["zeroed_at"] is not None
    assert shown["l1"]["blobs"] == 1
    assert blob.read_bytes() == b"a NEFF"

    _count(l1, 2)
    after = stats(sandbox, env)["counters"]
    assert after["graphs"] == 2
    assert after["zeroed_at"] == shown["counters"]["zeroed_at"]


def test_zero_refuses_a_read_only_l1_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    l1 = tmp_path / "baked"
    _count(l1, 3)
    before = sorted(p.name for p in l1.rglob("*"))
    for name in [n for n in os.environ if n.startswith("NEFFCACHE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("NEFFCACHE_LOCAL_DIR", str(l1))
    monkeypatch.setenv("NEFFCACHE_LOCAL_READ_ONLY", "1")
    assert main(["stats", "--zero"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "neffcache stats: cannot zero the counters: L1 is declared read-only "
        "(NEFFCACHE_LOCAL_READ_ONLY)"
    ]
    assert sorted(p.name for p in l1.rglob("*")) == before


@pytest.mark.e2e
def test_corrupt_records_and_summary_are_skipped(sandbox: Sandbox) -> None:
    l1 = sandbox.new_dir("l1")
    _count(l1, 3)
    directory = Path(hoststats.stats_dir(str(l1)))
    garbage = [
        b"\x00\xff\xfe binary",
        b"2 l1 - 0.1 1.0 5",  # another version
        b"1 l1 - nan 1.0 5",
        b"1 l1 - -1 1.0 5",
        b"1 server - 0.1 1e300 5",
        b"1 compiled - 0.1 1.0 5",  # a miss without a reason
        b"1 l1 new-graph 0.1 1.0 5",  # a hit with one
        b"1 teleported - 0.1 1.0 5",
        b"1 compiled NEW_GRAPH 0.1 1.0 5",
        b"1 l1 - 0.1 1.0 5 extra",
        b"1 l1 - 0.1 1.0 -5",
        b"{" * 5000,
    ]
    with open(directory / "log", "ab") as log:
        log.write(b"\n".join(garbage) + b"\n1 l1 - 0.1 1.0 5\n1 server - 0.1 1")  # torn tail
    env = sandbox.env(l1=l1)
    counters = stats(sandbox, env)["counters"]
    assert counters["hits_l1"] == 4
    assert counters["graphs"] == 4
    assert counters["skipped_records"] == len(garbage)

    (directory / "summary.json").write_bytes(b'{"version": 1, "kinds": {"l1": -3}}')
    _count(l1, 1)
    again = sandbox.run([*NEFFCACHE, "stats", "--json"], env)
    assert again.returncode == 0, again.describe()
    counters = json.loads(again.stdout)["counters"]
    assert counters["summary_lost"] is True or "could not be read" in again.stderr
    assert counters["hits_l1"] == 1  # what the log held since; the rest is gone, not faked
    table = sandbox.run([*NEFFCACHE, "stats"], env).check()
    assert "Graphs:" in table.stdout


@pytest.mark.parametrize("summary", [b"", b"[]", b"null", b'{"version": 1}', b"\xff" * 10])
def test_a_summary_that_is_not_one_counts_as_none(tmp_path: Path, summary: bytes) -> None:
    _count(tmp_path, 2)
    directory = Path(hoststats.stats_dir(str(tmp_path)))
    (directory / "summary.json").write_bytes(summary)
    found = hosttally.read(str(tmp_path))
    assert found.summary_lost is True
    assert found.tally.kinds["l1"] == 2


def test_a_fold_that_died_counts_nothing_twice(tmp_path: Path) -> None:
    _count(tmp_path, 2)
    hosttally.fold(str(tmp_path))
    directory = Path(hoststats.stats_dir(str(tmp_path)))
    summary = json.loads((directory / "summary.json").read_text())
    # Died after writing the summary: its log is left, named in the summary.
    (directory / "folding-1.aa").write_bytes(b"1 l1 - 0.1 1.0 5\n" * 7)
    summary["folded"] = ["folding-1.aa"]
    (directory / "summary.json").write_text(json.dumps(summary))
    # Died before writing it: its log is left, named nowhere.
    (directory / "folding-2.bb").write_bytes(b"1 server - 0.1 1.0 5\n" * 3)
    _count(tmp_path, 1)
    read = hosttally.read(str(tmp_path)).tally
    assert (read.kinds["l1"], read.kinds["server"]) == (3, 3)
    hosttally.fold(str(tmp_path))
    assert sorted(p.name for p in directory.iterdir()) == ["summary.json"]
    folded = hosttally.read(str(tmp_path)).tally
    assert (folded.kinds["l1"], folded.kinds["server"]) == (3, 3)


def test_reasons_are_bounded(tmp_path: Path) -> None:
    for i in range(hosttally.MAX_REASONS + 10):
        hoststats.count(str(tmp_path), {"result": "miss", "outcome": "ok", "reason": f"r{i}"})
    tally = hosttally.read(str(tmp_path)).tally
    assert len(tally.reasons) == hosttally.MAX_REASONS
    assert sum(tally.reasons.values()) == hosttally.MAX_REASONS + 10
    assert tally.reasons[hosttally.OTHER] == 11


def test_a_log_past_its_cap_takes_no_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hoststats, "CAP", 200)
    monkeypatch.setattr(hoststats, "FOLD_AT", 1 << 30)  # folding is failing
    errors = STATS.snapshot().get("host_stats_errors", 0)
    _count(tmp_path, 20)
    log = Path(hoststats.stats_dir(str(tmp_path))) / "log"
    assert log.stat().st_size < 200 + 64
    assert STATS.snapshot().get("host_stats_errors", 0) > errors


@pytest.mark.e2e
def test_an_l1_that_cannot_be_written_records_nothing_and_fails_nothing(
    sandbox: Sandbox,
) -> None:
    not_a_dir = sandbox.root / "l1-is-a-file"
    not_a_dir.write_text("")
    errors = STATS.snapshot().get("host_stats_errors", 0)
    hoststats.count(str(not_a_dir), HIT)
    assert STATS.snapshot().get("host_stats_errors", 0) == errors + 1
    shown = stats(sandbox, sandbox.env(l1=not_a_dir))
    assert shown["counters"]["graphs"] == 0
    assert shown["l1"]["writable"] is False
    zero = sandbox.run([*NEFFCACHE, "stats", "--zero"], sandbox.env(l1=not_a_dir))
    assert zero.returncode == 1, zero.describe()
    assert "cannot zero" in zero.stderr


def test_graphs_that_are_no_outcome_are_not_counted(tmp_path: Path) -> None:
    for fields in ({}, {"result": "hit", "source": "compiler"}, {"result": "maybe"}):
        hoststats.count(str(tmp_path), fields)
    assert not Path(hoststats.stats_dir(str(tmp_path)), "log").exists()


# --- the command ------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_server_that_cannot_answer_is_one_line_and_exit_1_after_the_hosts_part(
    sandbox: Sandbox, unused_port: int
) -> None:
    l1 = sandbox.new_dir("l1")
    _count(l1, 1)
    url = f"neffcache+http://127.0.0.1:{unused_port}/team-a"
    done = sandbox.run([*NEFFCACHE, "stats"], sandbox.env(l1=l1, url=url, url_var="NEFFCACHE_URL"))
    assert done.returncode == 1, done.describe()
    server_lines = [line for line in done.stdout.splitlines() if line.startswith("Server:")]
    assert len(server_lines) == 1
    assert "cannot reach" in server_lines[0]
    assert "Graphs:" in done.stdout
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"neffcache stats: cannot reach http://127.0.0.1:{unused_port}")


@pytest.mark.e2e
def test_the_server_option_names_the_server_and_namespace(server: Server, sandbox: Sandbox) -> None:
    l1 = sandbox.new_dir("l1")
    env = sandbox.env(l1=l1)
    direct = httpx.get(f"{server.url}/v1/status?namespace=NO", timeout=10, trust_env=False)
    assert direct.status_code == 400
    shown = stats(sandbox, env, "--server", server.cache_url(sandbox.namespace))
    assert shown["server"]["error"] is None
    assert shown["server"]["status"]["namespace"]["exists"] is False


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args",
    [
        ["--window", "0"],
        ["--window", "91d"],
        ["--window", "soon"],
        ["--server", "http://127.0.0.1:1"],  # no namespace to show
        ["--server", "neffcache+http://127.0.0.1:1/Not_A_Namespace"],
        ["--", "unexpected"],
    ],
)
def test_bad_input_is_exit_2(sandbox: Sandbox, args: list[str]) -> None:
    done = sandbox.run([*NEFFCACHE, "stats", *args], sandbox.env(l1=sandbox.new_dir("l1")))
    assert done.returncode == 2, done.describe()
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.e2e
def test_a_bad_size_limit_is_exit_2(sandbox: Sandbox) -> None:
    env = sandbox.env(l1=sandbox.new_dir("l1"), extra={"NEFFCACHE_LOCAL_MAX_SIZE": "lots"})
    done = sandbox.run([*NEFFCACHE, "stats"], env)
    assert done.returncode == 2, done.describe()
    assert "NEFFCACHE_LOCAL_MAX_SIZE" in done.stderr


@pytest.mark.e2e
def test_reading_makes_no_directory(sandbox: Sandbox) -> None:
    l1 = sandbox.root / "never-made"
    shown = stats(sandbox, sandbox.env(l1=l1))
    assert shown["counters"]["graphs"] == 0
    assert not l1.exists()
    assert os.path.isdir(sandbox.root)


@pytest.mark.parametrize(
    ("fields", "record"),
    [
        (HIT, b"1 l1 - 0.001000 10.000 7\n"),
        ({"result": "hit", "source": "server", "bytes": 5}, b"1 server - 0.000000 0.000 5\n"),
        (
            {"result": "miss", "outcome": "ok", "reason": "new-graph", "compile_seconds": 2.5},
            b"1 compiled new-graph 0.000000 2.500 0\n",
        ),
        ({"result": "miss", "outcome": "failed", "reason": None}, b"1 failed unknown 0.0"),
        ({"result": "miss", "reason": "failed-before"}, b"1 replayed failed-before 0.0"),
        ({"result": "miss", "reason": "Bad Reason"}, b"1 replayed unknown 0.0"),
        ({**HIT, "fetch_seconds": float("nan"), "bytes": True}, b"1 l1 - 0.000000 10.000 0\n"),
    ],
)
def test_a_record_is_the_run_manifest_lines_outcome(fields: dict[str, Any], record: bytes) -> None:
    encoded = hoststats.encode(fields)
    assert encoded is not None
    assert encoded.startswith(record)
    tally = hosttally.Tally()
    tally.add_log(encoded)
    assert tally.skipped == 0
    assert sum(tally.kinds.values()) == 1
