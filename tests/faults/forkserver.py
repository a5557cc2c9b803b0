"""A pre-forking launcher of ``neffcache serve``, for tests that kill and restart a
server hundreds of times (test_sigkill_uploads.py).

A cold ``neffcache serve`` spends a second or more importing FastAPI, pydantic and the
server, and scanning the installed packages for the command's plugins, before it runs
any start-up code: 200 restarts would cost minutes of that. This launcher imports those
modules and builds the ``neffcache`` command's parser once. For every ``start`` it
parses the ``serve`` arguments with that parser (parsing is pure: no file, socket or
store is touched) and forks a child that calls the parsed command's ``run``, which is
``neffcache.server.cli.run_serve``: everything ``neffcache serve`` does after parsing,
in the same order, from scratch. That is settings from the environment and the
arguments (``load_settings``), ``create_app`` opening the stores (the filesystem blob
store's removal of dead processes' staging areas, the SQLite index's schema check, the
durable index's start-up check), binding the port (``serving.bind``), and the
lifespan's background work.

Nothing of a server exists before the fork: the launcher never calls ``create_app``,
opens a store or starts a thread (it checks it has one thread before each fork), so a
child is a fresh server process whose only difference from an ``exec`` of the command
is that its modules were already imported. The child is a real, separate process: the
test SIGKILLs it by pid, and the kernel releases its files, locks and sockets as for
any killed server.

Usage: ``python forkserver.py LOG -- serve --port P --data-dir D``. One command a line
on stdin, one answer a line on stdout:

- ``start [ARGS...]``: fork a server with the launch arguments, then ``ARGS`` (a later
  option wins, as on a command line: ``start --port 8123``); answers ``pid PID``. Its
  stdin is /dev/null, its stdout and stderr are appended to ``LOG``.
- ``reap PID``: wait until that child has exited; answers ``exited PID STATUS``, the
  status as ``os.waitpid`` gives it (``os.WTERMSIG`` tells a SIGKILL).
- ``alive PID``: ``alive PID 1`` while it runs; ``alive PID 0`` once it has exited on
  its own (it is reaped then).

- ``trap WHEN NTH ARMED PREFIX``: the next ``start`` only forks a server that SIGKILLs
  itself ``before`` or ``after`` (``WHEN``) the ``NTH`` time it puts a file under its
  final name in ``PREFIX`` (an ``os.link`` or ``os.replace`` whose destination starts
  with that path: a blob's commit, a document's write) while the file ``ARMED`` exists;
  answers ``trap set``. Just before the kill it logs ``trap: SIGKILL ...``. A link
  that places nothing is not counted: a blob uploaded again is linked again, and the
  link fails on the stored one (before: its name exists; after: the call raised).

The launcher answers ``ready`` once its imports are done. When its stdin closes it
kills and reaps any child still running, then exits.

A trap is the one thing a child does that ``neffcache serve`` does not: it wraps
``os.link`` and ``os.replace`` with a counter, so that a kill lands at one exact step of
a write (between the fsync of a staged file and its link, between the link and the
directory's fsync, between an index row and its document) however loaded the machine.
The test creates ``ARMED`` once the server answers, so start-up never counts.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3  # noqa: F401
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# What a server start imports (the point of the launcher), imported once here. None of
# these starts a thread or opens anything on import.
import anyio._backends._asyncio  # noqa: F401
import uvicorn
import uvicorn.config
import uvicorn.lifespan.on
import uvicorn.loops.auto
import uvicorn.protocols.http.auto
import uvicorn.protocols.websockets.auto
import uvicorn.server  # noqa: F401

import neffcache.server.app
import neffcache.server.blobs.fs
import neffcache.server.cli
import neffcache.server.index.sqlite  # noqa: F401
from neffcache.client.cli import build_parser


@dataclass(frozen=True)
class Trap:
    """Where a child kills itself: see the module's docstring (``trap``)."""

    when: str  # "before" or "after" the call
    nth: int
    armed: str  # a file: only calls made while it exists count
    prefix: str

    @classmethod
    def parse(cls, words: list[str]) -> Trap:
        when, nth, armed, prefix = words
        if when not in ("before", "after") or int(nth) < 1:
            raise ValueError(f"not a trap: {' '.join(words)}")
        return cls(when, int(nth), armed, prefix)

    def install(self) -> None:
        """Wrap ``os.link`` and ``os.replace`` (in the child: the launcher keeps its own)."""
        lock = threading.Lock()
        count = 0

        def wrap(name: str, real: Callable[..., None]) -> Callable[..., None]:
            def counts() -> bool:
                nonlocal count
                with lock:
                    count += 1
                    return count == self.nth

            def placing(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                aimed = os.fsdecode(dst).startswith(self.prefix) and os.path.exists(self.armed)
                # A link onto an existing name raises and places nothing: not counted.
                placed = not (name == "link" and os.path.lexists(dst))
                if aimed and self.when == "before" and placed and counts():
                    self._die(name, dst)
                real(src, dst, *args, **kwargs)  # a failed call raises: never counted after
                if aimed and self.when == "after" and counts():
                    self._die(name, dst)

            return placing

        os.link = wrap("link", os.link)
        os.replace = wrap("replace", os.replace)

    def _die(self, name: str, dst: Any) -> None:
        line = f"trap: SIGKILL {self.when} os.{name} #{self.nth} to {os.fsdecode(dst)}\n"
        os.write(2, line.encode())
        os.kill(os.getpid(), signal.SIGKILL)


def _serve(args: argparse.Namespace, log: str, trap: Trap | None) -> None:
    """The child: run the parsed command, then exit. Never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        if trap is not None:
            trap.install()
        code = args.run(args, [])
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _start(args: argparse.Namespace, log: str, trap: Trap | None) -> int:
    if threading.active_count() != 1:
        raise RuntimeError("the launcher has threads: a forked child would not start fresh")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _serve(args, log, trap)
    return pid


def _answer(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(log: str, argv: list[str]) -> None:
    parser = build_parser()  # imports the command's plugins too, once
    children: set[int] = set()
    trap: Trap | None = None  # for the next start only
    _answer("ready")
    try:
        for line in sys.stdin:
            command, *rest = line.split()
            if command == "start":
                pid = _start(parser.parse_args([*argv, *rest]), log, trap)
                trap = None
                children.add(pid)
                _answer(f"pid {pid}")
            elif command == "trap":
                # The prefix is the rest of the line: a path may hold spaces.
                trap = Trap.parse(line.rstrip("\n").split(" ", 4)[1:])
                _answer("trap set")
            elif command == "reap":
                pid = int(rest[0])
                _, status = os.waitpid(pid, 0)
                children.discard(pid)
                _answer(f"exited {pid} {status}")
            elif command == "alive":
                pid = int(rest[0])
                done = pid not in children or os.waitpid(pid, os.WNOHANG)[0] == pid
                if done:
                    children.discard(pid)
                _answer(f"alive {pid} {0 if done else 1}")
            else:
                _answer(f"error: unknown command {command!r}")
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: forkserver.py LOG -- serve ARGS...")
    run(sys.argv[1], sys.argv[3:])
