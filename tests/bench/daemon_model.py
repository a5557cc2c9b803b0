"""A prototype of the per-host daemon model, for measuring it only: never shipped.

In sccache's model one long-lived process per host owns the cache, and the compiler
shim is a thin client of it. Here the daemon imports the wrapper once and runs each
request in its own process, one at a time: it takes the caller's argv, working
directory and environment, runs ``neffcache.client.wrapper.main`` and sends back its
exit code. (A forked child per request, which would keep one graph's state from the
next, measured slower than the shim itself: a fork's copy-on-write faults as Python
touches the reference counts of everything the daemon imported cost about 20 ms per
hit on the 2-core development machine.) The thin client is what the shim would
become: a Python start, one Unix socket round trip, no neffcache import. What the
prototype leaves out (the caller's stdout and stderr, which a real daemon would pass
as descriptors; concurrent requests; signals; the daemon's own start, upgrade and
death) would only add to its cost, so its figure is a lower bound of a daemon's hit.

    python daemon_model.py serve SOCKET     # the daemon, until killed
"""

from __future__ import annotations

import marshal
import os
import socket
import sys

# The thin client, run as ``python -c CLIENT SOCKET ARG...``: the whole of a shim
# that delegates. marshal, not json, and ``_socket``, not ``socket``: both are built
# in, where ``socket`` and ``json`` each import enum (and json re), which costs about
# as much as the rest of a Python start.
CLIENT = """\
import _socket, marshal, os, sys
s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(marshal.dumps((["neuronx-cc", *sys.argv[2:]], os.getcwd(), dict(os.environ))))
s.shutdown(1)  # SHUT_WR
answer = s.recv(16)
os._exit(int(answer) if answer else 1)
"""


def _receive(conn: socket.socket) -> bytes:
    parts = []
    while chunk := conn.recv(1 << 16):
        parts.append(chunk)
    return b"".join(parts)


def _answer(conn: socket.socket, main: object) -> None:
    """Run the wrapper for one request in this process; send its exit code."""
    argv, cwd, env = marshal.loads(_receive(conn))
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the caller's output is not passed in this prototype
    os.dup2(devnull, 2)
    try:
        code = main(argv)  # type: ignore[operator]
    except BaseException:
        code = 1
    finally:
        for fd, kept in zip((1, 2), saved, strict=True):
            os.dup2(kept, fd)
            os.close(kept)
        os.close(devnull)
    conn.sendall(str(code).encode())
    conn.close()


def serve(path: str) -> None:
    from neffcache.client.wrapper import main  # once: what the daemon saves each hit

    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(64)
    while True:
        conn, _ = server.accept()
        with conn:
            _answer(conn, main)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        sys.exit("usage: daemon_model.py serve SOCKET")
    serve(sys.argv[2])
