"""Ctrl-C in the long commands, as a KeyboardInterrupt injected mid-run: one line on
stderr, exit 130, and with ``--json`` the counts so far as the summary, marked
``interrupted``; ``prewarm``, ``import`` and ``export`` alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge.layout import StockCache
from support.cli_server import TOKEN, Run, Server

from neffcache.client import prewarm
from neffcache.client.bridge import exporter, importer
from neffcache.client.bridge.remote import Remote


def interrupt_on_call(n: int, result: Any) -> Any:
    """A stand-in that returns ``result`` on its first ``n - 1`` calls and then is
    interrupted."""
    calls = 0

    def call(*args: object, **kwargs: object) -> Any:
        nonlocal calls
        calls += 1
        if calls >= n:
            raise KeyboardInterrupt
        return result

    return call


@pytest.mark.parametrize("as_json", [True, False])
def test_prewarm(
    as_json: bool,
    neffcache: Run,
    server: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manifest = tmp_path / "run.jsonl"
    manifest.write_text("".join(json.dumps({"key": f"{n:064x}"}) + "\n" for n in range(3)))
    shown: list[int] = []
    draw = prewarm.Progress.show

    def show(bar: prewarm.Progress, done: int, fetched: int) -> None:
        shown.append(done)
        if done == 2:  # two graphs in (missing on the server), the third not counted
            raise KeyboardInterrupt
        draw(bar, done, fetched)

    monkeypatch.setattr(prewarm.Progress, "show", show)
    argv = ["prewarm", "--manifest", str(manifest), "--parallel", "1", "--token", TOKEN]
    argv += ["--server", f"neffcache+{server.url}/interrupted"]
    done = neffcache(*argv, *(["--json"] if as_json else []))
    assert done.code == 130, done.err
    (line,) = done.err.splitlines()
    assert line.startswith("neffcache prewarm: interrupted; 3 graphs (3 lines, 0 malformed): ")
    assert "0 fetched, 2 missing on the server, 0 failed" in line
    if not as_json:
        assert done.out == ""
        return
    summary = json.loads(done.out)
    assert summary["interrupted"] is True
    assert (summary["graphs"], summary["missing"], summary["failed"]) == (3, 2, 0)


@pytest.fixture
def two_entries(tmp_path: Path) -> Path:
    cache = StockCache(tmp_path / "stock")
    cache.add("block_a")
    cache.add("attrs_ab")
    return cache.root


@pytest.mark.parametrize("as_json", [True, False])
def test_import(
    as_json: bool,
    neffcache: Run,
    two_entries: Path,
    monkeypatch: pytest.MonkeyPatch,
    unused_port: int,
) -> None:
    monkeypatch.setattr(
        importer, "import_entry", interrupt_on_call(2, importer.Outcome("imported"))
    )
    argv = ["import", str(two_entries), "--server", f"http://127.0.0.1:{unused_port}"]
    done = neffcache(*argv, "--namespace", "a", *(["--json"] if as_json else []))
    assert done.code == 130, done.err
    assert done.err == (
        "neffcache import: interrupted; entries published so far are complete, "
        "run it again to go on\n"
    )
    if not as_json:
        assert done.out == ""
        return
    summary = json.loads(done.out)
    assert summary["interrupted"] is True
    assert summary["counts"]["imported"] == 1
    assert sum(summary["counts"].values()) == 1


@pytest.mark.parametrize("as_json", [True, False])
def test_export(
    as_json: bool,
    neffcache: Run,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    unused_port: int,
) -> None:
    def pages(self: Remote, limit: int = 0) -> Iterator[list[dict[str, Any]]]:
        yield [{"key": f"{n:064x}"} for n in range(3)]

    monkeypatch.setattr(Remote, "pages", pages)
    monkeypatch.setattr(exporter, "export_entry", interrupt_on_call(3, ("exported", None)))
    argv = ["export", str(tmp_path / "out"), "--server", f"http://127.0.0.1:{unused_port}"]
    done = neffcache(*argv, "--namespace", "a", *(["--json"] if as_json else []))
    assert done.code == 130, done.err
    assert done.err == (
        "neffcache export: interrupted; entries written so far are complete, "
        "run it again to go on\n"
    )
    if not as_json:
        assert done.out == ""
        return
    summary = json.loads(done.out)
    assert summary["interrupted"] is True
    assert summary["counts"]["exported"] == 2
    assert sum(summary["counts"].values()) == 2


def test_a_finished_run_says_it_was_not_interrupted(
    neffcache: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unused_port: int
) -> None:
    def pages(self: Remote, limit: int = 0) -> Iterator[list[dict[str, Any]]]:
        yield []

    monkeypatch.setattr(Remote, "pages", pages)
    argv = ["export", str(tmp_path / "out"), "--server", f"http://127.0.0.1:{unused_port}"]
    done = neffcache(*argv, "--namespace", "a", "--json")
    assert done.code == 0, done.err
    assert json.loads(done.out)["interrupted"] is False
