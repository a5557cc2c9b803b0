"""Fixtures for the command line's shared surface: one real server for the module
(uvicorn in a thread over in-memory stores, tokens required), which records who asked
for what, and the ``neffcache`` command run in this process.

Nothing the outer environment sets (``NEFFCACHE_*``, ``NEURON_*``, proxies) reaches a
test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import InThread
from support.cli_server import TOKEN, Done, Recorder, Run, Server

from neffcache.client.cli import main
from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    blobs, index = MemoryBlobStore(), MemoryIndex()
    settings = ServerSettings(
        data_dir=tmp_path_factory.mktemp("cli-server"),
        bootstrap_admin_token=TOKEN,
        eviction_interval_seconds=0,
    )
    recorder = Recorder(create_app(settings, blob_store=blobs, index=index))
    with InThread(recorder) as url:
        yield Server(url, recorder)
    blobs.close()
    index.close()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No neffcache, Neuron or proxy setting from outside; L1 in ``tmp_path``."""
    for name in list(os.environ):
        if name.startswith(("NEFFCACHE_", "NEURON_")) or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    l1 = tmp_path / "l1"
    monkeypatch.setenv("NEFFCACHE_LOCAL_DIR", str(l1))
    return l1


@pytest.fixture
def neffcache(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> Run:
    """``neffcache(*argv)`` -> Done(exit code, stdout, stderr), in this process."""

    def run(*argv: str) -> Done:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return run
