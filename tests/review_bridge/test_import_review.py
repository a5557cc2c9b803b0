"""Review of ``neffcache import``: symlinks, per-entry trouble, aliases of entries the
server already holds, and what is counted as an entry."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from bridge.layout import V1, StockCache
from review_bridge.conftest import Run, Server, digest

from neffcache.server.bridge import importer


def counts(stdout: str) -> dict[str, int]:
    summary: dict[str, Any] = json.loads(stdout)
    return {kind: n for kind, n in summary["counts"].items() if n}


def test_a_symlink_out_of_src_is_not_uploaded(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # /var/tmp/neuron-compile-cache (the SDK's default) sits in a world-writable
    # directory: another local user can plant an entry whose model.neff points at a
    # file only the importing user can read. The import follows the link and
    # publishes that file to everyone who can read the namespace.
    secret = tmp_path / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY----- (test)")
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a")
    neff = cache.root / placed.address / "model.neff"
    neff.unlink()
    os.symlink(secret, neff)
    code, out, err = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert server.blobs.size(digest(secret.read_bytes())) is None, (
        f"the file behind the symlink was uploaded: {counts(out)}"
    )


def test_a_symlinked_entry_folder_out_of_src_is_not_imported(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    elsewhere = StockCache(tmp_path / "elsewhere")
    placed = elsewhere.add("block_a")
    cache = tmp_path / "cache" / f"neuronxcc-{V1}"
    cache.mkdir(parents=True)
    os.symlink(elsewhere.root / placed.address, cache / placed.address.split("/")[1])
    code, out, _ = neffcache(
        "import", str(cache.parent), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert "imported" not in counts(out), "an entry folder outside SRC was imported"


def test_one_unreadable_entry_folder_does_not_stop_the_import(
    tmp_path: Path,
    server: Server,
    namespace: str,
    neffcache: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tests run as root here, so a mode-0700 folder of another user is simulated:
    # listing that one folder raises PermissionError, as it would for a non-root user.
    cache = StockCache(tmp_path / "cache")
    good = cache.add("block_a")
    bad = cache.add("variant_shape")
    forbidden = cache.root / bad.address
    real_iterdir = Path.iterdir

    def iterdir(self: Path) -> Any:
        if self == forbidden:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    code, out, err = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code != 2, f"the whole import stopped: {err.strip()}"
    assert counts(out).get("imported") == 1
    assert server.alias(namespace, good.address) is not None


def test_an_entry_the_server_holds_under_another_address_gets_its_address_too(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # The brief: every successful entry becomes a server entry *with its Neuron
    # address as alias*. The second trace of a program is counted ``present`` and its
    # address is lost, so the hook on another host, probing that address before the
    # HLO is in L1 (facts §3.3 leaves the order open), misses and compiles.
    cache = StockCache(tmp_path / "cache")
    first = cache.add("block_a")
    second = cache.add("block_b_renamed")
    assert first.expected_keys()[0] == second.expected_keys()[0]
    code, out, _ = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 0
    found = server.alias(namespace, second.address)
    assert found is not None, "the second entry's Neuron address resolves to nothing"
    assert found["key"] == second.expected_keys()[0]


def test_an_optimum_registry_folder_is_not_counted_as_an_empty_entry(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # facts §10.3: optimum-neuron writes <cache>/neuronxcc-<ver>/0_REGISTRY/... beside
    # the MODULE_ folders. "empty" means "HLO and flags, never compiled"; a registry
    # is neither (and an S3 source of the same cache does not count it at all).
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")
    registry = cache.root / f"neuronxcc-{V1}" / "0_REGISTRY" / "0.0.28" / "llama"
    registry.mkdir(parents=True)
    (registry / "abc.json").write_text("{}")
    code, out, _ = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 0
    assert counts(out) == {"imported": 1}


def test_ctrl_c_during_an_import_is_not_a_traceback(
    tmp_path: Path,
    server: Server,
    namespace: str,
    neffcache: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(importer, "import_entry", interrupted)
    try:
        code, _, err = neffcache(
            "import", str(cache.root), "--server", server.url, "--namespace", namespace
        )
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): the user sees a traceback")
    assert code == 130
    assert err.count("\n") == 1

