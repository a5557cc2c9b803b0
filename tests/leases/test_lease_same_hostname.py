"""``_on_this_host`` decides from ``<nodename> pid <pid>`` alone. Processes in another
PID namespace with the same host name (containers with host networking, e.g. two jobs
on one trn node started with ``docker run --network host``, or hostNetwork pods) are
not visible to ``os.kill(pid, 0)``: a live holder there looks dead, the asker reports
it as ``dead_holder`` and takes its lease over at once. The real holder then loses its
lease (409 on renewal) while it compiles, and both compile."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.lease_hosts import make_config

from neffcache.client.lease import Leases
from neffcache.client.remote import Remote

KEY = "e" * 64

_HOLDER = """
import os, sys, time
open("/proc/sys/kernel/ns_last_pid", "w").write(str(int(sys.argv[2]) - 1))
pid = os.fork()
if pid:
    os.waitpid(pid, 0)
    sys.exit(0)
from neffcache.client.config import ClientConfig
from neffcache.client.lease import Leases
from neffcache.client.remote import Remote
config = ClientConfig.from_env()
leases = Leases(Remote(config), config)
print(leases.acquire_or_wait(sys.argv[1]).state, os.getpid(), flush=True)
time.sleep(8)  # compiling, renewing
leases.release_all()
os._exit(0)
"""


def _free_pid() -> int:
    return next(p for p in range(32700, 31000, -1) if not os.path.exists(f"/proc/{p}"))


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare")
def test_a_live_holder_in_another_pid_namespace_is_not_taken_over(
    server: str, tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "NEFFCACHE_URL": f"neffcache+{server}/leases",
        "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1-container"),
    }
    pid = _free_pid()
    holder = subprocess.Popen(
        [
            "unshare",
            "-p",
            "-f",
            "--kill-child",
            "--mount-proc",
            sys.executable,
            "-c",
            _HOLDER,
            KEY,
            str(pid),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().split()
        if not line:
            pytest.skip(f"cannot make a PID namespace here: {holder.stderr.read()[-300:]}")
        assert line == ["granted", str(pid)]
        config = make_config(server, tmp_path / "l1-host", NEFFCACHE_LEASE_WAIT="2")
        started = time.monotonic()
        leases = Leases(Remote(config), config)
        wait = leases.acquire_or_wait(KEY)
        took = time.monotonic() - started
        leases.release_all()
    finally:
        holder.kill()
        holder.wait(10)
        for stream in (holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()
    assert wait.state != "granted", f"took a live holder's lease over after {took:.1f} s"
