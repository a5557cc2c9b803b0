"""``neffcache export``: a server's entries as a stock cache the SDK can read."""

from __future__ import annotations

import json
import stat
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from bridge.layout import V1, V2, StockCache, counts, digest, standard_cache
from support.bridge_server import Run, Server

from neffcache.client.bridge.exporter import Filters, export_entry
from neffcache.client.bridge.remote import Refused, Remote

STAMPS = ("created_at", "namespace", "writer")


def imported(tmp_path: Path, server: Server, namespace: str, neffcache: Run) -> StockCache:
    cache = standard_cache(tmp_path / "cache")
    code, _, err = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace
    )
    assert code == 0, err
    return cache


def export(neffcache: Run, server: Server, namespace: str, dest: Path, *extra: str) -> str:
    code, out, err = neffcache(
        "export", str(dest), "--server", server.url, "--namespace", namespace, "--json", *extra
    )
    assert code == 0, err
    return out


def folders(dest: Path) -> set[str]:
    return {f"{p.parent.name}/{p.name}" for p in dest.glob("*/*")}


def test_export_writes_every_file_verified_and_an_empty_done(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = imported(tmp_path, server, namespace, neffcache)
    dest = tmp_path / "export"
    out = export(neffcache, server, namespace, dest)
    assert counts(out) == {"exported": 4}
    successes = cache.successes()[:4]
    assert folders(dest) == {p.address for p in successes}
    for placed in successes:
        folder = dest / placed.address
        written = {p.name: p.read_bytes() for p in folder.iterdir()}
        assert written == {**placed.artifacts, "model.done": b""}
    everything = [p.name for p in dest.rglob("*")]
    assert not [n for n in everything if n.endswith(".lock") or n == "model.log"]
    assert not [n for n in everything if n.startswith(".")]  # no staging folder left


def test_an_export_imports_back_to_the_same_entries(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    imported(tmp_path, server, namespace, neffcache)
    dest = tmp_path / "export"
    export(neffcache, server, namespace, dest)
    again = f"{namespace[:50]}-again"
    code, out, _ = neffcache(
        "import", str(dest), "--server", server.url, "--namespace", again, "--json"
    )
    assert code == 0
    assert counts(out) == {"imported": 4}

    def manifests(ns: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in e.items() if k not in STAMPS} for e in server.entries(ns)]

    first, second = manifests(namespace), manifests(again)
    assert [m["key"] for m in first] == [m["key"] for m in second]
    assert first == second  # aliases, components and file digests too
    for manifest in second:
        for alias in (manifest["neuron_address"], manifest["direct_key"]):
            found = server.alias(again, alias)
            assert found is not None
            assert found["key"] == manifest["key"]


def test_a_complete_entry_in_dest_is_left_alone_and_an_occupied_folder_too(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = imported(tmp_path, server, namespace, neffcache)
    dest = tmp_path / "export"
    complete, occupied = cache.successes()[0].address, cache.successes()[1].address
    (dest / complete).mkdir(parents=True)
    (dest / complete / "model.neff").write_bytes(b"someone else's")
    (dest / complete / "model.done").write_bytes(b"")
    (dest / occupied).mkdir(parents=True)
    (dest / occupied / "model.log").write_bytes(b"a failed compile")
    out = export(neffcache, server, namespace, dest)
    assert counts(out) == {"exported": 2, "present": 1, "occupied": 1}
    assert (dest / complete / "model.neff").read_bytes() == b"someone else's"
    assert sorted(p.name for p in (dest / occupied).iterdir()) == ["model.log"]
    assert counts(export(neffcache, server, namespace, dest)) == {"present": 3, "occupied": 1}


@pytest.mark.parametrize(
    ("wanted", "versions"),
    [(V2, {V2}), ("neuronxcc-" + V1, {V1}), (V2.split("+")[0], {V2}), ("2.21.1.0+000", set())],
)
def test_compiler_version_filter(
    tmp_path: Path,
    server: Server,
    namespace: str,
    neffcache: Run,
    wanted: str,
    versions: set[str],
) -> None:
    imported(tmp_path, server, namespace, neffcache)
    dest = tmp_path / "export"
    out = export(neffcache, server, namespace, dest, "--compiler-version", wanted)
    kept = 2 * len(versions)  # two imported entries per version folder
    assert counts(out) == {k: n for k, n in {"exported": kept, "filtered": 4 - kept}.items() if n}
    assert {f.split("/")[0].removeprefix("neuronxcc-") for f in folders(dest)} == versions


def test_since_keeps_entries_published_from_then_on(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    early = StockCache(tmp_path / "early")
    early.add("block_a")
    late = StockCache(tmp_path / "late")
    late.add("variant_shape")
    argv = ("--server", server.url, "--namespace", namespace)
    assert neffcache("import", str(early.root), *argv)[0] == 0
    time.sleep(0.05)
    boundary = datetime.now(timezone.utc)
    time.sleep(0.05)
    assert neffcache("import", str(late.root), *argv)[0] == 0
    dest = tmp_path / "export"
    out = export(neffcache, server, namespace, dest, "--since", boundary.isoformat())
    assert counts(out) == {"exported": 1, "filtered": 1}
    assert folders(dest) == {late.placed[0].address}
    tomorrow = (boundary + timedelta(days=1)).date().isoformat()
    assert counts(export(neffcache, server, namespace, dest, "--since", tomorrow)) == {
        "filtered": 2
    }
    zulu = (boundary - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert counts(export(neffcache, server, namespace, dest, "--since", zulu)) == {"present": 2}


def publish(server: Server, namespace: str, manifest: dict[str, Any], neff: bytes) -> None:
    httpx.put(f"{server.url}/v1/blobs/{digest(neff)}", content=neff).raise_for_status()
    manifest["files"] = {"model.neff": {"digest": digest(neff), "size": len(neff)}}
    url = f"{server.url}/v1/ns/{namespace}/entries/{manifest['key']}"
    httpx.put(url, content=json.dumps(manifest)).raise_for_status()


def test_entries_without_an_address_or_with_an_environment_are_skipped(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    address = f"neuronxcc-{V1}/MODULE_123+0123abcd"
    components = {"compiler_version": V1, "target": "trn1", "flags": []}
    publish(
        server,
        namespace,
        {"key": "a" * 64, "neuron_address": address, "components": {**components, "env": {}}},
        b"plain NEFF",
    )
    publish(
        server,
        namespace,
        {
            "key": "b" * 64,
            "neuron_address": f"neuronxcc-{V1}/MODULE_456+0123abcd",
            "components": {**components, "env": {"XLA_FLAGS": "--xla_cpu_enable_fast_math"}},
        },
        b"NEFF under XLA_FLAGS",
    )
    publish(server, namespace, {"key": "c" * 64, "components": components}, b"no address")
    dest = tmp_path / "export"
    out = export(neffcache, server, namespace, dest)
    assert counts(out) == {"exported": 1, "no_address": 1, "env": 1}
    assert folders(dest) == {address}
    assert (dest / address / "model.neff").read_bytes() == b"plain NEFF"


class Recording(Remote):
    """A Remote that notes, before each download, what the staging folder holds, and
    can refuse the n-th download."""

    def __init__(self, server: str, namespace: str, refuse_at: int | None = None) -> None:
        super().__init__(server, namespace, None)
        self.seen: list[list[str]] = []
        self.refuse_at = refuse_at

    def fetch_blob(self, digest: str, size: int, dest: Path) -> None:
        self.seen.append(sorted(p.name for p in dest.parent.iterdir()))
        if len(self.seen) == self.refuse_at:
            raise Refused("refused (test)")
        super().fetch_blob(digest, size, dest)


def test_model_done_comes_last_and_a_failed_download_leaves_nothing(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("variant_op", extra={"wrapped_neff.hlo": b"w" * 999})
    argv = ("--server", server.url, "--namespace", namespace)
    assert neffcache("import", str(cache.root), *argv)[0] == 0
    (manifest,) = server.entries(namespace)
    dest = tmp_path / "export"

    failing = Recording(server.url, namespace, refuse_at=3)
    outcome = export_entry(failing, dest, manifest, Filters())
    failing.close()
    assert outcome == ("error", "refused (test)")
    assert list(dest.rglob("*")) == [dest / placed.address.split("/")[0]]

    recording = Recording(server.url, namespace)
    assert export_entry(recording, dest, manifest, Filters()) == ("exported", None)
    recording.close()
    assert len(recording.seen) == 4
    assert all("model.done" not in seen for seen in recording.seen)
    assert recording.seen[-1] == ["compile_flags.json", "model.hlo_module.pb", "model.neff"]
    assert (dest / placed.address / "model.done").read_bytes() == b""


def test_an_interrupted_export_leaves_no_half_entry(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")
    assert (
        neffcache("import", str(cache.root), "--server", server.url, "--namespace", namespace)[0]
        == 0
    )
    (manifest,) = server.entries(namespace)

    class Interrupted(Recording):
        def fetch_blob(self, digest: str, size: int, dest: Path) -> None:
            super().fetch_blob(digest, size, dest)
            raise KeyboardInterrupt

    remote = Interrupted(server.url, namespace)
    with pytest.raises(KeyboardInterrupt):
        export_entry(remote, tmp_path / "export", manifest, Filters())
    remote.close()
    assert [p.name for p in (tmp_path / "export").rglob("*")] == [f"neuronxcc-{V1}"]


def test_an_entry_without_model_neff_is_an_error_and_not_written(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # The server takes any non-empty file set; written out with model.done, this
    # folder would be a hit for the SDK (docs/neuron-sdk.md#hit-detection), which then
    # finds no NEFF.
    address = f"neuronxcc-{V1}/MODULE_4242+0123abcd"
    hlo = b"an HLO"
    httpx.put(f"{server.url}/v1/blobs/{digest(hlo)}", content=hlo).raise_for_status()
    manifest = {
        "key": "d" * 64,
        "neuron_address": address,
        "components": {"env": {}},
        "files": {"model.hlo_module.pb": {"digest": digest(hlo), "size": len(hlo)}},
    }
    url = f"{server.url}/v1/ns/{namespace}/entries/{manifest['key']}"
    httpx.put(url, content=json.dumps(manifest)).raise_for_status()
    dest = tmp_path / "export"
    code, out, _ = neffcache(
        "export", str(dest), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 1
    assert counts(out) == {"error": 1}
    (detail,) = json.loads(out)["details"]
    assert detail["address"] == address
    assert "no model.neff" in detail["reason"]
    assert not (dest / address).exists()


def test_dest_has_a_cache_lock_every_user_can_open_for_writing(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # docs/neuron-sdk.md#cache-wide-lock: the SDK opens <root>/lock for writing on every
    # call, lookups too; shipped with DEST, a user who cannot create files there can
    # still use it.
    imported(tmp_path, server, namespace, neffcache)
    dest = tmp_path / "export"
    export(neffcache, server, namespace, dest)
    lock = dest / "lock"
    assert lock.is_file()
    assert lock.read_bytes() == b""
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666
    export(neffcache, server, namespace, dest)  # again: kept as it is
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666


def test_a_lock_symlinked_out_of_dest_is_not_followed(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    target = tmp_path / "bashrc"
    target.write_text("# mine\n")
    target.chmod(0o600)
    dest = tmp_path / "export"
    dest.mkdir()
    (dest / "lock").symlink_to(target)
    code, out, err = neffcache(
        "export", str(dest), "--server", server.url, "--namespace", namespace
    )
    assert (code, out) == (2, "")
    assert f"cannot write {dest}" in err
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_compiler_version_folder_symlinked_out_of_dest_is_not_written_through(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = imported(tmp_path, server, namespace, neffcache)
    versions = {p.name for p in cache.root.iterdir() if p.is_dir()}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "export"
    dest.mkdir()
    planted = sorted(versions)[0]
    (dest / planted).symlink_to(elsewhere)
    code, out, _ = neffcache(
        "export", str(dest), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 1
    assert list(elsewhere.iterdir()) == []
    reasons = [d["reason"] for d in json.loads(out)["details"]]
    assert reasons
    assert all("is a symbolic link" in r for r in reasons)
    assert all(d["address"].startswith(planted + "/") for d in json.loads(out)["details"])
    others = versions - {planted}
    assert others
    assert all((dest / v).is_dir() and not (dest / v).is_symlink() for v in others)
