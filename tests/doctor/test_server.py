"""Server: down, a skewed clock, a server older than ``/v1/status``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from doctor.doctor_harness import StatusServer, doctor_env, results, run_doctor, status_body
from support.e2e import SilentServer

pytestmark = pytest.mark.e2e


def test_a_server_that_is_down(tmp_path: Path, unused_port: int) -> None:
    env = doctor_env(tmp_path, f"neffcache+http://127.0.0.1:{unused_port}/team-a")
    began = time.monotonic()
    code, checks = results(env, "--only", "config", "--only", "server")
    assert time.monotonic() - began < 60  # the connect timeout bounds it
    reach = checks["server.reach"]
    assert reach["status"] == "FAIL", reach
    assert f"no answer from http://127.0.0.1:{unused_port}" in reach["evidence"]
    assert "check that `neffcache serve` runs at" in reach["fix"]
    assert "NEFFCACHE_CONNECT_TIMEOUT is 2 s" in reach["fix"]
    for check in ("server.clock", "server.round-trip", "config.token", "config.namespace"):
        assert checks[check]["status"] == "SKIP", checks[check]
    assert code == 1


def test_a_server_that_never_answers_is_bounded_by_the_timeouts(
    tmp_path: Path, silent_server: SilentServer
) -> None:
    port = silent_server.port
    env = doctor_env(tmp_path, f"neffcache+http://127.0.0.1:{port}/team-a", NEFFCACHE_TIMEOUT="1")
    began = time.monotonic()
    done = run_doctor(env, "--only", "server")
    assert time.monotonic() - began < 30
    assert done.code == 1
    assert "FAIL  server.reach" in done.out


def test_a_skewed_clock(status_server: StatusServer, tmp_path: Path) -> None:
    status_server.body = status_body("team-a")
    status_server.skew = 3600.0  # the server is an hour ahead: this host is behind
    env = doctor_env(tmp_path, status_server.url("team-a"))
    code, checks = results(env, "--only", "server", "--read-only")
    clock = checks["server.clock"]
    assert clock["status"] == "WARN", clock
    assert "this host's clock is 3600" in clock["evidence"]
    assert "behind the server's" in clock["evidence"]
    assert "sync the clock" in clock["fix"]
    assert abs(clock["data"]["skew_seconds"] - 3600) < 5
    assert code == 0


def test_a_server_older_than_the_status_route(status_server: StatusServer, tmp_path: Path) -> None:
    status_server.old = True
    env = doctor_env(tmp_path, status_server.url("team-a"))
    code, checks = results(env, "--only", "config", "--only", "server", "--read-only")
    reach = checks["server.reach"]
    assert reach["status"] == "WARN", reach
    assert "has no /v1/status" in reach["evidence"]
    assert "upgrade the server" in reach["fix"]
    assert checks["server.clock"]["status"] == "SKIP"
    # What the token may do comes from the round trip instead.
    assert checks["config.token"]["status"] == "PASS", checks["config.token"]
    assert "as the round trip showed" in checks["config.token"]["evidence"]
    assert checks["server.round-trip"]["status"] == "PASS"
    assert code == 0
