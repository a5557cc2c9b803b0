"""Unit tests for ``neffcache.client.runlog.record``: one JSON line per call, and
concurrent writers (processes sharing the file) never interleave lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from neffcache.client.runlog import record

REPO = Path(__file__).resolve().parents[2]


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_no_path_writes_nothing(tmp_path: Path) -> None:
    record(None, via="hook")
    record("", via="hook")
    assert list(tmp_path.iterdir()) == []


def test_one_line_per_call(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    record(str(path), via="wrapper", result="hit", key="k" * 64, bytes=12, fallback=None)
    record(str(path), via="hook", result="miss", compile_seconds=1.5)
    text = path.read_text()
    assert text.endswith("\n")
    first, second = lines(path)
    assert first["via"] == "wrapper"
    assert first["result"] == "hit"
    assert first["bytes"] == 12
    assert first["fallback"] is None
    assert second["compile_seconds"] == 1.5
    for line in (first, second):
        assert line["pid"] == os.getpid()
        assert line["host"] == socket.gethostname()
        stamp = datetime.fromisoformat(str(line["time"]))
        assert stamp.utcoffset() == timedelta(0)


def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"earlier": true}\n')
    record(str(path), via="hook")
    assert [line.get("earlier") for line in lines(path)] == [True, None]


def test_an_unwritable_path_is_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    record(str(blocker / "run.jsonl"), via="hook")
    assert "run manifest" in caplog.text


_WRITER = """
import sys
from neffcache.client.runlog import record
path, writer = sys.argv[1], int(sys.argv[2])
for seq in range(50):
    record(path, via="wrapper", writer=writer, seq=seq, pad="x" * (1000 + 97 * seq))
"""


@pytest.mark.e2e
def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / d) for d in ("keying", "client"))
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(n)], env=env)
        for n in range(8)
    ]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    written = lines(path)  # every line is whole JSON
    assert len(written) == 400
    assert Counter(line["writer"] for line in written) == {n: 50 for n in range(8)}
    for n in range(8):
        seqs = [line["seq"] for line in written if line["writer"] == n]
        assert seqs == list(range(50))  # each writer's lines in its own order
    assert all(line["pad"] == "x" * (1000 + 97 * int(str(line["seq"]))) for line in written)
