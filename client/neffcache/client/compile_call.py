"""A compile call: what a ``neuronx-cc compile`` command line says (``CompileCall``,
read by ``wrapper.parse``), the stock address and flags file it compiles for, and the
real compiler run for it.

Shared by the wrapper, which parses the command, and the session (session.py), which
does the cache's part of one call: a module below both, so that neither imports the
other back.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from neffcache.client.stats import STATS
from neffcache.protocol.counters import ClientCounter

if TYPE_CHECKING:
    import subprocess

    from neffcache.keying import StockEra

NEFF = "model.neff"
HLO = "model.hlo_module.pb"
_LOG_TAIL = 64 * 1024
# Options the SDK adds to each call, which its compile_flags.json lacks
# (docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs).
_SDK_ADDED = frozenset({"--output", "--framework", "--target", "--verbose"})


class CompileCall(NamedTuple):
    """What a ``neuronx-cc compile`` command line says."""

    argv: list[str]  # everything after the program name, as given
    input: Path
    output: Path
    target: str
    flags: list[str]  # argv minus the input path, for keying (normalized there)
    command: int  # where the ``compile`` word is in argv
    input_at: int  # where the input path is in argv
    logfile: Path | None  # where the compiler writes its log (--logfile), if asked
    compiler_argv: list[str]  # argv for the real compiler: without wrapper-only options


def run_plain(real: str, args: list[str]) -> int:
    try:
        proc = spawn(real, args)
    except OSError as exc:
        print(f"neffcache wrap: cannot run {real}: {exc}", file=sys.stderr)
        return 127
    with forwarding(proc):
        code: int = proc.wait()
    return code


def spawn(real: str, args: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """The real compiler as this process's child, tied to it: if the wrapper dies (a
    SIGKILL), the kernel sends the compiler SIGTERM (``PR_SET_PDEATHSIG``), so no
    compile outlives the job that asked for it, holding its output streams and writing
    its ``--output`` after the caller gave up."""
    import subprocess

    env = dict(os.environ, NEFFCACHE_IN_WRAPPER="1")
    return subprocess.Popen([real, *args], env=env, preexec_fn=_death_signal(), **options)


def _death_signal() -> Callable[[], None] | None:
    try:
        import ctypes
        import signal

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the compiler may outlive us
        return None
    parent = os.getpid()

    def in_child() -> None:  # after fork: no imports, no locks
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the wrapper died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


@contextlib.contextmanager
def forwarding(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Pass SIGTERM, SIGINT and SIGHUP on to the compiler while it runs: the wrapper
    then waits for it and ends as it did (exit_fast), as if the signal had been the
    compiler's alone. Only the main thread can set handlers; elsewhere, nothing."""
    import signal

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    kept: dict[signal.Signals, Any] = {}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            kept[signum] = signal.signal(signum, forward)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


_SDK_INPUT = re.compile(r"model\.(MODULE_[0-9A-Za-z]{1,128}\+([0-9a-f]{8}))\.hlo(?:_module)?\.pb")


class StockAddress(NamedTuple):
    """The stock address a call compiles for, and the era of the SDK that named it."""

    address: str
    era: StockEra


def neuron_address_of(call: CompileCall, version: str) -> str | None:
    """``stock_address_of``'s address, or None."""
    found = stock_address_of(call, version)
    return None if found is None else found.address


def stock_address_of(call: CompileCall, version: str) -> StockAddress | None:
    """The stock address when the input follows the SDK's work-dir naming
    (``model.MODULE_<key>+<flags8>.hlo_module.pb``,
    docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs) and the ``<flags8>`` is the
    hash of this call's own flags in one of the three eras of the layout
    (docs/neuron-sdk.md#layout-eras), so an entry compiled through the wrapper is also
    found by the persistent-cache hook; else None. Without the hash check, a hand-run
    compile with other flags on an SDK-named file would claim the address."""
    match = _SDK_INPUT.fullmatch(call.input.name)
    if match is None:
        return None
    from neffcache.keying import stock_era_of

    era = stock_era_of(match[2], user_flags(call), call.target)
    if era is None:
        STATS.count(ClientCounter.ADDRESS_FLAGS_MISMATCH)
        return None
    return StockAddress(f"neuronxcc-{version}/{match[1]}", era)


def flags_json(call: CompileCall) -> bytes:
    """``compile_flags.json`` as the SDK writes it (docs/neuron-sdk.md#entry-layout and
    #flags-hash): the user's flags, spelled as given, after ``--target``; not the options
    the SDK adds per call."""
    from neffcache.keying import StockEra

    return flags_file(call, StockEra.TARGET)[1]


def flags_file(call: CompileCall, era: StockEra) -> tuple[str, bytes]:
    """The flags file (name, content) the SDK of ``era`` writes for this call."""
    return era.flags_file, era.flags_content(era.flags_list(user_flags(call), call.target))


def user_flags(call: CompileCall) -> list[str]:
    """The call's flags as the SDK got them, spelled as given: without the command
    word, the input, and the options the SDK adds per call (``_SDK_ADDED``)."""
    user: list[str] = []
    skip = False
    for j, token in enumerate(call.argv):
        if skip:
            skip = False
            continue
        name, eq, _ = token.partition("=")
        if j in (call.command, call.input_at):
            continue
        if name in _SDK_ADDED:
            skip = not eq
            continue
        user.append(token)
    return user


def run_teeing(real: str, args: list[str]) -> tuple[int, str]:
    """Run the compiler with our stdin and stdout; copy its stderr to ours as it comes
    and keep the last 64 KiB of it."""
    import subprocess
    import threading

    try:
        proc = spawn(real, args, stderr=subprocess.PIPE)
    except OSError as exc:
        print(f"neffcache wrap: cannot run {real}: {exc}", file=sys.stderr)
        return 127, str(exc)
    assert proc.stderr is not None
    tail = bytearray()
    out: BinaryIO = sys.stderr.buffer

    def pump() -> None:
        assert proc.stderr is not None
        while chunk := os.read(proc.stderr.fileno(), 65536):
            try:
                out.write(chunk)
                out.flush()
            except OSError:
                pass
            tail.extend(chunk)
            del tail[:-_LOG_TAIL]

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    with forwarding(proc):
        code = proc.wait()
    # A helper the compiler left running may hold the pipe open for as long as it
    # lives: its output is not the compiler's, and it must not hold the job.
    thread.join(timeout=1.0)
    if not thread.is_alive():
        proc.stderr.close()
    return code, tail.decode("utf-8", "replace")
