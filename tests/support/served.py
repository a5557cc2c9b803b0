"""The one ``neffcache serve`` process the tests start (the process suites through
support/e2e.py, the serve, connection, fault, eviction, lease, herd, explain and
scale-out tests), and requests on one over HTTP: entries to publish, the evictions its
audit log records, and a wait for what a background pass does."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import blake3
import httpx
from loopback import free_port, terminate, wait_healthy

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]


def without_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the ``NEFFCACHE_*`` a developer may have set."""
    return {k: v for k, v in environ.items() if not k.startswith("NEFFCACHE_")}


class Server:
    """``neffcache serve --data-dir DATA`` on a free loopback port: blobs under ``DATA``
    (file://) and the index in ``DATA/index.db`` (SQLite) unless ``env`` says otherwise.

    Its environment is ``environ`` (default: this one without ``NEFFCACHE_*``, so a
    test's AWS endpoint reaches it) plus ``env`` (``{"NEFFCACHE_LEASE_TTL_SECONDS":
    "3"}``). Its stdout and stderr go to ``log`` (default: ``server-<port>.log`` beside
    ``DATA``), a file rather than a pipe, which nothing would drain: the start-up error
    shows its end. ``start`` returns once ``/healthz`` answers; ``stop`` shuts it down
    cleanly (SIGTERM), ``kill`` as a crash would (SIGKILL). It can be started again
    on the same port and data. Several start at once with ``spawn`` on each, then
    ``wait_started`` on each (replicas over one index and blob store, given in ``env``).

    ``die_with_parent``: the kernel kills it when the thread that started it ends
    (``PR_SET_PDEATHSIG``), so that a killed test or benchmark run (the scale-out
    replicas, which bench_load.py starts too) leaves no server behind."""

    def __init__(
        self,
        data_dir: Path,
        env: Mapping[str, str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        log: Path | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = without_settings(os.environ) if environ is None else dict(environ)
        self.env = {**base, **(env or {})}
        self.log = log or data_dir.parent / f"server-{self.port}.log"
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        self.spawn()
        self.wait_started()
        return self

    def spawn(self) -> None:
        """Start the process; ``wait_started`` waits until it answers."""
        argv = [*NEFFCACHE, "serve", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )

    def wait_started(self) -> None:
        """Until ``/healthz`` answers; AssertionError with the log's end if it does not."""
        assert self.process is not None, "not spawned"
        # The wait is bounded only so that a server that hangs fails the test; a loaded
        # machine (64 clients starting on two cores) may take long to answer.
        if not wait_healthy(self.process, self.url, 60):
            self.kill()
            raise AssertionError(f"the server did not start: {self.tail()}")

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, a clean shutdown (SIGKILL if it outlasts 10 s); waits for it. Its
        exit status (negative: the signal that ended it), None if never started."""
        self._close_http()
        if self.process is None:
            return None
        terminate(self.process)
        return self.process.returncode

    def kill(self) -> int | None:
        """SIGKILL, as a crash or an OOM kill would end it; waits for it. Its exit
        status, as ``stop``'s."""
        self._close_http()
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        return self.process.returncode

    def tail(self, chars: int = 3000) -> str:
        """The end of its log."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- requests on it -------------------------------------------------------------

    def client(self, token: str | None = None, timeout: float = 30) -> httpx.Client:
        """A new client on it (the caller closes it), with ``token`` as its bearer."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # No certificates to load for plain http (a tenth of a second per client).
        return httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, trust_env=False, verify=False
        )

    @functools.cached_property
    def http(self) -> httpx.Client:
        """One anonymous client on it, closed when it stops (a new one after a restart)."""
        return self.client()

    def _close_http(self) -> None:
        http = self.__dict__.pop("http", None)
        if http is not None:
            http.close()

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def cache_url(self, namespace: str) -> str:
        """What a client's ``NEFFCACHE_URL`` names to use ``namespace`` on it."""
        return f"neffcache+{self.url}/{namespace}"

    def entry(self, namespace: str, key: str) -> dict[str, Any] | None:
        return self._record(f"/v1/ns/{namespace}/entries/{key}")

    def alias(self, namespace: str, alias: str) -> dict[str, Any] | None:
        return self._record(f"/v1/ns/{namespace}/aliases/{alias}")

    def _record(self, path: str) -> dict[str, Any] | None:
        response = self.get(path)
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        record: dict[str, Any] = response.json()
        return record

    def failures(self, namespace: str, key: str) -> list[dict[str, Any]]:
        response = self.get(f"/v1/ns/{namespace}/failures/{key}")
        if response.status_code == 404:
            return []
        assert response.status_code == 200, response.text
        records: list[dict[str, Any]] = response.json()["failures"]
        return records

    # --- its filesystem store -------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Where the embedded filesystem store keeps a blob: blobs/<d[:2]>/<digest>."""
        return self.data_dir / "blobs" / digest[:2] / digest

    def staged(self) -> list[Path]:
        """Every upload file in the store's staging areas (``staging/<area>/uploads``)."""
        return sorted(self.data_dir.glob("staging/*/uploads/*"))

    def wait_until_unstaged(self, timeout: float = 5.0) -> list[Path]:
        """The staging files still there after up to ``timeout`` s (a request the client
        abandoned is cleaned up when the server notices the disconnect)."""
        deadline = time.monotonic() + timeout
        while (left := self.staged()) and time.monotonic() < deadline:
            time.sleep(0.02)
        return left


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def key(n: int | str) -> str:
    return hashlib.sha256(f"key {n}".encode()).hexdigest()


def neff(label: str, size: int) -> bytes:
    seed = hashlib.sha256(label.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def publish(
    client: httpx.Client, namespace: str, key_: str, data: bytes, **fields: Any
) -> httpx.Response:
    stored = client.put(f"/v1/blobs/{digest(data)}", content=data)
    assert stored.status_code in (200, 201), stored.text
    body = {"key": key_, "files": {"model.neff": {"digest": digest(data), "size": len(data)}}}
    body.update(fields)
    return client.put(f"/v1/ns/{namespace}/entries/{key_}", json=body)


def until(what: Callable[[], bool], seconds: float, message: str) -> None:
    """Wait for ``what``; ``seconds`` only ends the wait (no time is asserted)."""
    start = time.monotonic()
    while not what():
        if time.monotonic() - start > seconds:
            raise AssertionError(f"{message}: not within {seconds} s")
        time.sleep(0.1)


_ACTOR = re.compile(r"^evictor@\S+ pid (\d+)$")


def evictions(client: httpx.Client) -> list[dict[str, Any]]:
    records = client.get("/v1/admin/audit", params={"limit": 10_000})
    assert records.status_code == 200, records.text
    return [r for r in records.json()["records"] if r["action"] == "evict"]


def actor_pid(record: dict[str, Any]) -> int:
    found = _ACTOR.match(record["actor"])
    assert found is not None, record["actor"]
    return int(found[1])
