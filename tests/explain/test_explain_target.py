"""What ``neffcache explain`` accepts (``explain_target.resolve_target``): a key, a stock
address in every spelling users meet, a stock entry on this host, one of L1's
manifests; each turned into the key the hook gives the graph, or one clear error.

The graph is real: the stand-in libneuronxla compiles ``block_a`` (a JAX-made HLO
fixture) once per module through the persistent-cache hook, which publishes it to a
sink of PUTs; so the stock entry is the SDK's, the run manifest the hook's, and the
expected key the one the hook published the graph under. Every other case copies that
entry."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from support.e2e import BLOCK_A, HLO_DIR, Sandbox, stock_address
from support.http_stubs import send_json

from neffcache.client.cli._common import CommandError
from neffcache.client.explain_target import resolve_target
from neffcache.client.local import LocalStore

NAMESPACE = "team-a"
OTHER_VERSION = "2.21.1.0+6b1fa2e4"


@dataclass(frozen=True)
class HookRun:
    env: dict[str, str]  # the job's environment
    l1: Path
    run_manifest: Path
    address: str  # the graph's stock address
    manifest: dict[str, Any]  # what the hook published for it

    @property
    def key(self) -> str:
        key: str = self.manifest["key"]
        return key

    @property
    def entry(self) -> Path:
        return self.l1 / self.address

    @property
    def module(self) -> str:
        return self.address.split("/")[1]

    def environ(self, **changes: str) -> dict[str, str]:
        return {**self.env, **changes}


class PublishSink(ThreadingHTTPServer):
    """The few routes a hook's miss uses, answered as a server with no entries would
    answer them; keeps every PUT. (A real server's import alone costs more than the
    rest of this module.)"""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SinkHandler)
        self.puts: dict[str, bytes] = {}
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _SinkHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: PublishSink

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        send_json(self, status, body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        self._answer(404, {"detail": "absent", "reason": "absent"})

    def do_POST(self) -> None:
        body = self._body()
        if self.path == "/v1/blobs/missing":
            self._answer(200, {"missing": json.loads(body)["digests"]})
        else:
            self._answer(404, {"detail": "absent"})

    def do_PUT(self) -> None:
        self.server.puts[unquote(self.path)] = self._body()
        self._answer(201, {})

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hook_run(tmp_path_factory: pytest.TempPathFactory) -> HookRun:
    root = tmp_path_factory.mktemp("explain-target")
    sandbox = Sandbox(root / "sandbox", NAMESPACE)
    sandbox.root.mkdir()
    sink = PublishSink()
    threading.Thread(target=sink.serve_forever, kwargs={"poll_interval": 0.01}).start()
    try:
        l1 = sandbox.new_dir("l1")
        run = root / "run.jsonl"
        # No leases, no telemetry: a miss, its compile and its publish, nothing else.
        extra = {"NEFFCACHE_RUN_MANIFEST": str(run), "NEFFCACHE_LEASES": "0"}
        extra["NEFFCACHE_TELEMETRY"] = "0"
        env = sandbox.env(l1=l1, url=f"neffcache+{sink.url}/{NAMESPACE}", hook=True, extra=extra)
        sandbox.train(env, [BLOCK_A]).done.check()
    finally:
        sandbox.kill_all()
        sink.shutdown()
        sink.server_close()
    entries = {p: b for p, b in sink.puts.items() if p.startswith(f"/v1/ns/{NAMESPACE}/entries/")}
    assert len(entries) == 1, sorted(sink.puts)
    [(path, body)] = entries.items()
    manifest = json.loads(body)
    assert path.rsplit("/", 1)[1] == manifest["key"]
    return HookRun(env, l1, run, stock_address(BLOCK_A), manifest)


def error_of(text: str, environ: dict[str, str]) -> str:
    with pytest.raises(CommandError) as caught:
        resolve_target(text, environ)
    return str(caught.value)


def copy_entry(run: HookRun, root: Path, version_dir: str | None = None) -> Path:
    """The hook's stock entry copied under ``root`` (in ``version_dir`` if given)."""
    version, module = run.address.split("/")
    entry = root / (version_dir or version) / module
    shutil.copytree(run.entry, entry)
    return entry


