"""Import and export across the three eras of the stock layout
(docs/neuron-sdk.md#layout-eras), and an export that writes a folder for every stock
address an entry has."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from bridge.layout import StockCache, counts, hlo
from support.bridge_server import Run, Server, StartServer

from neffcache.client.bridge.stock import State, classify
from neffcache.keying import CompileContext, KeyInputs, StockEra, compute_key, fingerprint_hlo
from neffcache.server.index import Entry, Index

OLD = "2.14.227.0+2d4f85be"  # the version public caches show in both of the first eras
NEW = "2.16.372.0+4a9b2326"
TNX = ["--model-type=transformer", "--auto-cast=none", "--execute-repetition=1"]


@dataclass
class EraEntry:
    address: str
    files: dict[str, bytes]
    era: StockEra
    target: str


def lay_out(
    root: Path, fixture: str, era: StockEra, flags: bytes, module_key: str, target: str
) -> EraEntry:
    """One successful entry as the SDK of ``era`` wrote it: its flags file holding
    ``flags`` verbatim, ``<flags8>`` its md5, model.done only from JSON on."""
    flags8 = StockEra.RAW.flags_hash(flags.decode())  # every era hashes its file's text
    version = NEW if era is StockEra.TARGET else OLD
    address = f"neuronxcc-{version}/MODULE_{module_key}+{flags8}"
    hlo_name = "model.hlo.pb" if era is StockEra.RAW else "model.hlo_module.pb"
    files = {
        hlo_name: hlo(fixture),
        era.flags_file: flags,
        "model.neff": b"NEFF " + fixture.encode() + os.urandom(512),
    }
    folder = root / address
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    if era.marks_done:
        (folder / "model.done").write_bytes(b"")
    return EraEntry(address, files, era, target)


def era_cache(root: Path) -> list[EraEntry]:
    """The public examples of docs/neuron-sdk.md#layout-eras, one program each, plus
    NxDI's two words."""
    return [
        lay_out(root, "block_a", StockEra.RAW, b"--auto-cast none", "101", "trn1"),
        lay_out(root, "variant_shape", StockEra.JSON, b"[]", "102", "trn1"),
        lay_out(
            root,
            "variant_op",
            StockEra.JSON,
            b'["--model-type=transformer", "--auto-cast=none"]',
            "a" * 20,
            "trn1",
        ),
        lay_out(
            root,
            "variant_dtype",
            StockEra.TARGET,
            json.dumps(["--target=trn1", *TNX]).encode(),
            "b" * 20,
            "trn1",
        ),
        lay_out(
            root,
            "variant_dtype",
            StockEra.TARGET,
            json.dumps(["--target=trn2", *TNX]).encode(),
            "c" * 20,
            "trn2",
        ),
        lay_out(
            root,
            "variant_layout",
            StockEra.TARGET,
            json.dumps(["--target", "trn2", "--model-type=transformer"]).encode(),
            "d" * 20,
            "trn2",
        ),
    ]


def test_the_public_folder_names_are_laid_out(tmp_path: Path) -> None:
    names = [e.address.rsplit("+", 1)[1] for e in era_cache(tmp_path)]
    assert names[:5] == ["00875417", "d7517139", "d7cde3b5", "613edded", "7ac4dbae"]


def test_an_oldest_era_entry_without_model_done_is_a_success() -> None:
    assert classify({"model.hlo.pb", "compile_flags.txt", "model.neff"}) is State.SUCCESS
    assert classify({"model.hlo.pb", "compile_flags.txt", "model.neff.lock"}) is State.LOCKED
    assert classify({"model.hlo.pb", "compile_flags.txt"}) is State.EMPTY
    # A newer era's lone model.neff is still an interrupted write.
    assert classify({"model.hlo_module.pb", "compile_flags.json", "model.neff"}) is (
        State.INCOMPLETE
    )


