"""``neffcache import``: a stock cache (directory or S3) into a server."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from bridge.layout import STANDARD_COUNTS, V1, StockCache, counts, digest, standard_cache
from support.bridge_server import Run, Server, StartServer

from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.errors import StoreFull
from neffcache.server.index import Entry, EntryFacts
from neffcache.server.index.catalogs import MemoryCatalogs
from neffcache.server.index.entries import CatalogEntries
from neffcache.server.index.memory import MemoryIndex


def check_imported(server: Server, namespace: str, cache: StockCache) -> None:
    """Every success of ``cache`` is an entry under its expected key, found by its
    address and direct key, with every artifact (and nothing else) by digest."""
    for placed in cache.successes()[:4]:
        key, direct = placed.expected_keys()
        entry = server.alias(namespace, placed.address)
        assert entry is not None, placed.address
        assert entry["key"] == key
        assert entry["direct_key"] == direct
        assert entry["neuron_address"] == placed.address
        assert entry["components"]["compiler_version"] == placed.version
        assert entry["components"]["target"] == "trn1"
        assert entry["components"]["env"] == {}
        assert "compile_seconds" not in entry
        assert entry["files"] == {
            name: {"digest": digest(data), "size": len(data)}
            for name, data in placed.artifacts.items()
        }
        assert server.alias(namespace, direct) == entry


def test_import_from_a_directory_counts_every_kind(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # Its registry folder (optimum-neuron's 0_REGISTRY) is no entry, not even "empty".
    cache = standard_cache(tmp_path / "cache")
    code, out, err = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 0, err
    assert counts(out) == STANDARD_COUNTS
    assert err.strip() == (
        "neffcache import: 4 imported; skipped 1 failed, 1 locked, 1 empty, 2 unkeyable"
    )
    check_imported(server, namespace, cache)
    assert len(server.entries(namespace)) == 4
    # The old HLO name and the extra artifact travel under their own names.
    names = {n for e in server.entries(namespace) for n in e["files"]}
    assert {"model.hlo.pb", "model.hlo_module.pb", "wrapped_neff.hlo"} <= names
    assert not {"model.done", "model.log"} & names


def test_json_details_say_why_entries_were_unkeyable(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = standard_cache(tmp_path / "cache")
    _, out, _ = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    summary = json.loads(out)
    assert summary["namespace"] == namespace
    assert summary["source"] == str(cache.root)
    reasons = {d["address"]: d["reason"] for d in summary["details"]}
    assert set(reasons) == {cache.placed[7].address, cache.placed[8].address}
    assert "--target" in reasons[cache.placed[7].address]
    assert "HLO" in reasons[cache.placed[8].address] or "proto" in reasons[cache.placed[8].address]
    assert {d["outcome"] for d in summary["details"]} == {"unkeyable"}


class CountingCatalogs(MemoryCatalogs):
    """Counts the rows put: every manifest the server was asked to publish comes here,
    through the durable index's documented catalogs (recovery/documented.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    def put_new(self, row: Entry, facts: EntryFacts, names: Sequence[str]) -> Entry | None:
        self.puts += 1
        return super().put_new(row, facts, names)


class CountingIndex(MemoryIndex):
    """A memory index over ``CountingCatalogs``."""

    def __init__(self) -> None:
        super().__init__()
        self.catalogs = self.counted = CountingCatalogs()
        self._entries = CatalogEntries(self.catalogs)

    @property
    def puts(self) -> int:
        return self.counted.puts


def test_a_second_run_imports_nothing_new(
    tmp_path: Path, start_server: StartServer, neffcache: Run
) -> None:
    cache = standard_cache(tmp_path / "cache")
    index = CountingIndex()
    server = start_server(index=index)
    argv = ("import", str(cache.root), "--server", server.url, "--namespace", "team-a")
    assert neffcache(*argv)[0] == 0
    before = server.entries("team-a")
    assert index.puts == 4
    code, out, _ = neffcache(*argv, "--json")
    assert code == 0
    assert counts(out) == {"present": 4, "failed": 1, "locked": 1, "empty": 1, "unkeyable": 2}
    assert index.puts == 4  # checked by key first: not even a manifest was sent
    assert server.entries("team-a") == before


