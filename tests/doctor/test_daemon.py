"""The shim's hit daemon (``paths.daemon``): off, a socket directory the shim will not
use, a socket name too long, none running yet (and why one did not start, from its
log), a real daemon started by a shim call, found on the socket the shim named, and
one the shim marked silent (and marks it would not have made)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from doctor.doctor_harness import doctor_env, results
from support.daemons import daemons

from neffcache.client import shimclient
from neffcache.client.doctor import daemon_checks

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


def test_a_daemon_the_shim_found_silent_is_a_warning_until_its_mark_is_stale(
    tmp_path: Path, sockets: Path
) -> None:
    """A daemon that accepts connections and never answers (stopped, stuck): the shim
    waits NEFFCACHE_DAEMON_WAIT, serves the call itself and marks it silent, and the
    doctor reads that mark where the shim wrote it. Once the mark is older than
    shimclient.SILENT_FOR the shim asks the daemon again: a note, no warning."""
    env = doctor_env(tmp_path, URL, NEFFCACHE_DAEMON_DIR=str(sockets), NEFFCACHE_DAEMON_WAIT="0.5")
    path = daemon_check(env)["data"]["socket"]
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        stuck.bind(path)
        stuck.listen(16)  # connections are queued, never accepted nor answered
        # Not pipes: the shim passes its standard output and error to the daemon, and a
        # connection never accepted holds them open until the socket is closed.
        stderr = tmp_path / "shim.stderr"
        with stderr.open("wb") as err:
            code = subprocess.call(
                ["neuronx-cc", "--version"], env=env, stdout=err, stderr=err, timeout=120
            )
        assert code == 0, stderr.read_text()
        mark = Path(shimclient.silent_mark(path))
        assert mark.is_file(), "the shim did not mark the silent daemon"
        check = daemon_check(env)
        assert check["status"] == "WARN", check
        assert check["evidence"].startswith(f"the shim skips the hit daemon on {path} until ")
        assert (
            f"in {mark}; a daemon accepts connections there but went silent" in (check["evidence"])
        )
        assert check["fix"] == (
            f"read why in its log, {path}.log; if it stays silent, export NEFFCACHE_DAEMON=0: "
            "the shim never asks nor starts a hit daemon; each call is a process of its own"
        )
        silent = check["data"]["silent"]
        assert silent["current"] is True
        assert silent["mark"] == str(mark)
        assert silent["until"] in check["evidence"]
        assert check["data"]["running"] is True

        long_ago = time.time() - 2 * shimclient.SILENT_FOR
        os.utime(mark, (long_ago, long_ago))
        check = daemon_check(env)
        assert check["status"] == "PASS", check
        assert check["evidence"] == f"running: a hit daemon answers on {path}"
        assert check["fix"] == ""
        [note] = check["details"]
        assert note.startswith("marked silent at ")
        assert note.endswith(f"in {mark}, over 60 s ago: the shim no longer skips this daemon")
        assert check["data"]["silent"]["current"] is False
    finally:
        stuck.close()


def _directory(mark: Path) -> None:
    mark.mkdir()


def _unreadable(mark: Path) -> None:
    mark.touch()
    mark.chmod(0)


def _link_to_a_file(mark: Path) -> None:
    target = mark.with_name("elsewhere")
    target.touch()
    mark.symlink_to(target)


def _dangling_link(mark: Path) -> None:
    mark.symlink_to(mark.with_name("nowhere"))


def _looping_link(mark: Path) -> None:
    mark.symlink_to(mark)


def _dated_ahead(mark: Path) -> None:
    mark.touch()
    ahead = time.time() + 3600
    os.utime(mark, (ahead, ahead))


def _dated_past_any_calendar(mark: Path) -> None:
    mark.touch()
    far = 2.0**62  # ext4 keeps the year 2446; a filesystem that keeps more, gmtime cannot spell
    os.utime(mark, (far, far))


_LOG_FIX = (
    "read why in its log, {path}.log; if it stays silent, export NEFFCACHE_DAEMON=0: the shim "
    "never asks nor starts a hit daemon; each call is a process of its own"
)
_NOT_MADE = "the mark is {what}, not the empty file the shim makes: {rm} {mark}"
_AHEAD = "the mark is dated ahead of this host's clock (planted, or the clock went back): rm {mark}"


@pytest.mark.parametrize(
    ("plant", "status", "fix"),
    [
        pytest.param(
            _directory,
            "WARN",
            _NOT_MADE.replace("{what}", "a directory").replace("{rm}", "rm -r"),
            id="directory",
        ),
        pytest.param(_unreadable, "WARN", _LOG_FIX, id="unreadable"),
        pytest.param(
            _link_to_a_file,
            "WARN",
            _NOT_MADE.replace("{what}", "a symbolic link").replace("{rm}", "rm"),
            id="link-to-a-file",
        ),
        pytest.param(_dangling_link, "PASS", "", id="dangling-link"),
        pytest.param(_looping_link, "PASS", "", id="looping-link"),
        pytest.param(_dated_ahead, "WARN", _AHEAD, id="dated-ahead"),
        pytest.param(_dated_past_any_calendar, "WARN", _AHEAD, id="dated-past-any-calendar"),
    ],
)
def test_a_malformed_mark_is_read_as_the_shim_reads_it(
    tmp_path: Path, sockets: Path, plant: Callable[[Path], None], status: str, fix: str
) -> None:
    """The mark is a file anyone who can write the directory may have made: only its
    time of change counts, as for the shim (a link is followed; one that leads nowhere
    is no mark). One the shim would not have made is named in the fix, to remove."""
    env = doctor_env(tmp_path, URL, NEFFCACHE_DAEMON_DIR=str(sockets))
    path = daemon_check(env)["data"]["socket"]
    mark = Path(shimclient.silent_mark(path))
    plant(mark)
    check = daemon_check(env)
    assert check["status"] == status, check
    assert check["fix"] == fix.format(mark=mark, path=path)
    if status == "PASS":
        assert check["evidence"] == f"none running yet on {path}; the next shim call starts one"
        assert check["data"]["silent"] is None
        return
    assert check["evidence"].startswith(f"the shim skips the hit daemon on {path} until ")
    assert "none answers there now, and no shim starts one before then" in check["evidence"]
    assert check["data"]["silent"]["current"] is True


def test_a_mark_dated_past_any_calendar_is_spelled_in_seconds() -> None:
    """A time ``gmtime`` cannot convert (a planted mark on a filesystem that keeps it)
    is said, not raised: the doctor never fails on the mark."""
    assert daemon_checks.utc(0) == "1970-01-01T00:00:00Z"
    assert daemon_checks.utc(2.0**62) == "4611686018427387904 s since the epoch"
