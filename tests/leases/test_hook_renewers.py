"""docs/client.md: the holder "renews it in the background (one thread per process".
The hook makes a new proxy (a new ``Core``, a new ``Leases``) on every
``create_compile_cache`` call, and the SDK makes one cache per compile (the stand-in
does, in ``neuron_xla_compile_impl``): every graph the process holds a lease for
starts its own renewal thread, which then waits forever with its own connection
(and registers its own exit handler, each of which flushes the publisher for up to
NEFFCACHE_PUBLISH_WAIT). A job that compiles hundreds of graphs keeps hundreds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.e2e import clean_environ, search_path
from support.lease_hosts import NS

TESTS = Path(__file__).resolve().parents[1]
STANDINS = TESTS / "standins"
GRAPHS = [
    TESTS / "fixtures" / "hlo" / f"{n}.pb" for n in ("block_a", "variant_op", "variant_shape")
]

_SCRIPT = """
import sys, threading
from pathlib import Path
import libneuronxla
for path in sys.argv[1:]:
    libneuronxla.neuron_xla_compile(Path(path).read_bytes(), ["--model-type=transformer"],
                                    platform_target="trn1")
print(sum(1 for t in threading.enumerate() if t.name == "neffcache-lease"))
"""


def test_one_renewal_thread_per_process(server: str, tmp_path: Path) -> None:
    env = clean_environ()
    env.update(
        PATH=search_path(STANDINS),
        PYTHONPATH=str(STANDINS),
        NEURON_COMPILE_CACHE_URL=f"neffcache+{server}/{NS}",
        NEFFCACHE_LOCAL_DIR=str(tmp_path / "l1"),
        TMPDIR=str(tmp_path),
    )
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *map(str, GRAPHS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    threads = int(done.stdout.split()[-1])
    assert threads == 1, f"{threads} renewal threads after {len(GRAPHS)} compiled graphs"
