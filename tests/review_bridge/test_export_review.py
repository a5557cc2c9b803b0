"""Review of ``neffcache export``: what it writes must be usable by the unmodified SDK,
and a bad answer or an interrupt must stay one line."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from bridge.layout import V1, StockCache
from review_bridge.conftest import Run, Server, publish

from neffcache.server.bridge import exporter
from neffcache.server.bridge.remote import Refused, Remote, Unusable

ADDRESS = f"neuronxcc-{V1}/MODULE_4242+0123abcd"


def test_an_entry_without_model_neff_is_not_exported_as_a_cache_hit(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # The server accepts any non-empty file set. Written out with model.done, this
    # folder is a hit for the stock SDK (facts §3.3), which then finds no model.neff.
    publish(
        server.url,
        namespace,
        {"key": "d" * 64, "neuron_address": ADDRESS, "components": {"env": {}}},
        {"model.hlo_module.pb": b"an HLO", "compile_flags.json": b'["--target=trn1"]'},
    )
    dest = tmp_path / "export"
    code, out, err = neffcache(
        "export", str(dest), "--server", server.url, "--namespace", namespace, "--json"
    )
    folder = dest / ADDRESS
    assert not (folder / "model.done").exists() or (folder / "model.neff").is_file(), (
        f"exported a 'success' entry without model.neff: {sorted(p.name for p in folder.iterdir())}"
    )


def test_dest_carries_a_cache_lock_a_read_only_user_can_open(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # facts §6.1: CompileCacheFs opens <root>/lock with 'w' for every call, exists()
    # included, so a DEST the job cannot create files in (an image dir owned by root,
    # a read-only mount) fails outright. The brief asks for a directory the SDK can use
    # read-only; the least the export can do is ship the lock file, writable by all.
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")
    argv = ("--server", server.url, "--namespace", namespace)
    assert neffcache("import", str(cache.root), *argv)[0] == 0
    dest = tmp_path / "export"
    assert neffcache("export", str(dest), *argv)[0] == 0
    lock = dest / "lock"
    assert lock.is_file(), "no <DEST>/lock: the SDK must create it, so DEST cannot be read-only"
    assert stat.S_IMODE(lock.stat().st_mode) & 0o666 == 0o666


def test_ctrl_c_during_an_export_is_not_a_traceback(
    tmp_path: Path,
    server: Server,
    namespace: str,
    neffcache: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")
    argv = ("--server", server.url, "--namespace", namespace)
    assert neffcache("import", str(cache.root), *argv)[0] == 0

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(exporter, "write_entry", interrupted)
    try:
        code, _, err = neffcache("export", str(tmp_path / "export"), *argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): the user sees a traceback")
    assert code == 130
    assert err.count("\n") == 1


def _remote(handler: Any) -> Remote:
    return Remote("http://server.test", "team-a", None, transport=httpx.MockTransport(handler))


@pytest.mark.parametrize("body", [{}, {"entries": []}, [], {"entries": [1], "next": None}])
def test_a_listing_of_another_shape_is_a_one_line_error(body: Any) -> None:
    remote = _remote(lambda request: httpx.Response(200, json=body))
    try:
        with pytest.raises((Unusable, Refused)):
            for page in remote.pages():
                for manifest in page:
                    exporter.export_entry(remote, Path("/nonexistent"), manifest, exporter.Filters())
    finally:
        remote.close()


def test_a_listing_that_never_advances_ends() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, json={"entries": [], "next": "a" * 64})

    remote = _remote(handler)
    try:
        with pytest.raises((Unusable, Refused)):
            for _ in remote.pages():
                if calls > 50:
                    pytest.fail("pages() keeps asking for the same page forever")
    finally:
        remote.close()


def test_a_blob_longer_than_its_size_is_cut_off_not_written_whole(tmp_path: Path) -> None:
    # The client's Remote.fetch stops at size + 1 byte; the bridge's writes all of it
    # to DEST before checking, so a broken or hostile server can fill the disk.
    sent = 0

    def endless() -> Any:
        nonlocal sent
        for _ in range(64):
            sent += 1 << 16
            yield b"x" * (1 << 16)

    remote = _remote(lambda request: httpx.Response(200, content=endless()))
    try:
        with pytest.raises(Refused):
            remote.fetch_blob("a" * 64, 10, tmp_path / "blob")
    finally:
        remote.close()
    written = (tmp_path / "blob").stat().st_size if (tmp_path / "blob").exists() else 0
    assert written <= 1 << 20, f"wrote {written} bytes of a 10-byte blob"
