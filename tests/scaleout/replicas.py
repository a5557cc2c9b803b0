"""Replicas of ``neffcache serve`` over one shared index and one shared blob store
(imported as ``scaleout.replicas``; ``tests/bench/bench_load.py`` uses it too).

Each replica is a ``support.served.Server``: its own process on a free 127.0.0.1 port,
with its own data directory (unused by the shared stores, but the server needs one)
and its log beside it. ``running_replicas`` starts them all at once, waits until each
answers ``GET /readyz`` with ``200`` (its blob store and index answer), and stops them
at the end, also on an error: ``SIGTERM`` (uvicorn shuts down and the evictor lease is
released), ``SIGKILL`` after a bound. The kernel kills a replica whose parent dies
without cleaning up (``die_with_parent``).

Nothing here depends on pytest: a failure to start is an AssertionError with the
log's tail.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from support.served import Server, until

READY_TIMEOUT = 60.0  # two replicas importing FastAPI at once on a busy 2-core machine


class Replica(Server):
    """One ``neffcache serve`` process, named ``name``, over the stores ``env`` names;
    started once its stores answer too."""

    def __init__(self, name: str, workdir: Path, env: Mapping[str, str]) -> None:
        log = workdir / f"replica-{name}.log"
        super().__init__(workdir / f"replica-{name}", env, log=log, die_with_parent=True)
        self.name = name

    def __repr__(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return f"<replica {self.name} at {self.url} pid {pid}>"

    def wait_started(self) -> None:
        super().wait_started()
        try:
            until(self._ready, READY_TIMEOUT, f"{self!r}: its stores did not answer")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.tail()}") from None

    def _ready(self) -> bool:
        return self.get("/readyz").status_code == 200


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
    replicas = [Replica(chr(ord("a") + i), workdir, extra) for i in range(count)]
    try:
        for replica in replicas:
            replica.spawn()
        for replica in replicas:
            replica.wait_started()
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
