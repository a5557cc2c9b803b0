"""A ``neffcache serve`` process, and requests on one over HTTP, shared by the serve,
connection, eviction and scale-out tests: entries to publish, the evictions its audit
log records, and a wait for what a background pass does."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import httpx
from loopback import free_port, wait_healthy

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]


class Server:
    """``neffcache serve`` on a free loopback port, in this environment plus ``env``;
    its log in a file beside ``data_dir``."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        # A file, not a pipe: uvicorn logs every request, and an undrained pipe would
        # eventually block the server.
        self.log = data_dir.parent / f"server-{self.port}.log"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [*NEFFCACHE, "serve", "--port", str(self.port), "--data-dir", str(self.data_dir)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        if not wait_healthy(self.process, self.url):
            self.kill()
            raise AssertionError(f"the server did not start: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


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