# --- keys -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [("ab" * 32, "ab" * 32), ("AB" * 32, "ab" * 32), (f"  {'0f' * 32}\n", "0f" * 32)],
)
def test_a_key_is_itself(text: str, key: str) -> None:
    assert resolve_target(text, {}) == key


# --- the hook's miss, by its stock address ----------------------------------------------


@pytest.mark.e2e
def test_the_hook_names_its_miss_by_address_and_explain_key(hook_run: HookRun) -> None:
    # The line's ``key`` stays null (prewarm fetches by it into the wrapper's side of
    # L1); the key to explain is its own field.
    lines = [json.loads(line) for line in hook_run.run_manifest.read_text().splitlines()]
    hook_lines = [line for line in lines if line["via"] == "hook"]
    assert len(hook_lines) == 1
    assert hook_lines[0]["neuron_address"] == hook_run.address
    assert hook_lines[0]["key"] is None
    assert hook_lines[0]["explain_key"] == hook_run.key


@pytest.mark.e2e
def test_a_miss_whose_entry_left_l1_is_found_by_its_explain_key(
    hook_run: HookRun, tmp_path: Path
) -> None:
    environ = hook_run.environ(NEFFCACHE_LOCAL_DIR=str(tmp_path / "empty-l1"))
    assert resolve_target(hook_run.address, environ) == hook_run.key


SPELLINGS: dict[str, Callable[[HookRun], str]] = {
    "address": lambda r: r.address,
    "without-version": lambda r: r.module,
    "with-file": lambda r: f"{r.address}/model.neff",
    "entry-dir": lambda r: f"{r.entry}/",
    "file-in-entry": lambda r: str(r.entry / "model.hlo_module.pb"),
    "another-hosts-path": lambda r: f"/data/cache/{r.address}/model.neff",
    "sdk-log-line": lambda r: (
        "||NEURON_CC_WRAPPER||: Using a cached neff at "
        f"/var/tmp/neuron-compile-cache/{r.address}/model.neff. "
        "Exiting with a successfully compiled graph."
    ),
    "compiler-work-file": lambda r: f"/tmp/tmpq1/model.{r.module}.hlo_module.pb",
}


@pytest.mark.e2e
@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_spelling_of_the_address_is_the_key_the_hook_published(
    hook_run: HookRun, spelling: str
) -> None:
    text = SPELLINGS[spelling](hook_run)
    assert resolve_target(text, hook_run.env) == hook_run.key


@pytest.mark.e2e
def test_an_entry_in_the_sdks_own_stock_cache_is_keyed(hook_run: HookRun, tmp_path: Path) -> None:
    copy_entry(hook_run, tmp_path / "stock")
    environ = hook_run.environ(
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "empty-l1"),
        NEURON_CC_FLAGS=f"--cache_dir={tmp_path / 'stock'}",
    )
    assert resolve_target(hook_run.address, environ) == hook_run.key


@pytest.mark.e2e
def test_several_keys_are_listed_one_per_line(hook_run: HookRun, tmp_path: Path) -> None:
    copy_entry(hook_run, tmp_path)
    copy_entry(hook_run, tmp_path, f"neuronxcc-{OTHER_VERSION}")
    said = error_of(hook_run.module, hook_run.environ(NEFFCACHE_LOCAL_DIR=str(tmp_path)))
    head, *choices = said.split("\n")
    assert head == f"{hook_run.module} matches 2 keys; explain one of them:"
    assert len(choices) == 2
    assert choices[0].startswith(f"  {hook_run.key}  {hook_run.address}  (computed from ")
    other = choices[1].split()
    assert other[0] != hook_run.key
    assert other[1] == f"neuronxcc-{OTHER_VERSION}/{hook_run.module}"


