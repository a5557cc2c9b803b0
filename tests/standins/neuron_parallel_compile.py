"""STAND-IN for torch-neuronx's ``neuron_parallel_compile``; NOT AWS's code.

Written only from docs/neuron-sdk.md#neuron_parallel_compile and
#the-libneuronxla-path-in-practice.

``collect-and-compile`` (the default when a training command follows ``--``):

1. the trial run (#trial-run): the tool sets ``NEURON_EXTRACT_GRAPHS_ONLY=1`` and
   ``NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG=<workdir>/cache_path_pid<pid>_log.txt`` in
   its OWN ``os.environ`` (#neuron_parallel_compiles-environment) and runs the command,
   which inherits them;
2. the hand-off (#neuron_parallel_compiles-environment): it reads the path the trial run
   wrote to that log and calls ``CacheUrl.get_cache_url(path)`` with it;
3. the compile (#parallel-compile) in the same process, so a ``ProcessPoolExecutor`` of
   ``--num_parallel`` workers, forked with ``NEURON_EXTRACT_GRAPHS_ONLY=1`` still set
   (#neuron_parallel_compiles-environment), each calling
   ``create_compile_cache(cache_url)``, then for each of its HLOs:
   ``try_lookup_for_compile`` → ``with entry:`` → re-check ``entry.exists`` →
   ``neuron_cc_wrapper.compile_cache_entry``.

``compile`` (the default without a command; ``collect`` runs step 1 only): step 3 on
the cache named by the optional ``CACHE_URL`` argument, else ``CacheUrl.get_cache_url()``.

The HLO list is ``get_hlos()``'s "todo" in both modes: the real tool parses the trial
run's log for ``Extracting graphs (`` lines instead (#graph-list); the stand-in's log
lines are only logged at INFO, so the stand-in scans the cache as ``compile`` does. HLOs
are dealt to the workers round-robin (the real tool slices the sorted list statically
and steals; #parallel-compile). It prints a JSON summary
``{hlo_path: {status, retry, compile_time}}`` (#report-and-commands) on stdout (the
trial run's stdout goes to stderr); the exit code is the number of failed compiles, or
the trial run's exit code when it failed.

Usage: ``python neuron_parallel_compile.py [CACHE_URL] [--workdir DIR]
[--num_parallel N] [--command {collect,compile,collect-and-compile}] [-- CMD ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from libneuronxla import libncc, neuron_cc_wrapper
from libneuronxla.neuron_cc_cache import CacheUrl, create_compile_cache

# [GUESS] The real default is ceil(total RAM / 64 GiB)
# (docs/neuron-sdk.md#parallel-compile); two workers are enough to make every graph's
# compile happen in a forked worker.
DEFAULT_NUM_PARALLEL = 2
COMMANDS = ("collect", "compile", "collect-and-compile")

Result = dict[str, object]


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    command_line: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command_line = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="neuron_parallel_compile (stand-in)")
    parser.add_argument("cache_url", nargs="?")
    parser.add_argument("--workdir", "--parallel_compile_workdir", default=None)
    parser.add_argument("--num_parallel", type=int, default=DEFAULT_NUM_PARALLEL)
    parser.add_argument("--command", choices=COMMANDS, default=None)
    options = parser.parse_args(argv)
    if options.command is None:
        options.command = "collect-and-compile" if command_line else "compile"
    if options.command != "compile" and not command_line:
        parser.error(f"--command {options.command} needs a training command after --")
    return options, command_line


def _workdir(given: str | None) -> str:
    """``/tmp/$USER/parallel_compile_workdir`` by default, wiped at start
    (docs/neuron-sdk.md#parallel-compile)."""
    workdir = given or os.path.join(
        tempfile.gettempdir(), os.environ.get("USER") or "no-user", "parallel_compile_workdir"
    )
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    return workdir


def run_train_script(command_line: list[str], workdir: str) -> tuple[int, str | None]:
    """The trial run (docs/neuron-sdk.md#trial-run): its exit code and the cache path it
    logged."""
    path_log = os.path.join(workdir, f"cache_path_pid{os.getpid()}_log.txt")
    os.environ["NEURON_EXTRACT_GRAPHS_ONLY"] = "1"
    os.environ["NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG"] = path_log
    done = subprocess.run(command_line, stdout=sys.stderr, check=False)
    if not os.path.exists(path_log):
        return done.returncode, None
    with open(path_log) as f:
        return done.returncode, f.read().strip() or None


def _compile_slice(
    cache_url: CacheUrl, hlos: list[str], workdir: str, dump: str | None
) -> dict[str, Result]:
    """One pool worker's share (docs/neuron-sdk.md#parallel-compile)."""
    cache = create_compile_cache(cache_url)
    results: dict[str, Result] = {}
    for hlo in hlos:
        entry = cache.try_lookup_for_compile(hlo)
        if entry is None:
            continue
        with entry:
            # "need to check again, since lock is released after NEFF is generated"
            if entry.exists:
                continue
            start = time.monotonic()
            status, retry = neuron_cc_wrapper.compile_cache_entry(
                os.path.join(workdir, f"model.{entry.key}.neff"), entry, dump, workdir
            )
            results[hlo] = {
                "status": status,
                "retry": retry,
                "compile_time": round(time.monotonic() - start, 3),
            }
    return results


def parallel_compile(
    cache_url: CacheUrl, workdir: str, num_parallel: int, dump: str | None = None
) -> dict[str, Result]:
    todo, _locked, _done, _failed = create_compile_cache(cache_url).get_hlos()
    if not todo:
        return {}
    workers = max(1, min(num_parallel, len(todo)))
    shares = [todo[i::workers] for i in range(workers)]
    results: dict[str, Result] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        jobs = [pool.submit(_compile_slice, cache_url, share, workdir, dump) for share in shares]
        for job in jobs:
            results.update(job.result())
    return results


def main(argv: list[str]) -> int:
    options, command_line = _parse(argv)
    ncc_args, _, _ = libncc.setup_args()  # docs/neuron-sdk.md#setup_args: a 3-tuple
    workdir = _workdir(options.workdir)
    if options.command == "compile":
        cache_url = (
            CacheUrl.from_string(options.cache_url)
            if options.cache_url
            else CacheUrl.get_cache_url()
        )
    else:
        code, logged = run_train_script(command_line, workdir)
        if code != 0:
            print(f"neuron_parallel_compile: the trial run exited {code}", file=sys.stderr)
            return code
        if options.command == "collect":
            return 0
        cache_url = CacheUrl.get_cache_url(logged)
    results = parallel_compile(cache_url, workdir, options.num_parallel, ncc_args.dump)
    print(json.dumps(results, indent=2, sort_keys=True))
    return sum(1 for result in results.values() if not result["status"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
