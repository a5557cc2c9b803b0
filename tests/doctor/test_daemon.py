"""The shim's hit daemon (``paths.daemon``): off, a socket directory the shim will not
use, a socket name too long, none running yet (and why one did not start, from its
log), and a real daemon started by a shim call, found on the socket the shim named."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from doctor.doctor_harness import doctor_env, results
from support.daemons import daemons

pytestmark = pytest.mark.e2e

URL = "neffcache+http://127.0.0.1:9/team-a"
WAIT = 60.0  # seconds a daemon may take to start on a loaded machine


def daemon_check(env: dict[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = results(env, "--only", "paths")[1]["paths.daemon"]
    return found


@pytest.mark.parametrize(
    ("url", "daemon", "why"),
    [
        pytest.param(URL, " Off", "the hit daemon is off (NEFFCACHE_DAEMON)", id="off"),
        pytest.param(None, None, "no neffcache URL is configured", id="no-url"),
    ],
)
def test_skipped_when_off_or_without_a_url(
    tmp_path: Path, sockets: Path, url: str | None, daemon: str | None, why: str
) -> None:
    env = doctor_env(tmp_path, url, NEFFCACHE_DAEMON=daemon, NEFFCACHE_DAEMON_DIR=str(sockets))
    check = daemon_check(env)
    assert check["status"] == "SKIP", check
    assert why in check["evidence"]


def test_a_directory_others_may_enter_is_a_warning_with_its_fix(
    tmp_path: Path, sockets: Path
) -> None:
    sockets.chmod(0o755)
    check = daemon_check(doctor_env(tmp_path, URL, NEFFCACHE_DAEMON_DIR=str(sockets)))
    assert check["status"] == "WARN", check
    assert f"the daemon's directory {sockets} is yours, mode 0755" in check["evidence"]
    assert "the shim neither uses nor starts a daemon" in check["evidence"]
    assert check["fix"].startswith(f"chmod 700 {sockets}, or set NEFFCACHE_DAEMON_DIR")


def test_a_socket_name_too_long_is_a_warning(tmp_path: Path) -> None:
    deep = Path("/tmp", "d" * 100)
    check = daemon_check(doctor_env(tmp_path, URL, NEFFCACHE_DAEMON_DIR=str(deep)))
    assert check["status"] == "WARN", check
    assert f"the daemon's socket {deep}/hits-" in check["evidence"]
    assert "over the 100 a Unix socket's name may have" in check["evidence"]
    assert "NEFFCACHE_DAEMON_DIR" in check["fix"]


def test_none_running_yet_then_the_log_says_why(tmp_path: Path, sockets: Path) -> None:
    absent = sockets / "made-by-the-first-shim-call"
    env = doctor_env(tmp_path, URL, NEFFCACHE_DAEMON_DIR=str(absent))
    check = daemon_check(env)
    assert check["status"] == "PASS", check
    path = check["data"]["socket"]
    assert check["evidence"] == f"none running yet on {path}; the next shim call starts one"
    assert os.path.dirname(path) == str(absent)
    assert not absent.exists(), "the doctor made the directory"
    # A daemon that failed to start wrote why in the log beside its socket.
    absent.mkdir(mode=0o700)
    Path(f"{path}.log").write_text("Traceback (most recent call last):\nImportError: planted\n")
    check = daemon_check(env)
    assert check["status"] == "PASS", check
    assert check["evidence"].endswith("its log's last line: ImportError: planted")
    assert check["data"]["running"] is False


def answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def test_a_daemon_a_shim_call_started_is_found_running(tmp_path: Path, sockets: Path) -> None:
    env = doctor_env(tmp_path, URL, NEFFCACHE_DAEMON_DIR=str(sockets))
    # The shim on PATH finds no daemon, answers --version itself and starts one.
    done = subprocess.run(
        ["neuronx-cc", "--version"], env=env, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + WAIT
    while not (found := sorted(sockets.glob("hits-*.sock"))) or not answers(found[0]):
        assert time.monotonic() < deadline, "no daemon started"
        time.sleep(0.05)
    assert daemons(sockets)
    check = daemon_check(env)
    assert check["status"] == "PASS", check
    # The socket the shim's own Python named, computed by the doctor in that Python.
    assert check["evidence"] == f"running: a hit daemon answers on {found[0]}"
    assert check["data"]["running"] is True
    assert daemons(sockets), "the doctor's connect made the daemon leave"
