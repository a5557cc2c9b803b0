"""A download that arrives whole with other bytes is reported to the server
(``POST /v1/blobs/{digest}/mismatch``), once per digest per process, and stays a miss
whatever the report's fate; and end to end, a blob rotten at rest on a server that
trusts its file never becomes the job's NEFF: the wrapper compiles, and the server
quarantines the blob on the report."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from loopback import InThread
from support.client_units import delta, digest, no_server_down, open_remote
from support.e2e import (
    BLOCK_A,
    Sandbox,
    blake3_hex,
    cache_url,
    canonical_key,
    reference_neff,
)
from support.http_stubs import scripted

from neffcache.client import remote as remote_module
from neffcache.client.remote import TELEMETRY
from neffcache.client.stats import STATS


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    no_server_down(monkeypatch)
    monkeypatch.setattr(remote_module, "_reported", set())


def test_whole_wrong_bytes_are_reported_once(tmp_path: Path) -> None:
    served = os.urandom(4096)
    wanted = digest(os.urandom(16))
    mismatch = ("POST", f"/v1/blobs/{wanted}/mismatch")
    with (
        scripted(lambda method, path: (202, b"{}") if method == "POST" else (200, served)) as srv,
        open_remote(srv.url, tmp_path, timeout=5) as remote,
    ):
        assert not remote.fetch(wanted, len(served), tmp_path / "a")
        assert not remote.fetch(wanted, len(served), tmp_path / "b")  # a miss again
        assert srv.requests.count(mismatch) == 1
        assert not remote.fetch(wanted, len(served) + 1, tmp_path / "c")  # short: a cut
        assert srv.requests.count(mismatch) == 1
    assert not (tmp_path / "a").exists()


def test_a_failed_report_changes_nothing_but_telemetry(tmp_path: Path) -> None:
    served = os.urandom(4096)
    wanted = digest(os.urandom(16))
    before = STATS.snapshot()
    with (
        scripted(lambda method, path: (503, b"{}") if method == "POST" else (200, served)) as srv,
        open_remote(srv.url, tmp_path, timeout=5) as remote,
    ):
        assert not remote.fetch(wanted, len(served), tmp_path / "a")
        assert remote.available()  # the cache is still used
        assert not remote.available(TELEMETRY)
    assert delta(before, "bad_downloads") == 1
    assert delta(before, "server_errors") == 0


@pytest.mark.e2e
def test_a_blob_rotten_at_rest_is_compiled_and_quarantined_on_the_report(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neffcache.server.app import create_app
    from neffcache.server.blobs.fs import FsBlobStore
    from neffcache.server.settings import ServerSettings

    settings = ServerSettings(data_dir=tmp_path / "server", eviction_interval_seconds=0)
    app = create_app(settings)
    store = app.state.backends.blobs
    assert isinstance(store, FsBlobStore)
    neff = reference_neff(BLOCK_A)
    blob = blake3_hex(neff)
    manifest = {
        "key": canonical_key(BLOCK_A),
        "files": {"model.neff": {"digest": blob, "size": len(neff)}},
    }
    with InThread(app) as url:
        # Published as a compile of BLOCK_A would be, and read once: verified, trusted.
        assert httpx.put(f"{url}/v1/blobs/{blob}", content=neff, trust_env=False).is_success
        entry = f"{url}/v1/ns/{sandbox.namespace}/entries/{canonical_key(BLOCK_A)}"
        assert httpx.put(entry, json=manifest, trust_env=False).status_code == 201
        assert httpx.get(f"{url}/v1/blobs/{blob}", trust_env=False).content == neff
        # Rot beneath the filesystem: the bytes change, and the memo still trusts the file.
        path = store.local_path(blob)
        assert path is not None
        path.write_bytes(bytes([neff[0] ^ 1]) + neff[1:])
        stamped = store.stamp(blob)
        assert stamped is not None
        app.state.backends.verified.remember(blob, stamped[0], stamped[1] - 10, stamped[1])

        out = sandbox.new_dir("out") / "model.neff"
        port = int(url.rsplit(":", 1)[1])
        env = sandbox.env(l1=sandbox.new_dir("l1"), url=cache_url(port, sandbox.namespace))
        sandbox.wrap(env, BLOCK_A, out).check()
        assert out.read_bytes() == neff  # never the rotten bytes
        assert sandbox.compiles() == 1
        assert app.state.integrity.rechecks.wait_idle(30)
    # The download happened, mismatched and was reported: the server found it rotten.
    quarantined = [p.name.split(".")[0] for p in (store.root / "quarantine").iterdir()]
    assert quarantined == [blob]
    # The wrapper's publish may have uploaded it again (healed) if the recheck came
    # first; either way what the store holds now is right, or nothing.
    held = store.read(blob)
    assert held is None or blake3_hex(b"".join(held)) == blob
