"""Losing the index and its neighbours: Redis killed, Redis wiped, S3 unreachable.

One ``neffcache serve`` over a real ``redis-server`` (no persistence, as a cache's
Redis often runs) and moto's S3 reached through a loopback proxy the test can cut.
Training runs are the stand-in ``libneuronxla`` through the client's hook, as a
training image runs them.

Nothing lost: every training run completes with the right NEFF bytes whatever state
the stores are in (compiling locally when the cache cannot answer); and once the
stores are back, ``neffcache admin reindex`` restores every entry the server ever
acknowledged, so later runs hit without compiling. The server and the training runs
are processes; reindex runs through the CLI's entry point in this process, with the
server's settings in its environment (a cold CLI process would add seconds of imports
per reindex and prove nothing more: tests/cli runs the command line itself)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from faults.proxy import FaultProxy
from faults.support import Server, running_server_with
from loopback import free_port, redis_argv, redis_ready
from support.backends import backends
from support.e2e import (
    BLOCK_A,
    OTHER,
    VARIANT,
    Sandbox,
    cache_url,
    canonical_key,
    reference_neff,
)
from support.services import wait_until_ready

from neffcache.client.cli import main as neffcache

pytestmark = pytest.mark.e2e

NAMESPACE = "jobs"


class Redis:
    """A ``redis-server`` (fakeredis without one: loopback.py) on a fixed port that the
    test can kill and start again, empty each time (``--save ''``, no append-only
    file: a restart loses everything)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        try:
            argv = redis_argv(self.port, self.workdir)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        log = self.workdir / "redis.log"
        with open(log, "ab") as out:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        wait_until_ready(self.process, lambda: redis_ready(self.port), log)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture(params=backends("s3+redis"))
def cuttable_stores(
    tmp_path: Path, s3_bucket: str, s3_endpoint: str
) -> Iterator[tuple[Redis, FaultProxy, dict[str, str]]]:
    """The stores this suite can lose, on the shared backend matrix (``--backend``
    selects it only with both ``s3`` and ``redis``): a Redis of its own, which the test
    kills and starts again, and moto's S3 (a fresh bucket) behind a proxy it can cut.
    Returns them and the server's settings for them."""
    host, _, port = s3_endpoint.removeprefix("http://").partition(":")
    proxy = FaultProxy((host, int(port)))
    db = Redis(tmp_path)
    db.start()
    # The server's settings, also given to `neffcache admin reindex`.
    settings = {
        "index_url": db.url,
        "blob_url": s3_bucket,
        # No replica reindexes by itself (a tick is an hour): the CLI does.
        "eviction_interval_seconds": "0",
        "access_flush_seconds": "3600",
    }
    old = os.environ.get("AWS_ENDPOINT_URL_S3")
    os.environ["AWS_ENDPOINT_URL_S3"] = proxy.url  # the server reaches S3 through it
    try:
        yield db, proxy, settings
    finally:
        if old is not None:
            os.environ["AWS_ENDPOINT_URL_S3"] = old
        proxy.close()
        db.kill()


def train(sandbox: Sandbox, server: Server, names: list[str]) -> int:
    """One training run on a fresh host (a new L1): it must finish with the right
    NEFFs. Returns how many graphs it compiled."""
    before = sandbox.compiles()
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=cache_url(server.port, NAMESPACE),
        url_var="NEURON_CC_FLAGS",
        hook=True,
        extra={"NEFFCACHE_TIMEOUT": "3", "NEFFCACHE_CONNECT_TIMEOUT": "1"},
    )
    run = sandbox.train(env, names, timeout=120)
    run.done.check()
    assert run.neffs == [reference_neff(name) for name in names]
    return sandbox.compiles() - before


def reindex(
    data_dir: Path, settings: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> dict[str, object]:
    """``neffcache admin reindex --json`` with the server's settings (as its environment
    gives them: ``NEFFCACHE_<NAME>``, and this process's AWS endpoint); its report."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("NEFFCACHE_")]:
            patch.delenv(name)
        for name, value in settings.items():
            patch.setenv(f"NEFFCACHE_{name.upper()}", value)
        capsys.readouterr()
        code = neffcache(["admin", "reindex", "--data-dir", str(data_dir), "--json"])
        out, err = capsys.readouterr()
    assert code == 0, err
    report: dict[str, object] = json.loads(out)
    return report


def held(server: Server) -> set[str]:
    """The keys the server answers for now (one page: the tests hold a few)."""
    answer = server.http.get(f"/v1/ns/{NAMESPACE}/entries?limit=1000")
    assert answer.status_code == 200, answer.text
    return {entry["key"] for entry in answer.json()["entries"]}


def test_redis_killed_wiped_and_s3_cut_lose_nothing(
    tmp_path: Path,
    cuttable_stores: tuple[Redis, FaultProxy, dict[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    db, proxy, settings = cuttable_stores
    sandbox = Sandbox(tmp_path / "sandbox", NAMESPACE)
    sandbox.root.mkdir()
    data_dir = tmp_path / "server"
    try:
        with running_server_with(data_dir, **settings) as server:
            assert train(sandbox, server, [BLOCK_A, VARIANT]) == 2
            acknowledged = held(server)
            assert acknowledged == {canonical_key(BLOCK_A), canonical_key(VARIANT)}

            # 1. Redis killed: runs compile locally and finish.
            db.kill()
            assert server.http.get("/readyz").status_code == 503
            assert train(sandbox, server, [BLOCK_A, OTHER]) == 2

            # 2. Redis back, empty (no persistence): a wiped index. Runs still finish
            #    (they miss, compile and publish into the empty index) ...
            db.start()
            assert held(server) == set()
            assert train(sandbox, server, [OTHER]) == 1
            acknowledged |= held(server)
            # ... and reindex brings back what the lost index held.
            report = reindex(data_dir, settings, capsys)
            assert report["restored"] == 2
            assert report["present"] == 1
            assert report["missing_blobs"] == report["damaged"] == []
            assert held(server) == acknowledged
            assert train(sandbox, server, [BLOCK_A, VARIANT, OTHER]) == 0

            # 3. Redis wiped while the server runs (FLUSHALL): the same.
            redis.Redis.from_url(db.url).flushall()
            assert train(sandbox, server, [VARIANT]) == 1
            report = reindex(data_dir, settings, capsys)
            assert (report["restored"], report["present"]) == (2, 1)
            assert held(server) == acknowledged

            # 4. S3 unreachable (connections refused): runs compile locally and finish.
            proxy.close()
            assert train(sandbox, server, [BLOCK_A, OTHER]) == 2
            # Back (a new proxy on another port: the server is told by restarting it).
        with FaultProxy(proxy.upstream) as back:
            os.environ["AWS_ENDPOINT_URL_S3"] = back.url
            with running_server_with(data_dir, **settings) as server:
                report = reindex(data_dir, settings, capsys)
                assert (report["restored"], report["present"]) == (0, 3)
                assert held(server) == acknowledged
                assert train(sandbox, server, [BLOCK_A, VARIANT, OTHER]) == 0
    finally:
        sandbox.kill_all()
