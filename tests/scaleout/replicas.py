"""Replicas of ``neffcache serve`` over one shared index and one shared blob store
(imported as ``scaleout.replicas``; ``tests/bench/bench_load.py`` uses it too).

Each replica is its own process (``python -m neffcache.client.cli serve``) on a free
127.0.0.1 port, with its own data directory (unused by the shared stores, but the
server needs one) and its stderr in a log file beside it. ``running_replicas`` starts
them all at once, waits until each answers ``GET /readyz`` with ``200`` (its blob store
and index answer), and stops them at the end, also on an error: ``SIGTERM`` (uvicorn
shuts down and the evictor lease is released), ``SIGKILL`` after a bound. The kernel
kills a replica whose parent dies without cleaning up (``PR_SET_PDEATHSIG``).

Nothing here depends on pytest: a failure to start is a ``RuntimeError`` with the
log's tail.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from loopback import free_port

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]
READY_TIMEOUT = 60.0  # two replicas importing FastAPI at once on a busy 2-core machine
STOP_TIMEOUT = 15.0


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a replica never outlives the process that started it.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This environment without any ``NEFFCACHE_*`` a developer may have set, plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
    env.update(extra)
    return env


class Replica:
    """One ``neffcache serve`` process."""

    def __init__(self, name: str, workdir: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = workdir / f"replica-{name}"
        self.log = workdir / f"replica-{name}.log"
        self.env = dict(env)
        self.process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return f"<replica {self.name} at {self.url} pid {pid}>"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> None:
        """Spawn the process (``wait_ready`` waits for it)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [*NEFFCACHE, "serve", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until ``GET /readyz`` answers 200; RuntimeError if the process exits first
        or the time runs out."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=2, trust_env=False, verify=False) as http:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if http.get("/readyz").status_code == 200:
                        return
                if not self.alive():
                    raise RuntimeError(f"{self!r} exited while starting:\n{self.tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self!r} not ready within {timeout} s:\n{self.tail()}")
                time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int | None:
        """Send ``sig`` and wait; SIGKILL after ``timeout``. The exit status (negative:
        the signal that ended it), or None if it was never started."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        return self.process.returncode

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)

    def restart(self) -> None:
        """Stop (if running) and start again on the same port, then wait until ready."""
        self.stop()
        self.start()
        self.wait_ready()

    def client(self, token: str | None = None, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Plain http: no certificates to load (a tenth of a second per client).
        return httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, trust_env=False, verify=False
        )

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def running_replicas(
    workdir: Path,
    *,
    index_url: str,
    blob_url: str,
    count: int = 2,
    settings: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[list[Replica]]:
    """``count`` replicas named ``a``, ``b``, ... over ``index_url`` and ``blob_url``.

    ``settings`` are more ``NEFFCACHE_*`` variables (the same for every replica, as in
    a deployment), ``env`` anything else the processes need, such as
    ``AWS_ENDPOINT_URL_S3``. Started together; yielded once every one is ready."""
    extra = {"NEFFCACHE_INDEX_URL": index_url, "NEFFCACHE_BLOB_URL": blob_url}
    extra.update(settings or {})
    extra.update(env or {})
    workdir.mkdir(parents=True, exist_ok=True)
    replicas = [Replica(chr(ord("a") + i), workdir, clean_env(extra)) for i in range(count)]
    try:
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.wait_ready()
        yield replicas
    finally:
        for replica in replicas:
            if replica.alive():
                assert replica.process is not None
                replica.process.send_signal(signal.SIGTERM)  # all at once, then wait
        for replica in replicas:
            replica.stop()


@dataclass
class Pair:
    """Two replicas over the same stores, and the admin token both accept."""

    a: Replica
    b: Replica
    admin: str  # the bootstrap admin token's secret
    index_url: str
    blob_url: str


def create_token(
    replica: Replica, admin_token: str, scope: str, namespaces: list[str], name: str = ""
) -> tuple[str, str]:
    """A new token made through ``replica``'s admin API: ``(token_id, secret)``."""
    with replica.client(admin_token) as admin:
        made = admin.post(
            "/v1/admin/tokens", json={"scope": scope, "namespaces": namespaces, "name": name}
        )
    if made.status_code != 201:
        raise RuntimeError(f"creating a {scope} token answered {made.status_code}: {made.text}")
    body = made.json()
    return str(body["token_id"]), str(body["token"])