def test_the_target_option_keys_entries_without_one(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a", flags=["--model-type=transformer"])
    base = ("import", str(cache.root), "--server", server.url, "--namespace", namespace)
    code, out, _ = neffcache(*base, "--json")
    assert counts(out) == {"unkeyable": 1}
    code, out, _ = neffcache(*base, "--json", "--target", "trn2")
    assert code == 0
    assert counts(out) == {"imported": 1}
    entry = server.alias(namespace, placed.address)
    assert entry is not None
    assert entry["key"] == placed.expected_keys(target="trn2")[0]
    assert entry["components"]["target"] == "trn2"


def test_the_flags_own_target_wins_over_the_option(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a")  # --target=trn1 in its flags
    argv = ("import", str(cache.root), "--server", server.url, "--namespace", namespace)
    assert neffcache(*argv, "--target", "trn2")[0] == 0
    entry = server.alias(namespace, placed.address)
    assert entry is not None
    assert entry["components"]["target"] == "trn1"
    assert entry["key"] == placed.expected_keys()[0]


def test_another_trace_of_the_same_program_is_present_not_a_conflict(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    # block_b_renamed is block_a traced from another file with other names: the same
    # canonical key, another address and direct key.
    cache = StockCache(tmp_path / "cache")
    first = cache.add("block_a")
    second = cache.add("block_b_renamed")
    assert first.expected_keys()[0] == second.expected_keys()[0]
    argv = ("import", str(cache.root), "--server", server.url, "--namespace", namespace)
    code, out, err = neffcache(*argv, "--json")
    assert code == 0
    assert counts(out) == {"imported": 1, "present": 1}
    # The second trace's address and direct key find the entry too: the hook on
    # another host may probe the address before the HLO is in L1
    # (docs/neuron-sdk.md#hit-detection).
    key, direct = second.expected_keys()
    assert direct != first.expected_keys()[1]
    for alias in (second.address, direct):
        found = server.alias(namespace, alias)
        assert found is not None, alias
        assert found["key"] == key
        assert found["neuron_address"] == first.address  # the entry itself is unchanged
    assert json.loads(out)["aliases_added"] == 2
    assert err.strip() == "neffcache import: 1 imported, 1 present; aliases added: 2"
    code, out, _ = neffcache(*argv, "--json")
    assert json.loads(out)["aliases_added"] == 0
    assert counts(out) == {"present": 2}


def test_import_from_s3_matches_the_directory_import(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run, s3_bucket: str
) -> None:
    import boto3  # type: ignore[import-untyped]

    cache = standard_cache(tmp_path / "cache")
    bucket, _, prefix = s3_bucket.removeprefix("s3://").partition("/")
    client = boto3.session.Session().client("s3")
    try:
        for path in sorted(cache.root.rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(cache.root)}"
                client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        # A folder that is no MODULE_ one, files directly in it: not an entry either.
        registry = f"{prefix}/neuronxcc-{V1}/0_REGISTRY/index.json"
        client.put_object(Bucket=bucket, Key=registry, Body=b"{}")
    finally:
        client.close()
    code, out, err = neffcache(
        "import", s3_bucket, "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 0, err
    assert counts(out) == STANDARD_COUNTS
    check_imported(server, namespace, cache)
    from_dir = f"{namespace[:50]}-dir"
    neffcache("import", str(cache.root), "--server", server.url, "--namespace", from_dir)
    strip = ("created_at", "namespace", "writer")

    def manifests(ns: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in e.items() if k not in strip} for e in server.entries(ns)]

    assert manifests(namespace) == manifests(from_dir)


def test_s3_source_that_does_not_exist_is_one_line(
    server: Server, namespace: str, neffcache: Run, s3_bucket: str
) -> None:
    bucket = s3_bucket.removeprefix("s3://").partition("/")[0]
    code, out, err = neffcache(
        "import", f"s3://{bucket}-absent/x", "--server", server.url, "--namespace", namespace
    )
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "NoSuchBucket" in err


class FailingBlobs(MemoryBlobStore):
    """Takes ``allow`` uploads, then refuses every one as out of space."""

    def __init__(self, allow: int) -> None:
        super().__init__()
        self.allow = allow

    def commit(self, staged: Path, digest: str) -> bool:
        if self.allow <= 0:
            raise StoreFull("no space left (test)")
        self.allow -= 1
        return super().commit(staged, digest)


def test_a_refused_upload_leaves_no_entry_and_a_rerun_completes(
    tmp_path: Path, start_server: StartServer, neffcache: Run
) -> None:
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("variant_op", extra={"wrapped_neff.hlo": b"w" * 5000})
    other = cache.add("block_a")
    blobs = FailingBlobs(allow=2)  # the first entry has four files
    server = start_server(blobs=blobs)
    argv = ("import", str(cache.root), "--server", server.url, "--namespace", "team-a")
    code, out, _ = neffcache(*argv, "--json")
    assert code == 1  # per-entry errors: the run went on, and says so
    assert counts(out) == {"error": 2}
    assert [d["address"] for d in json.loads(out)["details"]] == [placed.address, other.address]
    assert "507" in json.loads(out)["details"][0]["reason"]
    assert server.entries("team-a") == []
    assert server.alias("team-a", placed.address) is None
    blobs.allow = 100
    code, out, _ = neffcache(*argv, "--json")
    assert code == 0
    assert counts(out) == {"imported": 2}
    assert server.alias("team-a", placed.address) is not None


def test_an_entry_the_server_holds_under_its_key_is_present_and_left_alone(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    import httpx

    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a")
    key, _ = placed.expected_keys()
    neff = b"another NEFF"
    httpx.put(f"{server.url}/v1/blobs/{digest(neff)}", content=neff).raise_for_status()
    manifest = {"key": key, "files": {"model.neff": {"digest": digest(neff), "size": len(neff)}}}
    url = f"{server.url}/v1/ns/{namespace}/entries/{key}"
    httpx.put(url, content=json.dumps(manifest)).raise_for_status()
    # Present by key: counted before any upload, whatever the manifest.
    code, out, _ = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 0
    assert counts(out) == {"present": 1}
    entry = server.get(f"/v1/ns/{namespace}/entries/{key}").json()
    assert entry["files"] == manifest["files"]
    # Its address now finds that entry: the same program, compiled elsewhere.
    assert server.alias(namespace, placed.address) == entry


@pytest.mark.parametrize("state", ["failed", "locked", "empty"])
def test_unfinished_entries_upload_nothing(
    tmp_path: Path, start_server: StartServer, neffcache: Run, state: str
) -> None:
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a", state, version=V1)
    server = start_server()
    argv = ("import", str(cache.root), "--server", server.url, "--namespace", "team-a")
    code, out, _ = neffcache(*argv, "--json")
    assert code == 0
    assert counts(out) == {state: 1}
    assert isinstance(server.blobs, MemoryBlobStore)
    assert server.blobs.size(digest(cache.placed[0].hlo)) is None


# --- symlinks and unreadable folders ------------------------------------------------------
# /var/tmp/neuron-compile-cache, the SDK's default, sits in a world-writable directory:
# another local user can plant a symlink there to a file only the importing user can
# read, which the import would then publish to every reader of the namespace.


def planted_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY----- (test)")
    return secret


def test_a_file_symlinked_out_of_src_is_an_error_unless_followed(
    tmp_path: Path, start_server: StartServer, neffcache: Run
) -> None:
    secret = planted_secret(tmp_path)
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a")
    neff = cache.root / placed.address / "model.neff"
    neff.unlink()
    neff.symlink_to(secret)
    server = start_server()
    argv = ("import", str(cache.root), "--server", server.url, "--namespace", "team-a", "--json")
    code, out, _ = neffcache(*argv)
    assert code == 1
    assert counts(out) == {"error": 1}
    (detail,) = json.loads(out)["details"]
    assert detail["address"] == placed.address
    assert f"model.neff is a symlink to {secret}, outside" in detail["reason"]
    assert "--follow-symlinks" in detail["reason"]
    assert isinstance(server.blobs, MemoryBlobStore)
    assert server.blobs.size(digest(secret.read_bytes())) is None
    assert server.blobs.size(digest(placed.hlo)) is None  # nothing of the entry either
    # Followed on purpose (optimum-neuron links Hugging Face blobs into caches).
    code, out, _ = neffcache(*argv, "--follow-symlinks")
    assert code == 0
    assert counts(out) == {"imported": 1}
    assert server.blobs.size(digest(secret.read_bytes())) == len(secret.read_bytes())


def test_entry_and_version_folders_symlinked_out_of_src_are_errors(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    elsewhere = StockCache(tmp_path / "elsewhere")
    one = elsewhere.add("block_a")
    two = elsewhere.add("variant_shape", version="2.21.1.0+abcdef12")
    three = elsewhere.add("variant_op", version="2.21.1.0+abcdef12")
    cache = StockCache(tmp_path / "cache")
    inside = cache.add("variant_dtype")
    linked = one.address.replace("MODULE_9", "MODULE_1")  # the serials of both caches meet
    (cache.root / linked).symlink_to(elsewhere.root / one.address)  # an entry folder
    version = two.address.split("/")[0]
    (cache.root / version).symlink_to(elsewhere.root / version)  # a version folder
    code, out, _ = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 1
    assert counts(out) == {"imported": 1, "error": 3}
    reasons = {d["address"]: d["reason"] for d in json.loads(out)["details"]}
    assert set(reasons) == {linked, two.address, three.address}
    assert f"{linked} is a symlink to {elsewhere.root / one.address}" in reasons[linked]
    assert f"{version} is a symlink to" in reasons[two.address]
    assert server.alias(namespace, linked) is None
    assert server.alias(namespace, two.address) is None
    assert server.alias(namespace, inside.address) is not None


def test_a_symlink_that_stays_in_src_is_imported(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache = StockCache(tmp_path / "cache")
    placed = cache.add("block_a")
    version = placed.address.split("/")[0]
    other = "neuronxcc-2.20.9961.0+ffffffff"
    (cache.root / other).symlink_to(version)  # relative: the same folder, another build
    code, out, _ = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 0
    assert counts(out) == {"imported": 2}
    assert server.alias(namespace, placed.address) is not None
    assert server.alias(namespace, placed.address.replace(version, other)) is not None


def test_one_unreadable_entry_folder_does_not_stop_the_import(
    tmp_path: Path,
    server: Server,
    namespace: str,
    neffcache: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tests run as root, where mode 0700 hides nothing: listing that one folder raises
    # PermissionError, as it would for another user's folder.
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
    code, out, _ = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", namespace, "--json"
    )
    assert code == 1
    assert counts(out) == {"imported": 1, "error": 1}
    (detail,) = json.loads(out)["details"]
    assert detail["address"] == bad.address
    assert "Permission denied" in detail["reason"]
    assert server.alias(namespace, good.address) is not None
