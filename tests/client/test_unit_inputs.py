"""What the shim makes of its input (``neffcache.client.inputs``): kinds by content,
not by name, and the keys of each kind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from neffcache.client.inputs import MAX_DIRECTORY_FILES, Unkeyable, read_input
from neffcache.keying import CompileContext, direct_key

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HLO = FIXTURES / "hlo"


def ctx(target: str = "trn1") -> CompileContext:
    return CompileContext.create(compiler_version="2.20.9961.0+0acef03a", target=target, flags=[])


@pytest.mark.parametrize("name", ["model.hlo_module.pb", "graph.hlo", "module.hlo.pb", "noname"])
def test_an_hlo_module_under_any_name(tmp_path: Path, name: str) -> None:
    data = (HLO / "block_a.pb").read_bytes()
    path = tmp_path / name
    path.write_bytes(data)
    graph = read_input(path)
    assert graph.direct(ctx()) == direct_key(data, ctx())
    canonical = graph.canonical(ctx())
    assert canonical is not None
    assert graph.kind == "hlo"
    assert graph.module == data
    renamed = tmp_path / "other"
    renamed.write_bytes((HLO / "block_b_renamed.pb").read_bytes())
    assert read_input(renamed).canonical(ctx()) == canonical  # the same program


def test_bytes_that_are_no_graph_are_unkeyable(tmp_path: Path) -> None:
    path = tmp_path / "module.mlir"
    path.write_bytes(os.urandom(256))
    graph = read_input(path)
    graph.direct(ctx())  # a direct key costs nothing and can never hit
    with pytest.raises(Unkeyable, match="not an HloModuleProto"):
        graph.canonical(ctx())


def test_a_fifo_is_unkeyable_without_reading_it(tmp_path: Path) -> None:
    fifo = tmp_path / "in.pb"
    os.mkfifo(fifo)
    with pytest.raises(Unkeyable, match="not a regular file"):
        read_input(fifo)


def trace_folder(root: Path, weights: bytes = b"\x93NUMPY w0", graph: str = "block_a") -> Path:
    model = root / "model"
    (model / "weights").mkdir(parents=True)
    (model / "graph.hlo").write_bytes((HLO / f"{graph}.pb").read_bytes())
    (model / "metadata.json").write_text('{"names": ["x"]}')
    (model / "weights" / "w0.npy").write_bytes(weights)
    return model


def test_a_trace_folder_keys_every_file(tmp_path: Path) -> None:
    base = read_input(trace_folder(tmp_path / "a"))
    assert base.kind == "directory"
    direct, canonical = base.direct(ctx()), base.canonical(ctx())
    assert canonical is not None
    assert base.module == (HLO / "block_a.pb").read_bytes()
    same = read_input(trace_folder(tmp_path / "b"))
    assert (same.direct(ctx()), same.canonical(ctx())) == (direct, canonical)
    retraced = read_input(trace_folder(tmp_path / "c", graph="block_b_renamed"))
    assert retraced.direct(ctx()) != direct
    assert retraced.canonical(ctx()) == canonical  # names and metadata do not split it
    other = read_input(trace_folder(tmp_path / "d", weights=b"\x93NUMPY w1"))
    assert other.direct(ctx()) != direct
    assert other.canonical(ctx()) != canonical  # other weights never hit
    extra = trace_folder(tmp_path / "e")
    (extra / "weights" / "w1.npy").write_bytes(b"more")
    assert read_input(extra).canonical(ctx()) != canonical


def test_a_trace_folder_is_not_a_file_of_the_same_bytes(tmp_path: Path) -> None:
    folder = read_input(trace_folder(tmp_path))
    graph = read_input(tmp_path / "model" / "graph.hlo")
    assert folder.direct(ctx()) != graph.direct(ctx())
    assert folder.canonical(ctx()) != graph.canonical(ctx())


def test_a_folder_without_a_readable_graph_has_only_its_raw_key(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "graph.hlo").write_bytes(b"not a module")
    graph = read_input(model)
    assert graph.canonical(ctx()) is None
    assert graph.module is None


def test_a_link_to_a_folder_is_unkeyable(tmp_path: Path) -> None:
    model = trace_folder(tmp_path)
    (model / "loop").symlink_to(model)
    with pytest.raises(Unkeyable, match="links to a folder"):
        read_input(model)


def test_a_link_to_a_file_is_read_through(tmp_path: Path) -> None:
    model = trace_folder(tmp_path / "a")
    outside = tmp_path / "w1.npy"
    outside.write_bytes(b"one")
    (model / "weights" / "w1.npy").symlink_to(outside)
    before = read_input(model).canonical(ctx())
    outside.write_bytes(b"two")
    assert read_input(model).canonical(ctx()) != before


def test_too_many_files_is_unkeyable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import neffcache.client.inputs as inputs

    monkeypatch.setattr(inputs, "MAX_DIRECTORY_FILES", 3)
    model = trace_folder(tmp_path)
    (model / "a").write_bytes(b"a")
    (model / "b").write_bytes(b"b")
    with pytest.raises(Unkeyable, match="over 3 files"):
        read_input(model)
    assert MAX_DIRECTORY_FILES > 1000


@pytest.mark.parametrize(
    "named", ["/ckpt/0.npy", "../shared/0.npy", "weights/../../x.npy", "~/w.npy"]
)
def test_a_trace_whose_metadata_names_files_outside_it_is_unkeyable(
    tmp_path: Path, named: str
) -> None:
    model = trace_folder(tmp_path)
    (model / "metadata.json").write_text(json.dumps({"weights": {"0": named}}))
    with pytest.raises(Unkeyable, match="outside the folder"):
        read_input(model)


def test_a_trace_whose_metadata_names_its_own_files_is_keyed(tmp_path: Path) -> None:
    model = trace_folder(tmp_path)
    (model / "metadata.json").write_text(json.dumps({"weights": {"0": "weights/w0.npy"}}))
    assert read_input(model).canonical(ctx()) is not None
