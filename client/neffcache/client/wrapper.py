"""The ``neuronx-cc`` wrapper: ``neffcache wrap -- neuronx-cc compile ...`` and the shim.

This module parses the command and runs the real compiler; ``session.py`` does the
cache's part of one call.

It parses the compile command (input HLO, ``--output``, ``--target``, flags), computes
the keys and, on a hit, writes the NEFF exactly where ``--output`` says and exits 0.
On a miss it runs the real compiler with the same argv, environment, stdin and stdout
and returns its exit code, then publishes. Anything it does not understand
(``--version``, other subcommands, odd argv) goes to the real compiler untouched.

Lookup order, cheapest first: the direct key (raw bytes, no parsing) in L1 then on
the server, then the canonical key (metadata-insensitive) in L1 then on the server.
Ranks on one host asking for the same graph take a per-key lock: one fetches or
compiles, the others find the result in L1.

Never a reason to fail: any trouble in the cache's part (server down, bad bytes, a
read-only L1) ends in compiling as if neffcache were not there. One difference is
deliberate: the compiler's stderr goes through a pipe, copied to ours as it comes, so
that a failure's last 64 KiB can be recorded on the server.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, NoReturn

from neffcache.client._log import log, warn_typos_once
from neffcache.client.config import ClientConfig, ConfigError
from neffcache.client.stats import STATS

if TYPE_CHECKING:
    import subprocess

    from neffcache.keying import StockEra

NEFF = "model.neff"
HLO = "model.hlo_module.pb"
FLAGS = "compile_flags.json"
_LOG_TAIL = 64 * 1024
# Options the SDK adds to each call, which its compile_flags.json lacks
# (docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs).
_SDK_ADDED = frozenset({"--output", "--framework", "--target", "--verbose"})
# Options that may repeat with other values without changing the NEFF: log verbosity
# (NxD ModelBuilder and libneuronxla each append ``--verbose=35``,
# docs/neuron-sdk.md#nxd-modelbuilder).
_REPEATABLE = frozenset({"--verbose"})
_HELP = frozenset({"-h", "--help", "--version", "-V"})


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


def parse(
    argv: Sequence[str], exists: Callable[[str], bool] = os.path.exists
) -> CompileCall | None:
    """The compile call, or None when argv is anything else (pass it through).

    Options are read as the compiler documents them (keying's ``option_arity``):
    ``--target trn2`` and ``--target=trn2``, ``--lnc 2``, ``-O2``, ``--pipeline
    compile SaveTemps``. The one bare word after ``compile`` that no option takes is
    the input, whatever its name (its content decides what it is: inputs.py). A word
    after an option neffcache does not know is that option's value unless it names
    something that exists: then it may be the input or a file the compiler reads, and
    neither can be keyed safely. None too for a repeated option with another value
    (which one the compiler keeps is not documented), ``--verbose`` excepted."""
    args = list(argv)
    scan = _scan(args, exists)
    if scan is None:
        return None
    values, command, inputs, logfile = scan
    if command is None or len(inputs) != 1 or not args[inputs[0]]:
        return None
    # --framework too: every caller passes it, and a compiler that requires it would
    # refuse a command a hit served.
    if values.get("--framework") != "XLA" or not {"--output", "--target"} <= set(values):
        return None
    return CompileCall(
        argv=args,
        input=Path(args[inputs[0]]),
        output=Path(values["--output"]),
        target=values["--target"],
        flags=[t for j, t in enumerate(args) if j != inputs[0]],
        command=command,
        input_at=inputs[0],
        logfile=None if logfile is None else Path(logfile),
        compiler_argv=without_wrapper_options(args),
    )


def _scan(
    args: list[str], exists: Callable[[str], bool]
) -> tuple[dict[str, str], int | None, list[int], str | None] | None:
    """(the last value of each option, where ``compile`` is, where the bare words
    are, the --logfile), or None for a command the wrapper must not touch."""
    from neffcache.keying import WRAPPER_ONLY_FLAGS, abbreviates, option_arity, option_name

    values: dict[str, str] = {}
    seen: dict[str, str | None] = {}
    command: int | None = None
    inputs: list[int] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if _is_word(token) or token == "-":
            if command is None and token != "compile":
                return None  # another subcommand
            if command is None:
                command = i - 1
            else:
                inputs.append(i - 1)
            continue
        if token in _HELP or token in ("--", "--enable-internal-neff-wrapper"):
            return None  # help; positionals only; outputs beside --output
        name, value = option_name(token)
        arity = option_arity(name)
        if arity == "unknown" and abbreviates(name):
            return None  # --out is --output to a parser that takes prefixes
        if value is None and arity == "value":
            if i >= len(args) or not _is_word(args[i]):
                return None  # a value that reads as an option: the compiler's call
            value, i = args[i], i + 1
        elif value is None and arity == "words":
            start = i
            while i < len(args) and not args[i].startswith("-"):
                i += 1
            if any(not word or word.split() != [word] for word in args[start:i]):
                return None  # a word with spaces would key as two words
            value = " ".join(args[start:i])
        elif arity == "words" and value is not None and value.split() != [value]:
            return None
        elif value is None and arity == "unknown" and i < len(args) and _is_word(args[i]):
            value, i = args[i], i + 1
        unknown = arity == "unknown" and name not in WRAPPER_ONLY_FLAGS
        if unknown and value is not None and exists(value):
            return None  # the input after a switch, or a file the compiler reads
        if name in seen and seen[name] != value and name not in _REPEATABLE:
            return None
        seen[name] = value
        if value is not None:
            values[name] = value
    return values, command, inputs, values.get("--logfile")


def _is_word(token: str) -> bool:
    """Whether ``token`` can be an option's value rather than an option."""
    return not token.startswith("-") or _is_number(token)


def _is_number(token: str) -> bool:
    return token[1:].replace(".", "", 1).isdigit() if token.startswith("-") else False


def without_wrapper_options(args: Sequence[str]) -> list[str]:
    """``args`` without libneuronxla's own options (``--cache_dir=...``, ``--no_cache``
    and the rest of keying's WRAPPER_ONLY_FLAGS) and their values. libneuronxla took
    them out of NEURON_CC_FLAGS before it ran the compiler, which never accepted them;
    TorchNeuron passes the variable's tokens through as they are, so an image
    configured for the libneuronxla hook would hand them to the compiler."""
    from neffcache.keying import WRAPPER_ONLY_FLAGS, option_arity, option_name

    kept: list[str] = []
    skip = False
    for token in args:
        if skip:
            skip = False
            if not token.startswith("-"):
                continue
        name, value = option_name(token)
        if name in WRAPPER_ONLY_FLAGS:
            skip = value is None and option_arity(name) == "value"
            continue
        kept.append(token)
    return kept


def main(argv: Sequence[str]) -> int:
    """``argv``: the compiler command, program name first (``neuronx-cc compile ...``)."""
    if not argv:
        print("neffcache wrap: give the compiler command after --", file=sys.stderr)
        return 2
    program, args = argv[0], list(argv[1:])
    # Quiet when the process that ran this one (the hook's, or any Python process of
    # the job: neffcache_hook.pth) already said it: a graph is no reason to say it again.
    warn_typos_once(os.environ)
    try:
        config = ClientConfig.from_env()
    except ConfigError as exc:
        log.warning("neffcache: %s; compiling without the cache", exc)
        config = None
    from neffcache.client.compiler import find_real_compiler

    real = find_real_compiler(
        program, os.environ.get("NEFFCACHE_REAL_COMPILER") or None, os.environ.get("PATH")
    )
    if real is None:
        print(
            f"neffcache wrap: no real {program} found (set NEFFCACHE_REAL_COMPILER, or put "
            "the compiler on PATH after the shim directory)",
            file=sys.stderr,
        )
        return 127
    try:
        call = parse(args)
        plain = without_wrapper_options(args) if "compile" in args else args
    except Exception as exc:  # keying cannot load (a broken blake3): compile, uncached
        log.warning("neffcache: cannot read the command (%r); compiling without the cache", exc)
        return run_plain(real, args)
    if config is None or call is None or os.environ.get("NEFFCACHE_IN_WRAPPER"):
        # A compile the cache does not serve still must not fail on libneuronxla's own
        # options, which the compiler never took (without_wrapper_options).
        return run_plain(real, plain)
    session = None
    try:
        # Imported here: a broken dependency (a blake3 on PYTHONPATH that does not
        # load) is the cache's trouble, and the compile still runs.
        from neffcache.client.session import Session

        if config.telemetry:
            from neffcache.client import telemetry

            # One process per graph: no thread. The events go as the process ends: from
            # a child (exit_fast), or at interpreter exit for a caller that runs this
            # inline.
            telemetry.sender(threaded=False)
        session = Session(config, real, call)
        return session.run()
    except Exception:  # the cache's own bug: never the job's problem
        STATS.count("wrapper_errors")
        if session is not None and session.outcome is not None:  # compiled, or served
            log.exception("neffcache: the wrapper failed after its outcome was final")
            return session.outcome
        log.exception("neffcache: the wrapper failed; running the compiler without the cache")
        return run_plain(real, call.compiler_argv)


def exit_fast(code: int) -> NoReturn:
    """End the process now, skipping the interpreter's teardown (about 5 ms, a fifth of
    a wrapper hit): flush what is buffered, then ``os._exit``. Only for the wrapper's
    own process (the shim, ``neffcache wrap``), never for a caller's.

    Its telemetry events go from a forked child (``telemetry.finish``): the SDK waits
    for this process's exit, and a hit must not wait for the server's answer."""
    telemetry = sys.modules.get("neffcache.client.telemetry")
    if telemetry is not None:
        try:
            telemetry.finish(detach=True)
        except Exception:  # telemetry's trouble is never the compile's
            log.exception("neffcache: could not send telemetry")
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    import contextlib

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to do
            stream.flush()
    if code < 0:  # the compiler died of a signal: so do we, as if it had been us
        import signal

        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be changed
            signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), -code)
        code = 128 - code  # a signal we survive (or may not send): the shell's convention
    os._exit(code)


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
        STATS.count("address_flags_mismatch")
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