def test_every_era_imports_keyed_by_its_own_flags_and_exports_back_alike(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    placed = era_cache(tmp_path / "cache")
    argv = ("--server", server.url, "--namespace", namespace, "--json")
    code, out, err = neffcache("import", str(tmp_path / "cache"), "--target", "trn1", *argv)
    assert code == 0, err
    assert counts(out) == {"imported": len(placed)}
    entries = {e["neuron_address"]: e for e in server.entries(namespace)}
    for one in placed:
        manifest = entries[one.address]
        assert manifest["stock_era"] == one.era.value
        hlo_name = next(n for n in one.files if n.startswith("model.hlo"))
        flags = json.loads(one.files["compile_flags.json"]) if one.era.marks_done else []
        ctx = CompileContext.create(
            compiler_version=one.address.split("/")[0].removeprefix("neuronxcc-"),
            target=one.target,
            flags=flags if one.era.marks_done else ["--auto-cast", "none"],
            env={},
        )
        key = compute_key(KeyInputs(fingerprint_hlo(one.files[hlo_name]), ctx)).key
        assert manifest["key"] == key, one.address

    dest = tmp_path / "export"
    code, out, err = neffcache("export", str(dest), *argv)
    assert code == 0, err
    for one in placed:
        written = {p.name: p.read_bytes() for p in (dest / one.address).iterdir()}
        done = {"model.done": b""} if one.era.marks_done else {}
        assert written == {**one.files, **done}, one.address
    # The export is the source again: a second import finds every entry present.
    code, out, _ = neffcache("import", str(dest), "--target", "trn1", *argv)
    assert counts(out) == {"present": len(placed)}


# --- every stock address of an entry gets its folder ---------------------------------


def two_traces(root: Path) -> tuple[StockCache, str, str]:
    """One program under two addresses (block_b_renamed is block_a traced from
    another file), and a second program under one."""
    cache = StockCache(root)
    first, second = cache.add("block_a"), cache.add("block_b_renamed")
    assert first.expected_keys()[0] == second.expected_keys()[0]
    cache.add("variant_shape")
    return cache, first.address, second.address


def test_export_writes_a_folder_for_each_stock_address_of_an_entry(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache, first, second = two_traces(tmp_path / "cache")
    argv = ("--server", server.url, "--namespace", namespace, "--json")
    code, out, err = neffcache("import", str(cache.root), *argv)
    assert code == 0, err
    assert counts(out) == {"imported": 2, "present": 1}

    dest = tmp_path / "export"
    code, out, err = neffcache("export", str(dest), *argv)
    assert code == 0, err
    summary = json.loads(out)
    assert counts(out) == {"exported": 2}
    assert (summary["folders_written"], summary["alias_folders"]) == (3, 1)
    assert summary["hard_links"] == 3  # the alias folder's three files
    assert {f"{p.parent.name}/{p.name}" for p in dest.glob("*/*")} == {
        p.address for p in cache.placed
    }
    a, b = dest / first, dest / second
    assert (a / "model.neff").read_bytes() == (b / "model.neff").read_bytes()
    assert (a / "model.neff").stat().st_ino == (b / "model.neff").stat().st_ino
    assert (a / "model.done").read_bytes() == (b / "model.done").read_bytes() == b""
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    assert "folders written: 3; alias folders: 1; hard links: 3" in err

    code, out, _ = neffcache("export", str(dest), *argv)
    assert counts(out) == {"present": 2}
    assert json.loads(out)["folders_written"] == 0


def test_without_hard_links_the_alias_folder_is_a_copy(
    tmp_path: Path,
    server: Server,
    namespace: str,
    neffcache: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache, first, second = two_traces(tmp_path / "cache")
    argv = ("--server", server.url, "--namespace", namespace, "--json")
    assert neffcache("import", str(cache.root), *argv)[0] == 0

    def no_links(src: object, dst: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    dest = tmp_path / "export"
    code, out, _ = neffcache("export", str(dest), *argv)
    assert code == 0
    assert (json.loads(out)["folders_written"], json.loads(out)["hard_links"]) == (3, 0)
    a, b = dest / first / "model.neff", dest / second / "model.neff"
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_ino != b.stat().st_ino
    assert (dest / second / "model.done").exists()


# --- GET /v1/ns/{namespace}/entries/{key}/aliases ------------------------------------


def test_the_alias_route_lists_an_entrys_aliases(
    tmp_path: Path, server: Server, namespace: str, neffcache: Run
) -> None:
    cache, first, second = two_traces(tmp_path / "cache")
    assert (
        neffcache("import", str(cache.root), "--server", server.url, "--namespace", namespace)[0]
        == 0
    )
    key = server.alias(namespace, first)
    assert key is not None
    response = server.get(f"/v1/ns/{namespace}/entries/{key['key']}/aliases")
    assert response.status_code == 200
    aliases = response.json()["aliases"]
    assert aliases == sorted(aliases)
    assert {first, second, key["direct_key"]} <= set(aliases)
    assert len(aliases) == 4  # two addresses, two direct keys
    missing = server.get(f"/v1/ns/{namespace}/entries/{'f' * 64}/aliases")
    assert (missing.status_code, missing.json()["reason"]) == (404, "absent")


def test_an_old_server_without_the_route_stops_the_export(
    tmp_path: Path, start_server: StartServer, neffcache: Run
) -> None:
    from neffcache.client.bridge.remote import Remote, Unusable

    app = start_server()
    remote = Remote(app.url, "team-a", None)
    try:
        assert remote.aliases("f" * 64) == []  # this server has the route
    finally:
        remote.close()
    import httpx
    from bridge.scripted import scripted

    old = scripted(lambda r: httpx.Response(404, json={"detail": "Not Found"}))
    with pytest.raises(Unusable, match="upgrade it"):
        old.aliases("f" * 64)


def test_aliases_of_in_every_index(any_index: Index, request: pytest.FixtureRequest) -> None:
    ns = f"aliases-{abs(hash(request.node.nodeid)) % 10**8}"
    key, other = "a" * 64, "b" * 64
    for k in (key, other):
        assert any_index.put_entry(Entry(ns, k, '{"k":1}', 1.0, "w"), ()).value == "created"
    assert any_index.aliases_of(ns, key) == []
    any_index.add_alias(ns, "neuronxcc-2.20.1.0+ab/MODULE_2+00000000", key)
    any_index.add_alias(ns, "neuronxcc-2.20.1.0+ab/MODULE_1+00000000", key)
    any_index.add_alias(ns, "c" * 64, key)
    any_index.add_alias(ns, "d" * 64, other)
    assert any_index.aliases_of(ns, key) == [
        "c" * 64,
        "neuronxcc-2.20.1.0+ab/MODULE_1+00000000",
        "neuronxcc-2.20.1.0+ab/MODULE_2+00000000",
    ]
    assert any_index.aliases_of(f"{ns}-x", key) == []
    any_index.delete_entry(ns, key, 1.0)
    assert any_index.aliases_of(ns, key) == []
    assert any_index.aliases_of(ns, other) == ["d" * 64]
