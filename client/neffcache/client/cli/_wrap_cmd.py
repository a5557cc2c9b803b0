"""``neffcache wrap -- neuronx-cc compile ...`` and ``neffcache shim-dir``.

``wrap`` runs one compile through the cache (see ``neffcache.client.wrapper``).
``shim-dir`` prints a directory holding a ``neuronx-cc`` that does the same; put it
first on ``PATH`` and every caller that runs ``neuronx-cc`` by name goes through the
cache, including the flows that bypass the Neuron persistent cache.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Any

from neffcache.client.compiler import SHIM_MARK
from neffcache.client.config import DEFAULT_LOCAL_DIR

from ._common import CommandError

# The shim: its first line names the interpreter, its second carries the mark
# (compiler.is_shim reads the first 512 bytes), then the hit daemon's thin client
# (shimclient.py, built-in modules only), then SHIM_REST. The client runs from its code
# compiled by `neffcache shim-dir` into CLIENT beside the script: compiling its source
# at each call would cost a sixth of a bare Python start (callgrind: 6.5M instructions,
# against 1.4M to load the compiled code). The source stays in the script, a string
# that costs nothing until it is needed: when that file is missing, or of another
# Python.
CLIENT = "neuronx-cc.client"
SHIM_HEAD = """import marshal, os, sys

_CLIENT_SOURCE = {source!r}


def _client():
    try:
        with open({compiled!r}, "rb") as f:
            tag, code = f.read().split(b"\\n", 1)
        if tag == ascii(sys.version).encode():
            return marshal.loads(code)
    except (OSError, ValueError, EOFError, TypeError):
        pass
    return compile(_CLIENT_SOURCE, "shimclient.py", "exec")


exec(_client())
"""
SHIM_REST = f"""

# -- the shim -------------------------------------------------------------------------
_served, _start = ask(["neuronx-cc", *sys.argv[1:]])
if _served is not None:  # the daemon wrote --output, and what it had to say
    os._exit(_served)
try:
    from neffcache.client.wrapper import exit_fast, main
except Exception as exc:  # neffcache cannot load here: the compile must still run
    sys.stderr.write(f"neffcache: cannot load ({{exc!r}}); compiling without the cache\\n")
    os.environ["NEFFCACHE_IN_WRAPPER"] = "1"
    mark = {SHIM_MARK.encode()!r}
    found = [os.environ.get("NEFFCACHE_REAL_COMPILER", "")]
    found += [os.path.join(d or ".", "neuronx-cc") for d in os.environ.get("PATH", "").split(":")]
    for real in found:
        try:
            with open(real, "rb") as f:
                if mark in f.read(512) or not os.access(real, os.X_OK):
                    continue
        except OSError:
            continue
        os.execv(real, [real, *sys.argv[1:]])
    sys.exit(127)
if _start is not None:  # none answered: one for the next graph (daemon.py)
    try:
        from neffcache.client.daemon import start_for

        start_for(_start, sys.path)
    except Exception:  # the daemon is an optimisation: never this compile's trouble
        pass
exit_fast(main(["neuronx-cc", *sys.argv[1:]]))
"""


def client_source() -> str:
    from neffcache.client import shimclient

    return Path(shimclient.__file__).read_text(encoding="utf-8")


def shim_text(python: str, directory: Path) -> str:
    """The ``neuronx-cc`` script for interpreter ``python``, in ``directory``."""
    head = SHIM_HEAD.format(source=client_source(), compiled=str(directory / CLIENT))
    return f"#!{python}\n# {SHIM_MARK}; made by `neffcache shim-dir`.\n{head}{SHIM_REST}"


def compiled_client() -> bytes:
    """The thin client compiled by this interpreter, tagged with its version (the
    marshal format is the interpreter's own)."""
    import marshal

    code = compile(client_source(), "shimclient.py", "exec")
    return ascii(sys.version).encode() + b"\n" + marshal.dumps(code)


def register(sub: Any) -> None:
    wrap = sub.add_parser(
        "wrap",
        help="run a neuronx-cc command through the cache",
        usage="neffcache wrap -- neuronx-cc compile --framework=XLA IN.pb --output OUT.neff "
        "--target=T [FLAG ...]",
        description="Runs the compiler command after -- through the cache: a hit writes "
        "the NEFF at --output without compiling; a miss compiles and publishes. Anything "
        "else is passed to the real compiler untouched.",
    )
    wrap.set_defaults(run=run_wrap)
    shim = sub.add_parser(
        "shim-dir",
        help="print a directory with a neuronx-cc that runs the wrapper",
        description="Prints (creating it if needed) a directory holding a neuronx-cc "
        "script that asks the host's hit daemon to serve a hit, else runs `neffcache "
        "wrap` (NEFFCACHE_DAEMON=0: always). Prepend it to PATH; the real compiler is "
        "NEFFCACHE_REAL_COMPILER, else the next neuronx-cc on PATH.",
    )
    shim.add_argument(
        "--dir",
        type=Path,
        help="where to put it (default: .neffcache/shim under NEFFCACHE_LOCAL_DIR)",
    )
    shim.set_defaults(run=run_shim_dir)


def run_wrap(args: argparse.Namespace, command: list[str]) -> int:
    from neffcache.client.wrapper import main

    return main(command)


def run_shim_dir(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise CommandError(f"unexpected arguments: {' '.join(extra)}")
    local = os.environ.get("NEFFCACHE_LOCAL_DIR") or DEFAULT_LOCAL_DIR
    directory: Path = args.dir or Path(local) / ".neffcache" / "shim"
    print(make_shim_dir(directory))
    return 0


def make_shim_dir(directory: Path) -> Path:
    directory = directory.absolute()
    script = directory / "neuronx-cc"
    try:
        text = shim_text(sys.executable, directory)
        client = compiled_client()
        # The compiled client first: a script that finds none compiles the source.
        _write_if_changed(directory / CLIENT, client, 0)
        _write_if_changed(script, text.encode(), stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as exc:
        raise CommandError(f"cannot write the shim in {directory}: {exc}") from exc
    return directory


def _write_if_changed(path: Path, data: bytes, mode: int) -> None:
    """``data`` at ``path`` through a temporary name and a rename, unless it is there
    already (a running job's shim is never rewritten under it for nothing)."""
    with contextlib.suppress(OSError):
        if path.is_file() and path.read_bytes() == data:
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.chmod(tmp.stat().st_mode | mode)
    os.replace(tmp, path)
