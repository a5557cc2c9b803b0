"""The real ``neuronx-cc`` behind the shim, and its version without running it each time.

``neuronx-cc --version`` starts a Python program (about a second for the real one);
asked once per graph it would cost more than a cache hit. The answer is remembered on
disk per (path, inode, size, mtime) of the script and of the interpreter its ``#!``
line names, and per the variables that decide which Python packages that interpreter
loads (``RESOLUTION_ENV``): the same ``neuronx-cc`` script can run another compiler
under another ``PYTHONPATH`` or virtual environment, and a version remembered from the
other one would key its NEFFs as the wrong compiler's.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

SHIM_MARK = "neffcache-shim: runs the neffcache compiler wrapper"
_VERSION_TIMEOUT = 120.0
# What decides which compiler a script runs, beside the script itself: where a
# ``#!/usr/bin/env python3`` finds its interpreter, and where that finds its packages.
RESOLUTION_ENV = (
    "PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONNOUSERSITE",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
)


def is_shim(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return SHIM_MARK.encode() in f.read(512)
    except OSError:
        return False


def find_real_compiler(name: str, configured: str | None, path_env: str | None) -> str | None:
    """``configured`` (NEFFCACHE_REAL_COMPILER) if set and not a neffcache shim, else
    ``name`` as given when it is a path, else the first ``name`` on PATH that is not a
    neffcache shim."""
    if configured and not is_shim(configured):
        return configured
    # A configured shim (say, `which neuronx-cc` taken after the shim went first on
    # PATH) would run itself without end: look further along PATH instead.
    if os.sep in name:
        return None if is_shim(name) else name
    for directory in (path_env or "").split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK) and not is_shim(candidate):
            return candidate
    return None


def compiler_version(compiler: str, memo_dir: Path) -> str | None:
    """The full build string (``2.20.9961.0+0acef03a``) of ``compiler``, or None if it
    cannot tell (then nothing is cached for it)."""
    try:
        real = os.path.realpath(compiler)
        st = os.stat(real)
    except OSError:
        return None
    stamp: list[object] = [st.st_ino, st.st_size, st.st_mtime_ns, *_interpreter(real)]
    stamp.append([os.environ.get(name) for name in RESOLUTION_ENV])
    memo = memo_dir / "compiler-versions.json"
    try:
        known = json.loads(memo.read_bytes())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    entry = known.get(real)
    if isinstance(entry, dict) and entry.get("stamp") == stamp:
        version = entry.get("version")
        return version if isinstance(version, str) else None
    version = _ask(compiler)
    if version is not None:
        from neffcache.client.local import atomic_write  # blake3: not before it is needed

        known[real] = {"stamp": stamp, "version": version}
        with contextlib.suppress(OSError):  # asked again next time: slower, never wrong
            atomic_write(memo, json.dumps(known, sort_keys=True).encode())
    return version


def _interpreter(script: str) -> list[object]:
    """The stamp of the interpreter a ``#!`` line names (a binary has none): a Python
    upgraded in place under the same script runs other packages."""
    try:
        with open(script, "rb") as f:
            head = f.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    words = head[2:].split(b"\n", 1)[0].split()
    if not words:
        return []
    try:
        path = os.path.realpath(os.fsdecode(words[0]))
        st = os.stat(path)
    except OSError:
        return [os.fsdecode(words[0])]
    return [path, st.st_ino, st.st_size, st.st_mtime_ns]


def _ask(compiler: str) -> str | None:
    from neffcache.keying import KeyingError, ask_compiler_version

    # The guard: should the binary be a wrapper of ours after all, it runs the
    # compiler behind it instead of looking itself up again.
    env = dict(os.environ, NEFFCACHE_IN_WRAPPER="1")
    try:
        return ask_compiler_version(compiler, env=env, timeout=_VERSION_TIMEOUT)
    except KeyingError:
        return None
