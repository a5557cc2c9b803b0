"""One rank of the fleet (started by fleet_sim.py, not by hand): the training-like
caller (tests/client/train_like.py) through the stand-in ``libneuronxla``, with the
cache the environment names, as any rank of a job would run it.

    FLEET_MODE=neffcache|local|shared|s3|none FLEET_HOST=H FLEET_READY=DIR \
        python fleet_rank.py RESULTS OUT HLO...

Start-up is kept out of the measurement, as in tests/herd.py: the rank imports
``libneuronxla`` (which arms neffcache's hook when the URL is a ``neffcache+`` one),
says it is ready (a file in ``FLEET_READY``) and blocks in ``sigwait`` until the
driver signals every rank at once (SIGUSR1). Then it replays the sequence and writes
``RESULTS``: when it was signalled, when each graph was done (the time train_like's
line for it was printed), its exit code, and its cache I/O counters.

What is changed in the process, and why:

* ``neffcache``: every simulated host runs on this one machine, so the client's
  ``lease._this_host`` (node name, boot id, pid namespace) is replaced by the host's
  name, as tests/herd.py does: otherwise a host would see another host's lease holder
  as a live process of its own and not wait for it over the network.
* ``s3``: the stock S3 stand-in (fleet_s3.py) is installed.
* ``local``, ``shared``, ``s3``: the stock cache's file operations are counted (calls
  and bytes), which changes nothing they do.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[2]

Counts = dict[str, int]


class _Lines(io.TextIOBase):
    """stdout that keeps each complete line with the time it was written."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        now = time.time()
        self._partial += text
        *done, self._partial = self._partial.split("\n")
        self.lines.extend((now, line) for line in done)
        return len(text)


def _as_other_host(host: str) -> None:
    from neffcache.client import lease

    lease._this_host = lambda: host


def _size_of_file(index: int) -> Callable[[tuple[Any, ...]], int]:
    return lambda args: os.path.getsize(args[index])


def _size_of_data(args: tuple[Any, ...]) -> int:
    data = args[1]
    return len(data.encode("utf-8") if isinstance(data, str) else data)


def _instrument(cls: type, counts: Counts) -> None:
    """Count ``cls``'s cache operations: calls per method, bytes read and written."""
    sizes: dict[str, tuple[str, Callable[[tuple[Any, ...]], int]] | None] = {
        "exists": None,
        "download_file": ("read_bytes", _size_of_file(1)),
        "upload_file": ("written_bytes", _size_of_file(1)),
        "upload_string_to_file": ("written_bytes", _size_of_data),
    }
    for name, sized in sizes.items():
        original = getattr(cls, name)

        def method(
            self: Any,
            *args: Any,
            _original: Any = original,
            _name: str = name,
            _sized: Any = sized,
            **kwargs: Any,
        ) -> Any:
            result = _original(self, *args, **kwargs)
            counts[_name] = counts.get(_name, 0) + 1
            if _sized is not None:
                counts[_sized[0]] = counts.get(_sized[0], 0) + _sized[1](args)
            return result

        setattr(cls, name, method)


def _prepare(mode: str, host: str) -> Counts:
    counts: Counts = {}
    if mode == "neffcache":
        _as_other_host(host)
    import libneuronxla  # noqa: F401  (neffcache's hook patches it here)

    if mode == "s3":
        import fleet_s3

        fleet_s3.install()
        _instrument(fleet_s3.FleetCompileCacheS3, counts)
    elif mode in ("local", "shared"):
        from libneuronxla.neuron_cc_cache import CompileCacheFs

        _instrument(CompileCacheFs, counts)
    return counts


def main(argv: list[str]) -> int:
    results, out, *hlos = argv
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    mode, host = os.environ["FLEET_MODE"], os.environ["FLEET_HOST"]
    counts = _prepare(mode, host)
    sys.path.insert(0, str(TESTS / "client"))
    import train_like

    ready = Path(os.environ["FLEET_READY"])
    (ready / f"{os.getpid()}").write_text(host)
    signal.sigwait({signal.SIGUSR1})
    go = time.time()
    lines = _Lines()
    sys.stdout = lines
    try:
        code: int = train_like.main(["--out", out, *hlos])
    finally:
        sys.stdout = sys.__stdout__
    if mode == "s3":
        import fleet_s3

        counts.update(fleet_s3.RETRIES)
    graphs = [{"t": t, **json.loads(line)} for t, line in lines.lines if line.startswith("{")]
    record = {"host": host, "pid": os.getpid(), "go": go, "code": code}
    record.update(graphs=graphs, io=counts)
    Path(results).write_text(json.dumps(record))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
