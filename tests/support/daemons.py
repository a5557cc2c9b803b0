"""The hit daemons (client/daemon.py) a test starts: found by their command line, which
names their socket, and stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


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


def stop_daemons(directory: Path) -> None:
    """SIGKILL every daemon under ``directory`` and wait until they are gone."""
    deadline = time.monotonic() + 30
    while pids := daemons(directory):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert time.monotonic() < deadline, f"daemons {pids} outlived SIGKILL"
        time.sleep(0.01)
