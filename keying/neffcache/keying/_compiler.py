"""The full build string of the installed ``neuronx-cc``
(docs/neuron-sdk.md#neuronx-cc-version-output).

The stock cache puts every compiler build in its own directory
(``neuronxcc-2.20.9961.0+0acef03a``), so the key needs the full string, git hash
included: ``pip show`` and package metadata only have the short version.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping

from ._errors import KeyingError

# Recent builds print "NeuronX Compiler version 2.25.3371.0+f524f7f8"; public callers
# read it from stdout or stderr, so both are searched.
_VERSION_LINE = re.compile(rb"NeuronX Compiler version ([0-9][0-9A-Za-z.]*\+[0-9A-Za-z]+)")
# The git hash is required: builds with the same number can differ
# (docs/neuron-sdk.md#compiler-version-directory).
VERSION_PATTERN = re.compile(r"[0-9]+(\.[0-9]+)+\+[0-9A-Za-z]+")

_TIMEOUT_SECONDS = 60.0
_cache: dict[tuple[str, int, int], str] = {}
_lock = threading.Lock()


def compiler_version(compiler: str = "neuronx-cc") -> str:
    """Return the full version (``2.20.9961.0+0acef03a``) of a compiler binary.

    ``compiler`` is a command name looked up on PATH, or a path. The answer is memoized
    per resolved path, modification time and size, so a reinstall is noticed and a
    repeated call costs one ``stat``.
    """
    path = _resolve(compiler)
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise KeyingError(f"cannot stat compiler {path}: {exc.strerror}") from exc
    memo_key = (path, stat.st_mtime_ns, stat.st_size)
    with _lock:
        cached = _cache.get(memo_key)
    if cached is not None:
        return cached
    version = ask_compiler_version(path)
    with _lock:
        _cache[memo_key] = version
    return version


def check_compiler_version(version: str) -> str:
    """Validate a version string given by hand (``--compiler-version``)."""
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise KeyingError(
            f"compiler version {version!r} is not a neuronx-cc build string "
            "such as 2.20.9961.0+0acef03a"
        )
    return version


def _resolve(compiler: str) -> str:
    import shutil

    found = shutil.which(compiler)
    if found is None:
        where = "at that path" if os.sep in compiler else "on PATH"
        raise KeyingError(
            f"compiler {compiler!r} not found {where}; install neuronx-cc "
            "or pass the version explicitly (--compiler-version)"
        )
    return os.path.realpath(found)


def ask_compiler_version(
    path: str, env: Mapping[str, str] | None = None, timeout: float | None = None
) -> str:
    """Run ``path --version`` once (no memo) and return the full build string; a
    caller that remembers answers elsewhere (the client's on-disk memo) calls this.
    ``env`` replaces the environment of the child when given."""
    import subprocess  # here: the wrapper's cache hits never ask

    if timeout is None:
        timeout = _TIMEOUT_SECONDS  # read now: tests shorten it
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
        )
    except subprocess.TimeoutExpired as exc:
        raise KeyingError(f"{path} --version did not answer within {timeout:.0f} s") from exc
    except OSError as exc:
        raise KeyingError(f"cannot run {path} --version: {exc.strerror}") from exc
    match = _VERSION_LINE.search(done.stdout) or _VERSION_LINE.search(done.stderr)
    if match is None:
        raise KeyingError(
            f"{path} --version (exit {done.returncode}) printed no "
            "'NeuronX Compiler version X' line"
        )
    return check_compiler_version(match.group(1).decode("ascii"))
