"""The commands' surface: where the server and namespace come from, every bad input as
one line on stderr with exit code 2, and a server that cannot answer as one line with
exit code 1."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from bridge.layout import StockCache
from support.bridge_server import Run, Server, StartServer

from neffcache.client.bridge.report import Progress, Report


def one_line_error(code: int, out: str, err: str, command: str) -> str:
    assert code == 2
    assert out == ""
    assert err.endswith("\n")
    assert err.count("\n") == 1, err
    assert err.startswith(f"neffcache {command}: error: ")
    assert "Traceback" not in err
    return err


@pytest.fixture
def cache(tmp_path: Path) -> StockCache:
    cache = StockCache(tmp_path / "cache")
    cache.add("block_a")
    return cache


def test_a_missing_source_is_one_line(tmp_path: Path, server: Server, neffcache: Run) -> None:
    result = neffcache(
        "import", str(tmp_path / "nowhere"), "--server", server.url, "--namespace", "a"
    )
    assert "is not a directory" in one_line_error(*result, "import")


def test_a_directory_that_is_no_stock_cache_is_one_line(
    tmp_path: Path, server: Server, neffcache: Run, cache: StockCache
) -> None:
    # The compiler-version folder itself, one level too deep.
    inner = next(cache.root.iterdir())
    result = neffcache("import", str(inner), "--server", server.url, "--namespace", "a")
    assert "neuronxcc-<version> folders" in one_line_error(*result, "import")
    result = neffcache("import", "http://example.com/x", "--server", server.url, "--namespace", "a")
    assert "s3://" in one_line_error(*result, "import")


def test_an_unreachable_server_is_one_line_and_exit_1(
    neffcache: Run, cache: StockCache, unused_port: int, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{unused_port}"
    for argv in (("import", str(cache.root)), ("export", str(tmp_path / "out"))):
        code, out, err = neffcache(*argv, "--server", url, "--namespace", "a")
        assert (code, out) == (1, "")
        assert err.startswith(f"neffcache {argv[0]}: cannot reach {url}")
        assert err.count("\n") == 1, err


def test_no_namespace_is_one_line(neffcache: Run, cache: StockCache, server: Server) -> None:
    err = one_line_error(*neffcache("import", str(cache.root), "--server", server.url), "import")
    assert "--namespace" in err
    err = one_line_error(*neffcache("export", "out", "--server", server.url), "export")
    assert "--namespace" in err


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--since", "last tuesday", "--since 'last tuesday' is not an ISO date"),
        ("--since", "2024-13-01", "is not an ISO date"),
        ("--compiler-version", "latest", "--compiler-version 'latest'"),
        ("--namespace", "Team A", "namespace 'Team A'"),
        ("--server", "cache.internal:8787", "use http://HOST:PORT"),
        (
            "--server",
            "neffcache+http://cache.internal:8787",
            "neffcache+http://HOST:PORT/NAMESPACE",
        ),
    ],
)
def test_bad_export_options_are_one_line(
    neffcache: Run, server: Server, tmp_path: Path, option: str, value: str, expected: str
) -> None:
    argv = ["export", str(tmp_path / "out"), "--server", server.url, "--namespace", "a"]
    argv += [option, value]
    assert expected in one_line_error(*neffcache(*argv), "export")
    assert not (tmp_path / "out").exists()


def test_a_dest_that_is_a_file_is_one_line(neffcache: Run, server: Server, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    argv = ("export", str(tmp_path / "file"), "--server", server.url, "--namespace", "a")
    assert "is not a directory" in one_line_error(*neffcache(*argv), "export")


def test_the_client_url_gives_server_and_namespace(
    neffcache: Run, cache: StockCache, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEFFCACHE_URL", f"neffcache+{server.url}/from-env")
    code, out, _ = neffcache("import", str(cache.root), "--json")
    assert code == 0
    summary = json.loads(out)
    assert (summary["server"], summary["namespace"]) == (server.url, "from-env")
    assert len(server.entries("from-env")) == 1
    # --namespace overrides the URL's.
    code, out, _ = neffcache("import", str(cache.root), "--namespace", "other-ns", "--json")
    assert json.loads(out)["namespace"] == "other-ns"
    assert len(server.entries("other-ns")) == 1


def test_a_refused_token_is_one_line(
    start_server: StartServer, neffcache: Run, cache: StockCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-admin-token-for-tests-only-0123456789"
    server = start_server(bootstrap_admin_token=secret)
    argv = ("import", str(cache.root), "--server", server.url, "--namespace", "a")
    err = one_line_error(*neffcache(*argv), "import")
    assert "refused the token (HTTP 401)" in err
    monkeypatch.setenv("NEFFCACHE_TOKEN", secret)
    code, out, _ = neffcache(*argv)
    assert code == 0
    assert out == "neffcache import: 1 imported\n"


def test_s3_without_boto3_says_which_extra(
    neffcache: Run, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 now raises ImportError
    argv = ("import", "s3://bucket/prefix", "--server", server.url, "--namespace", "a")
    err = one_line_error(*neffcache(*argv), "import")
    assert "pip install 'neffcache[s3]'" in err


def test_import_and_export_need_no_server_extra(
    neffcache: Run, cache: StockCache, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The bridge is the client's: its HTTP is the client's own, not httpx.
    for module in ("httpx", "fastapi", "pydantic"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it now fails
    argv = ("--server", "http://127.0.0.1:1", "--namespace", "a")
    for command, place in (("import", cache.root), ("export", tmp_path / "out")):
        code, out, err = neffcache(command, str(place), *argv)
        assert (code, out) == (1, "")
        assert err.startswith(f"neffcache {command}: cannot reach http://127.0.0.1:1")
        assert err.count("\n") == 1


@pytest.mark.e2e
def test_importing_the_cli_module_loads_nothing_heavy() -> None:
    code = (
        "import sys; import neffcache.client.bridge.cli; "
        "print(sorted(m for m in ('httpx', 'boto3', 'fastapi', 'pydantic', 'google.protobuf') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_on_a_terminal_only() -> None:
    terminal, pipe = Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        progress = Progress("neffcache import", stream, total=2)
        progress.advance("first")
        progress.advance("second")
        progress.close()
    assert pipe.getvalue() == ""
    assert "[" + "#" * 30 + "] 2/2 second" in terminal.getvalue()
    assert terminal.getvalue().endswith("\r\033[K")  # erased before the summary


def test_the_summary_line_names_only_what_happened() -> None:
    report = Report("import", ("imported", "present"), ("failed", "empty"))
    assert report.line() == "neffcache import: nothing new"
    for outcome in ("imported", "imported", "failed", "error", "error"):
        report.add(outcome, "addr", "why")
    assert report.line() == "neffcache import: 2 imported; skipped 1 failed; 2 errors"
    assert report.details == [{"address": "addr", "outcome": "error", "reason": "why"}] * 2


def test_ctrl_c_during_an_import_is_one_line_and_130(
    start_server: StartServer,
    neffcache: Run,
    cache: StockCache,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from neffcache.client.bridge import importer

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    server = start_server()
    monkeypatch.setattr(importer, "publish", interrupted)  # keyed, blobs not yet sent
    code, out, err = neffcache(
        "import", str(cache.root), "--server", server.url, "--namespace", "team-a"
    )
    assert (code, out) == (130, "")
    assert err.count("\n") == 1
    assert err.startswith("neffcache import: interrupted; ")
    assert server.entries("team-a") == []


def test_ctrl_c_during_an_export_is_one_line_and_130_and_leaves_no_staging(
    tmp_path: Path,
    server: Server,
    neffcache: Run,
    cache: StockCache,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from neffcache.client.bridge.remote import Remote

    argv = ("--server", server.url, "--namespace", "ctrl-c-export")
    assert neffcache("import", str(cache.root), *argv)[0] == 0
    fetch = Remote.fetch_blob

    def interrupted(self: Remote, digest: str, size: int, dest: Path) -> None:
        fetch(self, digest, size, dest)  # a file written into the staging folder
        raise KeyboardInterrupt

    monkeypatch.setattr(Remote, "fetch_blob", interrupted)
    dest = tmp_path / "export"
    code, out, err = neffcache("export", str(dest), *argv)
    assert (code, out) == (130, "")
    assert err.count("\n") == 1
    assert err.startswith("neffcache export: interrupted; ")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "lock",
        cache.placed[0].address.split("/")[0],
    ]
