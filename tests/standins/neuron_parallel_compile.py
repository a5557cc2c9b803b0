"""STAND-IN for torch-neuronx's ``neuron_parallel_compile`` compile step; NOT AWS's code.

Written only from neuron-cache-facts.md section 8.3 (and 6.2): scan the cache with
``get_hlos()``, then for each "todo" HLO: ``try_lookup_for_compile`` → ``with entry:`` →
re-check ``entry.exists`` → ``neuron_cc_wrapper.compile_cache_entry``. It runs the
compiles one after another (the real tool uses a process pool) and prints a JSON summary
``{hlo_path: {status, retry, compile_time}}`` (section 8.4). The exit code is the number
of failed compiles.

Usage: ``python neuron_parallel_compile.py [CACHE_URL] [--workdir DIR]``. Without a URL
the cache is ``CacheUrl.get_cache_url()`` (section 2 precedence).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from libneuronxla import neuron_cc_wrapper
from libneuronxla.neuron_cc_cache import CacheUrl, create_compile_cache


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="neuron_parallel_compile (stand-in)")
    parser.add_argument("cache_url", nargs="?")
    parser.add_argument("--workdir", default=None)
    options = parser.parse_args(argv)
    cache_url = (
        CacheUrl.from_string(options.cache_url) if options.cache_url else CacheUrl.get_cache_url()
    )
    workdir = options.workdir or os.path.join(
        tempfile.gettempdir(), os.environ.get("USER") or "no-user", "parallel_compile_workdir"
    )
    cache = create_compile_cache(cache_url)
    todo, _locked, _done, _failed = cache.get_hlos()
    results: dict[str, dict[str, object]] = {}
    for hlo in todo:
        entry = cache.try_lookup_for_compile(hlo)
        if entry is None:
            continue
        with entry:
            if (
                entry.exists
            ):  # "need to check again, since lock is released after NEFF is generated"
                continue
            start = time.monotonic()
            status, retry = neuron_cc_wrapper.compile_cache_entry(
                os.path.join(workdir, f"model.{entry.key}.neff"), entry, work_dir=workdir
            )
            results[hlo] = {
                "status": status,
                "retry": retry,
                "compile_time": round(time.monotonic() - start, 3),
            }
    print(json.dumps(results, indent=2, sort_keys=True))
    return sum(1 for result in results.values() if not result["status"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
