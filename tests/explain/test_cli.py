"""``neffcache explain`` end to end: the CLI in a subprocess against a real
``neffcache serve`` on 127.0.0.1, one namespace per scenario. Each explanation the CLI
prints is saved as a test artifact (``$NEFFCACHE_TEST_ARTIFACTS``, else
``build/test-artifacts``) under ``explain/``."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from explain.graphs import NEW, Graph, digest, hlo
from hlo_edit import RawModule, field, varint
from loopback import free_port
from support import served
from support.served import NEFFCACHE, until

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("NEFFCACHE_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts")
BLOCK = Graph(hlo("block_a"))
FLAGS = ["--model-type=transformer", "-O1"]  # BLOCK's flags, as a user types them


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without neffcache's, Neuron's and XLA's variables (they would
    change the keys the CLI computes), plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NEFFCACHE_", "NEURON_")) and k != "XLA_FLAGS"
    }
    env.update(extra)
    return env


class Server(served.Server):
    """``neffcache serve`` (support/served.py's) in ``clean_env()``, with no
    maintenance passes and no grace for unreferenced blobs; it publishes graphs and
    asks what the server explains."""

    def __init__(self, data_dir: Path) -> None:
        settings = {"NEFFCACHE_EVICTION_INTERVAL_SECONDS": "0", "NEFFCACHE_BLOB_GRACE_SECONDS": "0"}
        super().__init__(data_dir, settings, environ=clean_env())

    def publish(self, namespace: str, graph: Graph, neff: bytes = b"neff") -> None:
        for data in graph.files(neff):
            stored = self.http.put(f"/v1/blobs/{digest(data)}", content=data)
            assert stored.status_code in (200, 201), stored.text
        done = self.http.put(f"/v1/ns/{namespace}/entries/{graph.key}", json=graph.manifest(neff))
        assert done.status_code == 201, done.text

    def reason(self, namespace: str, graph: Graph) -> str:
        answer = self.http.post(f"/v1/ns/{namespace}/explain", json=graph.request())
        assert answer.status_code == 200, answer.text
        return str(answer.json()["reason"])

    def noted(self, namespace: str, graph: Graph, reason: str) -> None:
        """Wait until the server explains ``graph`` with ``reason``: the program map is
        written after a publish is answered."""
        until(lambda: self.reason(namespace, graph) == reason, 10, f"never {reason}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = Server(tmp_path_factory.mktemp("serve") / "data")
    started.start()
    yield started
    started.stop()


def explain(
    server: Server, namespace: str, *args: str, artifact: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = clean_env(NEFFCACHE_URL=f"neffcache+{server.url}/{namespace}")
    done = subprocess.run(
        [*NEFFCACHE, "explain", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if artifact is not None:
        folder = ARTIFACTS / "explain"
        folder.mkdir(parents=True, exist_ok=True)
        command = " ".join(
            ["neffcache", "explain", *(Path(a).name if "/" in a else a for a in args)]
        )
        (folder / f"{artifact}.txt").write_text(f"$ {command}\n{done.stdout}{done.stderr}")
    return done


def fixture_file(name: str) -> str:
    return str(Path(__file__).resolve().parents[1] / "fixtures" / "hlo" / f"{name}.pb")


def first_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n", 1)[0]


@pytest.mark.e2e
def test_compiler_upgrade(server: Server) -> None:
    server.publish("upgrade", BLOCK)
    server.noted("upgrade", BLOCK.with_(version=NEW), "compiler-changed")
    done = explain(
        server,
        "upgrade",
        fixture_file("block_a"),
        "--compiler-version",
        NEW,
        "--target",
        "trn1",
        "--",
        *FLAGS,
        artifact="compiler-upgrade",
    )
    assert first_line(done) == (
        "compiled before under neuronx-cc 2.20.9961.0; you have 2.21.1.0: a compiler upgrade "
        "misses every graph"
    )
    assert "reason: compiler-changed" in done.stdout
    assert f"compiler_version: {BLOCK.components['compiler_version']} vs {NEW}" in done.stdout


@pytest.mark.e2e
def test_flag_change(server: Server) -> None:
    server.publish("flags", BLOCK)
    server.noted("flags", BLOCK.with_(target="trn2"), "target-changed")
    done = explain(
        server,
        "flags",
        fixture_file("block_a"),
        "--compiler-version",
        BLOCK.components["compiler_version"],
        "--target",
        "trn1",
        "--",
        "--model-type=transformer",
        "-O2",
        artifact="flag-change",
    )
    assert first_line(done) == "flag --optlevel differs: 1 vs 2"


@pytest.mark.e2e
def test_target_change(server: Server) -> None:
    server.publish("target", BLOCK)
    server.noted("target", BLOCK.with_(target="trn2"), "target-changed")
    done = explain(
        server,
        "target",
        fixture_file("block_a"),
        "--compiler-version",
        BLOCK.components["compiler_version"],
        "--target",
        "trn2",
        "--",
        *FLAGS,
        artifact="target-change",
    )
    assert first_line(done) == "same program, target trn1 vs trn2"


@pytest.mark.e2e
def test_evicted_by_quota(server: Server) -> None:
    made = server.http.post(
        "/v1/admin/namespaces/quota", json={"quota_bytes": 5000, "ranking": "lru"}
    )
    assert made.status_code == 201, made.text
    first, second = BLOCK.with_(target="inf2"), BLOCK.with_(target="trn3")
    server.publish("quota", first, neff=b"a" * 1000)
    server.publish("quota", second, neff=b"b" * 1000)
    done = server.http.post("/v1/admin/evict", json={"dry_run": False})
    assert done.status_code == 200, done.text
    assert [e["key"] for e in done.json()["removed"]["entries"]] == [first.key]
    shown = explain(server, "quota", first.key, artifact="evicted-by-quota")
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert first_line(shown) == f"evicted {today} by namespace quota's quota"
    assert "removed: " in shown.stdout


@pytest.mark.e2e
def test_failed_before_prints_the_log_tail(server: Server) -> None:
    failing = BLOCK.with_(version=NEW)
    log = "".join(f"pass {n}: ok\n" for n in range(40)) + "ERROR: NCC_EVRF009 out of memory\n"
    report = {"compiler_version": NEW, "exit_code": 70, "log": log, "host": "ip-10-0-0-7"}
    put = server.http.put(f"/v1/ns/failed/failures/{failing.key}", json=report)
    assert put.status_code == 201, put.text
    done = explain(server, "failed", failing.key, artifact="failed-before")
    assert first_line(done).startswith("last compile of this graph failed at ")
    assert first_line(done).endswith(" UTC (log attached)")
    tail = done.stdout.split("log (last 30 lines):\n", 1)[1]
    assert tail.rstrip().endswith("ERROR: NCC_EVRF009 out of memory")
    assert "pass 10: ok" not in tail  # only the tail
    assert "exit_code: 70" in done.stdout


def _shape_variant(tmp: Path) -> Path:
    """block_a with the dot's and the tanh's shapes widened to f32[8,32,2]: a second
    shape field (3) holding one more dimension (3) merges into the first."""
    module = RawModule()
    module.ParseFromString(hlo("block_a"))
    entry = module.computations[-1]
    for i in (2, 9):  # the dot and the tanh
        entry.instructions[i] += b"\x1a\x02\x18\x02"
    path = tmp / "block_a_wider.hlo_module.pb"
    path.write_bytes(module.SerializeToString())
    return path


@pytest.mark.e2e
def test_never_seen_closest_graph_differs_in_two_shapes(server: Server, tmp_path: Path) -> None:
    server.publish("shapes", BLOCK)
    wider = _shape_variant(tmp_path)
    server.noted("shapes", BLOCK.with_(module=wider.read_bytes()), "shapes-changed")
    args = [str(wider), "--compiler-version", BLOCK.components["compiler_version"]]
    args += ["--target", "trn1", "--", *FLAGS]
    done = explain(server, "shapes", *args, artifact="never-seen-shapes")
    assert first_line(done) == (
        "never seen: no entry shares this program's fingerprint; closest graph differs in "
        "2 of 18 instructions' shapes"
    )
    assert "#5: dot f32[8,32] -> dot f32[8,32,2]" in done.stdout
    assert "#12: tanh f32[8,32] -> tanh f32[8,32,2]" in done.stdout
    as_json = explain(server, "shapes", *args[:1], "--json", *args[1:])
    answer: dict[str, Any] = json.loads(as_json.stdout)
    assert (answer["reason"], answer["graph"]["differing"]) == ("shapes-changed", 2)


@pytest.mark.e2e
def test_an_unknown_key_is_explained_not_an_error(server: Server) -> None:
    done = explain(server, "nobody", "0" * 64, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reason"] == "unknown"


@pytest.mark.e2e
def test_namespace_option_overrides_the_url(server: Server) -> None:
    server.publish("elsewhere", BLOCK)
    done = explain(server, "upgrade-not-this", BLOCK.key, "--namespace", "elsewhere")
    assert first_line(done).startswith("an entry exists now: published ")


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["/no/such/file.pb"], "cannot read /no/such/file.pb"),
        (
            [str(ROOT / "README.md"), "--compiler-version", NEW, "--target", "trn1"],
            "not an HLO module",
        ),
        (["0" * 64, "--target", "trn1"], "a KEY takes no compiler options"),
        (["0" * 64, "--namespace", "Bad Name"], "not a namespace name"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(server: Server, args: list[str], said: str) -> None:
    done = explain(server, "team-a", *args)
    assert done.returncode == 2
    assert said in done.stderr
    assert done.stderr.count("\n") == 1
    assert done.stdout == ""


@pytest.mark.e2e
def test_no_namespace_is_exit_2_and_a_server_down_is_exit_1(server: Server) -> None:
    env = clean_env()
    done = subprocess.run(
        [*NEFFCACHE, "explain", "0" * 64], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "no namespace" in done.stderr
    env["NEFFCACHE_URL"] = f"neffcache+http://127.0.0.1:{free_port()}/team-a"
    done = subprocess.run(
        [*NEFFCACHE, "explain", "0" * 64], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.startswith("neffcache explain: cannot reach http://127.0.0.1:")
    assert done.stderr.count("\n") == 1


def test_a_graph_with_a_shape_longer_than_the_server_takes_is_sent_without_shapes() -> None:
    # A tuple of 8 tuples of 8 tuples of 8 arrays prints far past the 4096 characters
    # the server takes for one instruction's shape: the request would be a 400.
    from argparse import Namespace

    from neffcache.client.cli import _explain_cmd
    from neffcache.client.config import ClientConfig

    leaf = b"\x10\x0b" + b"\x18\x80\x08" * 2  # f32[1024,1024]
    shape = leaf
    for _ in range(3):
        shape = b"\x10\x0d" + field(4, shape) * 8  # a TUPLE of 8 of the last
    module = RawModule()
    module.ParseFromString(hlo("block_a"))
    module.computations[-1].instructions.append(
        field(2, b"tuple") + field(3, shape) + b"\x98\x02" + varint(9001)
    )
    data = module.SerializeToString()
    args = Namespace(compiler_version=NEW, target="trn1")
    config = ClientConfig.from_env({"NEFFCACHE_URL": "neffcache+http://127.0.0.1:1/team-a"})
    assert config is not None
    sent = json.loads(_explain_cmd._request(data, args, [], config))
    assert sent["graph"]["instructions"] == 19
    assert "shapes" not in sent["graph"]


def test_a_removal_without_a_why_prints_no_empty_line() -> None:
    from neffcache.client.cli._explain_cmd import render

    removed = {"at": 0.0, "namespace": "a", "action": "evict", "reason": "quota", "why": ""}
    text = render({"summary": "evicted", "reason": "evicted", "key": None, "removed": removed})
    assert "removed: 1970-01-01 00:00 UTC from a, evict (quota) by None" in text
    assert not text.endswith("  \n")
