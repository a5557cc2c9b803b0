"""docs/quickstart.md, run as written on one host: every shell and Dockerfile line of
the page in order, with only the host's name, the data directory and the secrets
(``...``, ``KEY``) put in, then a job through the shim in between steps 3 and 4.

The install lines are checked, not run: they install this checkout, which the test
run already has installed, and a package index is not to be reached from a test.
The compiler is the stand-in (tests/standins/neuronx-cc), found on PATH after the
shim, as a training image finds the real one.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from docs.doctext import DOCS, blocks, logical_lines
from support.e2e import STANDINS, clean_environ, compile_args, hlo, search_path

pytestmark = pytest.mark.e2e

PAGE = DOCS / "quickstart.md"
HOST = "cache.internal:8787"
DATA_DIR = "/var/lib/neffcache"
SHIM_DIR = "/opt/neffcache/shim"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Host:
    """The one host the page's commands run on: its environment and its server."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = _free_port()
        self.env = clean_environ()
        self.env["HOME"] = str(tmp / "home")
        self.server: subprocess.Popen[bytes] | None = None
        self.secrets: dict[str, str] = {}  # the token each step was given
        self.secret = "..."  # what `...` stands for now
        self.key = "KEY"

    def put_in(self, line: str) -> str:
        line = line.replace(HOST, f"127.0.0.1:{self.port}")
        line = line.replace(DATA_DIR, str(self.tmp / "data")).replace(
            SHIM_DIR, str(self.tmp / "shim")
        )
        # Servers in tests listen on loopback only.
        line = line.replace("--host 0.0.0.0", f"--host 127.0.0.1 --port {self.port}")
        line = line.replace("=...", f"={self.secret}")
        return " ".join(self.key if w == "KEY" else w for w in line.split(" "))

    def run(self, line: str) -> str:
        words = shlex.split(self.put_in(line))
        if words[0] == "export":
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                self.env[name] = value
            return ""
        if words[:2] == ["neffcache", "serve"]:
            self.serve(words)
            return ""
        done = subprocess.run(
            words, env=self.env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"`{line}` exited {done.returncode}: {done.stderr}"
        return done.stdout

    def serve(self, words: list[str]) -> None:
        log = self.tmp / "serve.log"
        with log.open("wb") as out:
            self.server = subprocess.Popen(words, env=self.env, stdout=out, stderr=out)
        deadline = time.monotonic() + 60  # a limit to stop waiting, not a timing claim
        while time.monotonic() < deadline:
            assert self.server.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        pytest.fail(f"the server did not answer /healthz: {log.read_text()}")

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=30)


def _secret_of(table: str) -> str:
    """The ``secret`` row of a token's record, as ``admin token create`` prints it."""
    (row,) = [line for line in table.splitlines() if line.startswith("secret")]
    return row.split()[1]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    one = Host(tmp_path)
    yield one
    one.stop()


def _steps() -> list[list[str]]:
    return [
        [line for _, line in logical_lines(block)]
        for block in blocks(PAGE)
        if block.lang in ("sh", "dockerfile")
    ]


def test_the_page_shows_four_steps_of_commands() -> None:
    steps = _steps()
    assert len(steps) == 4
    assert steps[0][0] == "pip install '.[server]'"  # this checkout, not a package index


def test_the_quickstart_runs_as_written(host: Host) -> None:
    server_step, team_step, image_step, look_step = _steps()

    # 1. Run a server: the install is this checkout's, then the admin token and serve.
    assert server_step[0] == "pip install '.[server]'"
    host.secrets["admin"] = _secret_of(host.run(server_step[1]))
    host.run(server_step[2])

    # 2. A namespace and a token, with the admin secret.
    host.secret = host.secrets["admin"]
    for line in team_step[:-1]:
        host.run(line)
    host.secrets["team"] = _secret_of(host.run(team_step[-1]))

    # 3. The training image: COPY and pip install this checkout; the shim; its settings.
    job = clean_environ()
    for line in image_step:
        instruction, _, rest = line.partition(" ")
        if instruction == "COPY":
            assert rest == "neffcache /tmp/neffcache"
        elif instruction == "RUN":
            install, _, shim = rest.partition(" && ")
            assert install == "pip install /tmp/neffcache"
            host.run(shim)
        else:
            assert instruction == "ENV", line
            name, _, value = host.put_in(rest).partition("=")
            job[name] = value.replace("$PATH", search_path(STANDINS))
    assert job["PATH"].startswith(str(host.tmp / "shim"))
    job["NEFFCACHE_TOKEN"] = host.secrets["team"]  # "from a secret at run time"
    job["NEFFCACHE_RUN_MANIFEST"] = str(host.tmp / "run.jsonl")
    job["NEFFCACHE_STANDIN_COUNTER"] = str(host.tmp / "compiles")
    # Two jobs on two hosts (two L1s): the first compiles and publishes, the second fetches.
    for n in (1, 2):
        job["NEFFCACHE_LOCAL_DIR"] = str(host.tmp / f"l1-{n}")
        argv = ["neuronx-cc", *compile_args(hlo("block_a"), host.tmp / f"out-{n}.neff")]
        done = subprocess.run(argv, env=job, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (host.tmp / "run.jsonl").read_text().splitlines()]
    assert [(line["result"], line["source"]) for line in lines] == [
        ("miss", "compiler"),
        ("hit", "server"),
    ]
    assert (host.tmp / "out-1.neff").read_bytes() == (host.tmp / "out-2.neff").read_bytes()
    compiles = (host.tmp / "compiles").read_text().splitlines()
    assert sum(" compile " in line for line in compiles) == 1

    # 4. What it did: a report and an explanation, with the team's token.
    host.secret, host.key = host.secrets["team"], lines[0]["key"]
    assert look_step[0].startswith("export NEFFCACHE_URL=")
    host.run(look_step[0])
    report = host.run(look_step[1])
    assert "team-a" in report
    explained = host.run(look_step[2])
    assert host.key[:12] in explained or "team-a" in explained, explained
