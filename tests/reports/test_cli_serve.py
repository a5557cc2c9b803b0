"""``neffcache report`` end to end: the CLI (a subprocess, stdlib HTTP) against a real
``neffcache serve`` on 127.0.0.1, seeded through ``POST /v1/events`` as clients seed
it, with a ``price_table`` file over the shipped prices. The table the CLI printed is
kept as a test artifact (``$NEFFCACHE_TEST_ARTIFACTS``, else build/test-artifacts/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
from loopback import free_port, wait_healthy
from reports.support import HOUR, key

pytestmark = pytest.mark.e2e

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]
ROOT = Path(__file__).resolve().parents[2]
ADMIN = "nfc_reports_e2e_admin_secret"
# Over the shipped $1.34375: the report must use the configured file.
PRICES = '[instances."trn1.2xlarge"]\nusd_per_hour = 2.0\nnote = "our rate"\n'


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any NEFFCACHE_* a developer may have set, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
    env.update(extra)
    return env


class Serve:
    """``neffcache serve`` on a free loopback port; its output in a log file."""

    def __init__(self, tmp: Path, **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        argv = [*NEFFCACHE, "serve", "--port", str(self.port), "--data-dir", str(tmp / "data")]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, env=clean_env(**settings), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )

    def ready(self) -> Serve:
        if wait_healthy(self.process, self.url):
            return self
        self.stop()
        raise AssertionError(f"the server did not start: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def client(self, token: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, trust_env=False)


def events() -> list[dict[str, Any]]:
    common = {"kind": "graph", "namespace": "team-a", "model": "llama"}
    return [
        {**common, "instance_type": "trn1.32xlarge", "result": "hit", "source": "l1"}
        | {"saved_seconds": 2 * HOUR, "job_id": "run-1", "key": key("warm")},
        {**common, "instance_type": "trn1.32xlarge", "result": "miss", "source": "compiler"}
        | {"compile_seconds": HOUR, "outcome": "ok", "reason": "compiler-changed"}
        | {"job_id": "run-2", "key": key("upgraded")},
        {**common, "instance_type": "trn1.2xlarge", "result": "miss", "source": "compiler"}
        | {"compile_seconds": 1800.0, "outcome": "failed", "reason": "new-graph"}
        | {"job_id": "run-2", "key": key("broken")},
        {"kind": "graph", "namespace": "team-b", "result": "miss", "source": "compiler"}
        | {"compile_seconds": 600.0, "outcome": "ok", "job_id": "run-3", "key": key("b")},
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, str]]:
    """A seeded server and a read token for team-a."""
    tmp = tmp_path_factory.mktemp("report-serve")
    prices = tmp / "prices.toml"
    prices.write_text(PRICES)
    serve = Serve(
        tmp,
        NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN=ADMIN,
        NEFFCACHE_PRICE_TABLE=str(prices),
        NEFFCACHE_EVICTION_INTERVAL_SECONDS="0",
    ).ready()
    try:
        with serve.client(ADMIN) as admin:
            body = {"scope": "read", "namespaces": ["team-a"], "name": "team-a reader"}
            made = admin.post("/v1/admin/tokens", json=body)
            assert made.status_code == 201, made.text
            sent = admin.post("/v1/events", json={"events": events()})
            assert sent.status_code == 202, sent.text
            data = b"neff " * 200
            digest = blake3.blake3(data).hexdigest()
            assert admin.put(f"/v1/blobs/{digest}", content=data).status_code in (200, 201)
            entry = {
                "key": key("entry"),
                "files": {"model.neff": {"digest": digest, "size": len(data)}},
                "compile_seconds": 1800.0,
                "model": "llama",
                "components": {"compiler_version": "2.21.1"},
            }
            published = admin.put(f"/v1/ns/team-a/entries/{key('entry')}", json=entry)
            assert published.status_code == 201, published.text
        yield serve, made.json()["token"]
    finally:
        serve.stop()


def neffcache(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NEFFCACHE, *args], env=clean_env(**env), capture_output=True, text=True, timeout=60
    )


def artifacts() -> Path:
    where = Path(os.environ.get("NEFFCACHE_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_report_prints_the_table_with_the_configured_prices(server: tuple[Serve, str]) -> None:
    serve, _ = server
    done = neffcache("report", "--server", serve.url, "--token", ADMIN, "--by", "namespace,model")
    assert done.returncode == 0, done.stderr
    (artifacts() / "neffcache-report.txt").write_text(done.stdout)
    text = done.stdout
    # 1 h on trn1.32xlarge ($21.50) + 0.5 h on trn1.2xlarge at the file's $2.00; team-b's
    # 10 minutes name no instance type.
    assert "compile-hours spent 1.67 (1.7h, $22.50); saved by hits 2.00 (2h, $43.00)" in text
    assert "prices: file " in text
    assert "lookups naming no instance type: 1" in text
    assert "RUNS  cold 2 (1.67 compile-hours), warm 1 (0.00), mixed 0 (0.00)" in text
    assert "team-a     llama" in text
    assert key("upgraded")[:16] in text


def test_report_json_to_a_file_for_a_team_token_from_the_environment(
    server: tuple[Serve, str], tmp_path: Path
) -> None:
    serve, reader = server
    out = tmp_path / "report.json"
    done = neffcache(
        "report",
        "--format",
        "json",
        "--by",
        "day",
        "-o",
        str(out),
        NEFFCACHE_URL=f"neffcache+{serve.url}/team-a",
        NEFFCACHE_TOKEN=reader,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    report = json.loads(out.read_text())
    assert report["totals"]["lookups"] == 3
    assert report["totals"]["cost_spent"] == pytest.approx(21.5 + 0.5 * 2.0)
    assert [s["namespace"] for s in report["storage"]] == ["team-a"]
    assert report["storage"][0]["entries"] == 1
    with serve.client(reader) as client:
        direct = client.get("/v1/reports/cost", params={"by": "day"}).json()
    assert report["totals"] == direct["totals"]
    assert report["rows"] == direct["rows"]


def test_report_csv_and_html(server: tuple[Serve, str], tmp_path: Path) -> None:
    serve, _ = server
    done = neffcache("report", "--server", serve.url, "--token", ADMIN, "--format", "csv")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("namespace,lookups,hits,")
    assert done.stdout.splitlines()[1].startswith("team-a,3,1,")
    page = tmp_path / "report.html"
    done = neffcache(
        "report", "--server", serve.url, "--token", ADMIN, "--format", "html", "-o", str(page)
    )
    assert done.returncode == 0, done.stderr
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_report_upgrade_prints_the_plan(server: tuple[Serve, str]) -> None:
    serve, reader = server
    done = neffcache(
        "report",
        "upgrade",
        "--to-compiler",
        "2.22.0",
        "--server",
        serve.url,
        "--token",
        reader,
    )
    assert done.returncode == 0, done.stderr
    (artifacts() / "neffcache-report-upgrade.txt").write_text(done.stdout)
    assert "neffcache upgrade report: to neuronx-cc 2.22.0" in done.stdout
    # One llama graph of 30 minutes, compiled on trn1.32xlarge by the namespace's jobs.
    assert "1. llama: 1 graph to rebuild, 0.50 compile-hours ($10.75)" in done.stdout
    assert f"NEFFCACHE_URL=neffcache+{serve.url}/team-a NEFFCACHE_MODEL=llama" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "--since 'yesterday' is neither"),
        (["--by", "host"], "--by 'host'"),
        (["--top", "many"], "--top 'many'"),
        (["--top", "\u00b2"], "--top '\u00b2'"),  # a digit to str.isdigit, not to int()
        (["--namespace", "team-b"], "does not cover namespace 'team-b'"),
        (["upgrade"], "--to-compiler V is required"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    server: tuple[Serve, str], args: list[str], message: str
) -> None:
    serve, reader = server
    done = neffcache("report", *args, "--server", serve.url, "--token", reader)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""
    if args != ["--frobnicate"]:  # argparse's own usage line comes from the top parser
        assert len(done.stderr.strip().splitlines()) == 1


def test_an_unreachable_server_is_exit_1(unused_port: int) -> None:
    done = neffcache("report", "--server", f"http://127.0.0.1:{unused_port}")
    assert done.returncode == 1
    assert "cannot reach" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_plain_server_url_in_the_environment_is_enough(server: tuple[Serve, str]) -> None:
    # A cost owner's shell names the server, not a job's namespace.
    serve, _ = server
    done = neffcache("report", "--format", "json", NEFFCACHE_URL=serve.url, NEFFCACHE_TOKEN=ADMIN)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["totals"]["lookups"] >= 3
    done = neffcache("report", NEFFCACHE_URL="/var/tmp/neuron-compile-cache")
    assert done.returncode == 2
    assert "use http://HOST:PORT or neffcache+http://HOST:PORT/NAMESPACE" in done.stderr


def test_the_server_refuses_to_start_with_a_bad_price_table(tmp_path: Path) -> None:
    bad = tmp_path / "bad-prices.toml"
    bad.write_text('[instances."trn1.2xlarge"]\nusd_per_hour = "cheap"\n')
    serve = Serve(tmp_path, NEFFCACHE_PRICE_TABLE=str(bad))
    try:
        assert serve.process.wait(timeout=30) != 0
    finally:
        serve.stop()
    log = serve.log.read_text()
    assert f"price_table {bad}" in log
    assert "must be a number" in log
