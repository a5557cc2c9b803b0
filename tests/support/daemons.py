"""The hit daemons (client/daemon.py) a test starts: found by their command line, which
names their socket, and stopped; and what the suites that drive the shim with its
daemon share (an environment with a socket directory of the test's own, waits)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from support.e2e import Sandbox, Server

WAIT = 60.0  # seconds a daemon may take to start or leave on a loaded machine


def daemons(directory: Path) -> list[int]:
    """The pids of the daemon processes (parent and workers) whose socket is under
    ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"neffcache.client.daemon" in a for a in argv) and any(
            a.startswith(str(directory).encode()) for a in argv
        ):
            found.append(int(entry.name))
    return found


def children_states(directory: Path) -> list[str]:
    """The states (``ps``'s letters: ``Z`` for one that ended and was not collected) of
    the children of the daemon's processes under ``directory`` that are not its workers:
    those that send a hit's events."""
    own = set(daemons(directory))
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) in own and int(entry.name) not in own:
                found.append(fields[0])
    return found


@contextlib.contextmanager
def socket_directory() -> Iterator[Path]:
    """A directory for a daemon's socket (``NEFFCACHE_DAEMON_DIR``): mode 0700, under
    /tmp rather than pytest's tmp_path (a socket's name is at most about 100 bytes);
    every daemon under it is stopped at the end."""
    directory = Path(tempfile.mkdtemp(prefix="nd-", dir="/tmp"))
    try:
        yield directory
    finally:
        stop_daemons(directory)
        shutil.rmtree(directory, ignore_errors=True)


def stop_daemons(directory: Path) -> None:
    """SIGKILL every daemon under ``directory`` and wait until they are gone."""
    deadline = time.monotonic() + 30
    while pids := daemons(directory):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert time.monotonic() < deadline, f"daemons {pids} outlived SIGKILL"
        time.sleep(0.01)


def socket_in(directory: Path) -> Path | None:
    found = sorted(directory.glob("hits-*.sock"))
    return found[0] if found else None


def until(what: str, check: Callable[[], bool], wait: float = WAIT) -> None:
    """Poll ``check`` until true; fail after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def daemon_env(
    sandbox: Sandbox, server: Server, sockets: Path, l1: Path, **extra: str | None
) -> dict[str, str]:
    """The shim first on PATH with its daemon on, its socket under ``sockets``, and a
    run manifest in the sandbox (``run.jsonl``)."""
    return sandbox.env(
        l1=l1,
        url=server.cache_url(sandbox.namespace),
        shim=True,
        extra={
            "NEFFCACHE_DAEMON": None,
            "NEFFCACHE_DAEMON_DIR": str(sockets),
            "NEFFCACHE_RUN_MANIFEST": str(sandbox.root / "run.jsonl"),
            **extra,
        },
    )


def is_daemon(pid: int, sockets: Path) -> bool:
    return pid in daemons(sockets)


def out(sandbox: Sandbox) -> Path:
    return sandbox.new_dir("out") / "model.neff"
