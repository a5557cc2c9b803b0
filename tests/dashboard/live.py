"""A real server for the dashboard tests, and the artifacts folder.

The server is ``create_app`` under uvicorn in a thread of the test process
(``loopback.InThread``), not the ``neffcache serve`` process the other suites start
(``support.served.Server``): the tests stamp events on several days by shifting the
clock the app was built with (``create_app(clock=...)``, which the events endpoint
stamps with), and only an app in this process can be handed a clock."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import httpx
from loopback import InThread

from neffcache.server.app import create_app
from neffcache.server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]


class LiveServer:
    """``create_app`` under uvicorn on 127.0.0.1, in a thread; its stores under
    ``data_dir``, opened and closed by the app; ``clock`` stamps the events it takes."""

    def __init__(self, data_dir: Path, clock: Clock | None = None, **settings: Any) -> None:
        self.clock = clock or Clock()
        # No maintenance passes: nothing may change between the page's reading and the
        # test's.
        app = create_app(
            ServerSettings(data_dir=data_dir, eviction_interval_seconds=0, **settings),
            clock=self.clock,
        )
        self._serving = InThread(app)
        self._running = contextlib.ExitStack()
        self.url = self._serving.url

    def start(self) -> LiveServer:
        self._running.enter_context(self._serving)
        return self

    def stop(self) -> None:
        self._running.close()

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, trust_env=False)


class Clock:
    """The real clock shifted by ``offset`` seconds, a server's events clock
    (``create_app(clock=...)``), so one test can report events on several days."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def artifacts_dir() -> Path:
    configured = os.environ.get("NEFFCACHE_TEST_ARTIFACTS")
    folder = Path(configured) if configured else ROOT / "build" / "test-artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def publish(client: httpx.Client, namespace: str, key: str, data: bytes) -> None:
    """An entry of one file, ``data``, under ``key`` in ``namespace``."""
    import blake3

    digest = blake3.blake3(data).hexdigest()
    assert client.put(f"/v1/blobs/{digest}", content=data).status_code == 201
    body = {
        "key": key,
        "files": {"model.neff": {"digest": digest, "size": len(data)}},
        "compile_seconds": 600.0,
    }
    assert client.put(f"/v1/ns/{namespace}/entries/{key}", json=body).status_code == 201


def report(server: LiveServer, by: str, period: str = "7d", token: str | None = None) -> Any:
    """What the page asks for, asked again by the test."""
    with server.client(token) as client:
        answer = client.get(
            "/v1/reports/cost", params={"since": period, "by": by, "top": 10, "format": "json"}
        )
    assert answer.status_code == 200, answer.text
    return answer.json()