# --- the eras of a stock entry --------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("hlo", "flags_file", "flags"),
    [
        ("model.hlo.pb", "compile_flags.txt", "--model-type=transformer"),  # RAW
        ("model.hlo_module.pb", "compile_flags.json", '["--model-type=transformer"]'),  # JSON
        (
            "model.hlo_module.pb",
            "compile_flags.json",
            '["--target", "trn1", "--model-type=transformer"]',  # NxDI's two words
        ),
    ],
    ids=["raw", "json", "two-word-target"],
)
def test_each_era_of_an_entry_is_keyed_as_the_hook_keys_it(
    hook_run: HookRun,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hlo: str,
    flags_file: str,
    flags: str,
) -> None:
    # The older eras name no target: the platform's comes from the environment.
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    entry = copy_entry(hook_run, tmp_path)
    (entry / "model.hlo_module.pb").rename(entry / hlo)
    (entry / "compile_flags.json").unlink()
    (entry / flags_file).write_text(flags)
    if flags_file.endswith(".txt"):
        (entry / "model.done").unlink()  # the RAW era wrote none
    assert resolve_target(str(entry / "model.neff"), hook_run.env) == hook_run.key


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("no-target", "no --target in its flags file, nor NEURON_PLATFORM_TARGET_OVERRIDE"),
        ("no-flags", "it holds no flags file (compile_flags.json or compile_flags.txt)"),
        ("not-hlo", "cannot be keyed: "),
    ],
)
def test_an_entry_that_cannot_be_keyed_says_why_in_one_line(
    hook_run: HookRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, said: str
) -> None:
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    entry = copy_entry(hook_run, tmp_path)
    if change == "no-target":
        (entry / "compile_flags.json").write_text('["--model-type=transformer"]')
    elif change == "no-flags":
        (entry / "compile_flags.json").unlink()
    else:
        (entry / "model.hlo_module.pb").write_bytes(b"\xff not an HloModuleProto")
    # No run manifest: its line's explain_key would name the graph without the entry.
    environ = hook_run.environ(
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "l1"), NEFFCACHE_RUN_MANIFEST=str(tmp_path / "no.jsonl")
    )
    message = error_of(str(entry), environ)
    assert f"{entry} cannot be keyed: " in message
    assert said in message
    assert "\n" not in message


# --- where the client records addresses: the run manifest, L1's manifests ------------


@pytest.mark.e2e
def test_a_run_manifest_line_without_a_key_is_said_not_guessed(
    hook_run: HookRun, tmp_path: Path
) -> None:
    # An older client's miss line: the address alone, no explain_key.
    older = tmp_path / "run.jsonl"
    lines = [json.loads(line) for line in hook_run.run_manifest.read_text().splitlines()]
    older.write_text("".join(json.dumps({**line, "explain_key": None}) + "\n" for line in lines))
    environ = hook_run.environ(
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "empty-l1"), NEFFCACHE_RUN_MANIFEST=str(older)
    )
    message = error_of(hook_run.address, environ)
    assert message.startswith(f"no key found for {hook_run.address}: ")
    assert f"no entry under {tmp_path / 'empty-l1'}" in message
    assert f"the run manifest {older} names it on 1 line(s), none with a key" in message
    assert "neffcache explain HLO_FILE" in message
    assert "\n" not in message


@pytest.mark.e2e
def test_a_run_manifest_line_with_a_key_names_it(hook_run: HookRun, tmp_path: Path) -> None:
    line = json.loads(hook_run.run_manifest.read_text().splitlines()[0])
    run = tmp_path / "run.jsonl"
    lines = [
        hook_run.run_manifest.read_text(),
        "not json\n",
        json.dumps({**line, "key": "not a key"}) + "\n",  # a malformed line: skipped
        json.dumps({**line, "via": "wrapper", "key": hook_run.key}) + "\n",
    ]
    run.write_text("".join(lines))
    environ = hook_run.environ(
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "empty-l1"), NEFFCACHE_RUN_MANIFEST=str(run)
    )
    assert resolve_target(hook_run.module, environ) == hook_run.key


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_run_manifest_that_is_no_file_is_said_not_waited_for(
    hook_run: HookRun, tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "run.jsonl"
    if kind == "fifo":
        os.mkfifo(path)  # opened as a file, it would wait for a writer forever
    else:
        path.mkdir()
    environ = hook_run.environ(
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "l1"), NEFFCACHE_RUN_MANIFEST=str(path)
    )
    said = error_of(hook_run.address, environ)
    assert f"cannot read the run manifest {path}: not a regular file" in said


