"""Which Python runs a script, and what that Python sees (``probe_script`` run in it).

A tool's interpreter is what its ``#!`` line runs, resolved the way the kernel and
``env`` would with this environment's ``PATH``: the probe is run through the very
same words (``/usr/bin/env python3 -c ...``), so a pyenv or conda shim in between
resolves as it does for the tool. pip writes a ``/bin/sh`` trampoline instead of a
``#!`` line when the interpreter's path is too long for one; its ``exec`` line
names the interpreter.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neffcache.client.doctor import probe_script

# A probe imports neffcache and the stacks' metadata (and neuronxcc): a second or two.
PROBE_TIMEOUT = 30.0
# With --hook it imports libneuronxla too, which loads a 200 MB library on a real host.
HOOK_PROBE_TIMEOUT = 90.0
_SOURCE = Path(probe_script.__file__).read_text(encoding="utf-8")


def interpreter_of(script: str) -> tuple[str, ...] | None:
    """The command that runs ``script``'s Python (``("/usr/bin/env", "python3")``), or
    None when ``script`` is no Python script (a binary, a shell script)."""
    try:
        with open(script, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace")
    except OSError:
        return None
    if not head.startswith("#!"):
        return None
    lines = head[2:].splitlines()
    words = tuple(lines[0].split()) if lines else ()
    if words and os.path.basename(words[0]) in ("sh", "bash") and len(lines) > 1:
        # pip's trampoline: '''exec' "/very/long/path/bin/python" "$0" "$@"
        trampoline = lines[1].strip()
        if trampoline.startswith("'''exec'"):
            try:
                words = tuple(shlex.split(trampoline[len("'''exec'") :])[:1])
            except ValueError:
                return None
    if not any("python" in os.path.basename(w) for w in words):
        return None
    return words


def probe(
    command: Sequence[str],
    environ: Mapping[str, str],
    *,
    hook: bool = False,
    daemon_of: str | None = None,
) -> dict[str, Any]:
    """What the Python ``command`` runs sees (``probe_script``'s facts); with
    ``daemon_of`` (a shim's path), only the hit daemon's socket as that shim names it.
    On trouble a dict with ``error`` alone, one line."""
    argv = [*command, "-c", _SOURCE, *(["--hook"] if hook else [])]
    argv += ["--daemon", daemon_of] if daemon_of else []
    timeout = HOOK_PROBE_TIMEOUT if hook else PROBE_TIMEOUT
    try:
        done = subprocess.run(
            argv,
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{shlex.join(command)} did not answer within {timeout:.0f} s"}
    except OSError as exc:
        return {"error": f"cannot run {shlex.join(command)}: {exc.strerror or exc}"}
    for line in reversed(done.stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith(probe_script.MARK):
            try:
                facts: dict[str, Any] = json.loads(line[len(probe_script.MARK) :])
                return facts
            except ValueError:
                break
    tail = " ".join(done.stderr.decode("utf-8", "replace").split())[-300:]
    return {"error": f"{shlex.join(command)} exited {done.returncode}: {tail or 'no output'}"}


def which(name: str, path_env: str | None) -> list[str]:
    """Every executable ``name`` on ``path_env``, in order."""
    found: list[str] = []
    for directory in (path_env or "").split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK) and candidate not in found:
            found.append(candidate)
    return found
