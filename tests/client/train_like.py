"""A training-like run for the client's end-to-end tests (not collected by pytest).

It does what a transformers-neuronx-style caller does (neuron-cache-facts.md §1 path B,
§5): import ``libneuronxla`` (the stand-in at tests/standins/libneuronxla when
PYTHONPATH points there) and, for each HLO file named on the command line, call

    libneuronxla.neuron_xla_compile(module_bytes, ["--model-type=transformer"],
                                    platform_target="trn1", cache_dir=None)

The cache location comes from the environment only (``NEURON_COMPILE_CACHE_URL``,
``NEURON_CC_FLAGS``, ``NEFFCACHE_URL``); nothing neffcache-specific is imported here:
the client's import hook has to find this process by itself.

Output: graph ``i`` of file ``NAME.pb`` goes to ``OUT/<i>-<NAME>.neff``, and one JSON line
per graph on stdout: ``{"index", "name", "seconds", "bytes"}``, where ``seconds`` is
the wall time of the ``neuron_xla_compile`` call.

``--pause-after N --ready FILE --resume FILE``: after graph N completes, create FILE
(ready) and wait (up to ``--pause-timeout`` s, then exit 3) until the resume file
exists; tests use this to change the world (kill the server) between graphs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

FLAGS = ["--model-type=transformer"]
EXIT_PAUSE_TIMEOUT = 3


def _pause(ready: Path, resume: Path, timeout: float) -> bool:
    ready.touch()
    deadline = time.monotonic() + timeout
    while not resume.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("hlo", nargs="+", type=Path, help="serialized HloModuleProto files")
    parser.add_argument("--out", type=Path, required=True, help="directory for the NEFFs")
    parser.add_argument("--pause-after", type=int, default=None)
    parser.add_argument("--ready", type=Path, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--pause-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.pause_after is not None and (args.ready is None or args.resume is None):
        parser.error("--pause-after needs --ready and --resume")

    import libneuronxla  # the import the client's hook must notice

    args.out.mkdir(parents=True, exist_ok=True)
    for index, path in enumerate(args.hlo):
        module = path.read_bytes()
        start = time.monotonic()
        neff = libneuronxla.neuron_xla_compile(
            module, list(FLAGS), platform_target="trn1", cache_dir=None
        )
        seconds = time.monotonic() - start
        (args.out / f"{index}-{path.stem}.neff").write_bytes(neff)
        record = {"index": index, "name": path.stem, "seconds": seconds, "bytes": len(neff)}
        print(json.dumps(record), flush=True)
        if (
            args.pause_after == index + 1
            and index + 1 < len(args.hlo)
            and not _pause(args.ready, args.resume, args.pause_timeout)
        ):
            print("train_like: nobody resumed the run", file=sys.stderr)
            return EXIT_PAUSE_TIMEOUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