def l1_with_manifest(run: HookRun, tmp_path: Path) -> tuple[Path, LocalStore]:
    """An L1 holding the graph's manifest under its key and its direct key (as the
    wrapper and prewarm keep them), and no stock entry."""
    local = LocalStore(tmp_path / "l1")
    manifest = {k: v for k, v in run.manifest.items() if k not in ("created_at", "writer")}
    assert local.put_manifest(run.key, manifest)
    assert local.put_manifest(run.manifest["direct_key"], manifest)
    return tmp_path / "l1", local


@pytest.mark.e2e
def test_l1s_manifests_name_the_key_of_an_address(hook_run: HookRun, tmp_path: Path) -> None:
    l1, local = l1_with_manifest(hook_run, tmp_path)
    (local.root / "keys" / "00").mkdir()
    os.mkfifo(local.root / "keys" / "00" / f"{'0' * 64}.json")  # skipped, not waited for
    environ = hook_run.environ(NEFFCACHE_LOCAL_DIR=str(l1), NEFFCACHE_RUN_MANIFEST="")
    assert resolve_target(f"{hook_run.address}/model.neff", environ) == hook_run.key


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["key", "direct_key"])
def test_an_l1_manifest_file_is_its_key(hook_run: HookRun, tmp_path: Path, name: str) -> None:
    _, local = l1_with_manifest(hook_run, tmp_path)
    filed = hook_run.manifest[name]
    path = local.root / "keys" / filed[:2] / f"{filed}.json"
    assert resolve_target(str(path), {}) == hook_run.key


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("not-json", "is not a manifest: not JSON"),
        ("bad-digest", "is not a usable manifest: file 'model.neff': the digest"),
        ("another-key", "holds the manifest of another key"),
        ("blob", "is a blob of L1"),
        ("directory", "is part of L1's own store, not a graph"),
        ("fifo", "not a regular file"),
    ],
)
def test_l1_records_that_are_not_a_manifest_of_their_key_are_refused(
    hook_run: HookRun, tmp_path: Path, damage: str, said: str
) -> None:
    _, local = l1_with_manifest(hook_run, tmp_path)
    key = hook_run.key
    path = local.root / "keys" / key[:2] / f"{key}.json"
    manifest = json.loads(path.read_text())
    if damage == "not-json":
        path.write_bytes(b"{\xff")
    elif damage == "bad-digest":
        manifest["files"]["model.neff"]["digest"] = "../../etc/passwd"
        path.write_text(json.dumps(manifest))
    elif damage == "another-key":
        (local.root / "keys" / "00").mkdir(exist_ok=True)
        path = path.rename(local.root / "keys" / "00" / f"{'0' * 64}.json")
    elif damage == "blob":
        path = local.root / "blobs" / "ab" / ("ab" * 32)
        path.parent.mkdir(parents=True)
        path.write_bytes(b"neff")
    elif damage == "directory":
        path = path.parent
    else:
        path.unlink()
        os.mkfifo(path)
    message = error_of(str(path), {})
    assert said in message
    assert "\n" not in message


# --- what is not a graph's name -------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [str(HLO_DIR / f"{BLOCK_A}.pb"), "/no/such/file.pb", "hello", ""],
    ids=["hlo-file", "missing-file", "a-word", "empty"],
)
def test_anything_else_is_left_to_the_command_as_an_hlo_file(text: str) -> None:
    assert resolve_target(text, {}) is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("neuronxcc-x/MODULE_1+abcdef12", "compiler version 'x' is not a neuronx-cc build"),
        (str(HLO_DIR), "is a directory but not a stock cache entry"),
    ],
)
def test_a_malformed_name_is_one_line(text: str, said: str) -> None:
    message = error_of(text, {})
    assert said in message
    assert "\n" not in message
