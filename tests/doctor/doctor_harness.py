"""Helpers for ``neffcache doctor``'s tests: a controlled environment, the doctor run as
a process, and a stand-in ``/v1/status``.

The doctor is driven as a user runs it, ``python -m neffcache.client.cli doctor``, in
an environment built from nothing the outer one configures (support/e2e.py's
``clean_environ``): the shim directory first on PATH, then the stand-in compiler, the
stand-in ``libneuronxla`` on PYTHONPATH, a private L1. Each test then plants one
misconfiguration and asserts the doctor names it with its fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

from support.e2e import NEFFCACHE, STANDINS, Server, clean_environ, search_path, shim_dir
from support.http_stubs import send_json

DOCTOR = [*NEFFCACHE, "doctor"]


def doctor_env(tmp: Path, url: str | None = None, **extra: str | None) -> dict[str, str]:
    """A correct set-up: the shim first on PATH, the stand-in compiler behind it, the
    stand-in libneuronxla importable, a private L1; ``url`` in NEFFCACHE_URL. ``extra``
    sets variables (None unsets)."""
    env = clean_environ()
    env["PATH"] = search_path(shim_dir(), STANDINS)
    env["PYTHONPATH"] = str(STANDINS)
    env["NEFFCACHE_LOCAL_DIR"] = str(tmp / "l1")
    (tmp / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp / "tmp")
    if url is not None:
        env["NEFFCACHE_URL"] = url
    for name, value in extra.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def installed(where: Path, **versions: str) -> str:
    """``where`` holding the ``.dist-info`` of each distribution (``torch_neuronx`` for
    torch-neuronx); returns PYTHONPATH with the stand-ins and it."""
    for name, version in versions.items():
        info = where / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        )
    return os.pathsep.join([str(STANDINS), str(where)])


def standin_libneuronxla_version() -> str:
    """The stand-in libneuronxla's version, as ``importlib.metadata`` finds it on a
    ``sys.path`` holding tests/standins (its ``.dist-info`` there)."""
    found = [
        d.version
        for d in metadata.distributions(path=[str(STANDINS)])
        if d.metadata["Name"] == "libneuronxla"
    ]
    assert len(found) == 1, found
    assert found[0].endswith("+standin"), found
    return found[0]


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.out)
        return document

    def results(self) -> dict[str, dict[str, Any]]:
        return {r["id"]: r for r in self.json()["results"]}


def run_doctor(env: Mapping[str, str], *args: str, cwd: Path | None = None) -> Run:
    done = subprocess.run(
        [*DOCTOR, *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def results(env: Mapping[str, str], *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """The doctor's exit code and its JSON results by check id."""
    done = run_doctor(env, "--json", *args)
    assert done.code in (0, 1), f"exit {done.code}: {done.err}"
    return done.code, done.results()


def said(result: Mapping[str, Any]) -> str:
    """A result's evidence, fix and details as one text, to look for words in."""
    return " ".join([result["evidence"], result["fix"], *result["details"]])


@dataclass
class TokenServer:
    server: Server
    admin: str
    writer: str
    reader: str

    def url(self, namespace: str) -> str:
        return self.server.cache_url(namespace)


@dataclass
class StatusServer:
    """Answers ``/v1/status`` with ``body`` (its ``server.time`` moved by ``skew``
    seconds), ``/healthz`` with 200, and 404 to everything else (a lookup's miss).
    ``old``: no ``/v1/status`` either, as a server older than the route."""

    body: dict[str, Any] = field(default_factory=dict)
    skew: float = 0.0
    old: bool = False

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("/v1/status") and not owner.old:
                    body = json.loads(json.dumps(owner.body))
                    body.setdefault("server", {})["time"] = time.time() + owner.skew
                    self._send(200, body)
                elif self.path == "/healthz":
                    self._send(200, {"status": "ok"})
                else:
                    self._send(404, {"detail": "absent", "reason": "absent"})

            def _send(self, status: int, body: dict[str, Any]) -> None:
                send_json(self, status, body)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def url(self, namespace: str) -> str:
        return f"neffcache+http://127.0.0.1:{self.port}/{namespace}"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)


def status_body(namespace: str, **namespace_fields: Any) -> dict[str, Any]:
    """A ``/v1/status`` answer as the server gives it: an open server, an anonymous
    caller with write on every namespace, and ``namespace`` existing."""
    view = {
        "name": namespace,
        "exists": True,
        "entries": 3,
        "bytes": 3 << 20,
        "quota_bytes": None,
        "policy": {"trusted_writers_only": False},
        "window_seconds": 604800.0,
        "lookups": {"hits": 9, "misses": 1},
    }
    view.update(namespace_fields)
    return {
        "server": {"version": "0.1.0", "auth": "open"},
        "caller": {"name": "anonymous", "scope": "write", "namespaces": ["*"], "trusted": False},
        "namespace": view,
    }
