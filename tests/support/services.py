"""The real services tests start, each a subprocess on a free 127.0.0.1 port, once
per session (fixtures for the whole suite; tests/conftest.py registers this module):
``s3_endpoint`` (moto's standalone server) with ``s3_bucket`` per test, and
``redis_server`` (loopback.py says when it is fakeredis). ``unused_port`` is a port
nothing listens on. A test that asks for ``redis_server`` or ``s3_endpoint`` is an
end-to-end test (mark it ``e2e``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from loopback import free_port, redis_argv, redis_ready

_START_TIMEOUT = 30.0
# Fake credentials so that nothing signs with, or sends, a developer's real ones.
_TEST_AWS_ENV: dict[str, str | None] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SESSION_TOKEN": None,
    "AWS_SECURITY_TOKEN": None,
    "AWS_PROFILE": None,
}


@contextmanager
def _environ(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables, restoring them afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            _set_env(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set_env(name, value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextmanager
def _service(argv: list[str], is_ready: Callable[[], bool], log: Path) -> Iterator[None]:
    """Run ``argv`` until the block ends; its output goes to ``log`` (a file, not a
    pipe, so a chatty server never blocks on a full pipe)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        wait_until_ready(proc, is_ready, log)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until_ready(
    proc: subprocess.Popen[bytes], is_ready: Callable[[], bool], log: Path
) -> None:
    """Wait until ``is_ready()`` while ``proc`` runs; fail the test with the tail of its
    ``log`` when it exits first or is not ready after the start-up timeout."""
    deadline = time.monotonic() + _START_TIMEOUT
    while not is_ready():
        if proc.poll() is not None:
            pytest.fail(f"{proc.args!r} exited with {proc.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"{proc.args!r} not ready after {_START_TIMEOUT} s:\n{_tail(log)}")
        time.sleep(0.05)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


def _http_ready(url: str) -> bool:
    # No proxies: an HTTP(S)_PROXY in the environment must not intercept 127.0.0.1.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server; fake AWS credentials are set
    in the environment for the session."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _environ(_TEST_AWS_ENV), _service(argv, lambda: _http_ready(url), log):
        yield url


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[str]:
    """``s3://<fresh bucket>/prefix``, with AWS_ENDPOINT_URL_S3 pointing at moto for the
    test, so ``open_blob_store`` reaches it."""
    with _environ({"AWS_ENDPOINT_URL_S3": s3_endpoint}):
        yield new_bucket(s3_endpoint, "neffcache-test")


def new_bucket(s3_endpoint: str, name: str) -> str:
    """``s3://<name>-<random>/prefix``: a bucket made on moto at ``s3_endpoint``."""
    bucket = f"{name}-{uuid.uuid4().hex[:20]}"
    _bucket_maker(s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/prefix"


_BUCKET_MAKERS: dict[str, object] = {}


def _bucket_maker(s3_endpoint: str) -> Any:
    """One boto3 client per endpoint for the whole session: making one costs a quarter
    of a second, and hundreds of tests each make a bucket."""
    import boto3  # here, not at the top: only S3 tests need it

    client = _BUCKET_MAKERS.get(s3_endpoint)
    if client is None:
        client = _BUCKET_MAKERS[s3_endpoint] = boto3.session.Session().client(
            "s3", endpoint_url=s3_endpoint
        )
    return client


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:<port>/0`` of a fresh redis-server that persists nothing
    (fakeredis where there is no redis-server binary, outside CI: loopback.py).
    Shared by the session: tests that need an empty database flush it themselves."""
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    try:
        argv = redis_argv(port, workdir)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    with _service(argv, lambda: redis_ready(port), workdir / "redis.log"):
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def unused_port() -> int:
    """A 127.0.0.1 port with nothing listening: connections to it are refused."""
    return free_port()
