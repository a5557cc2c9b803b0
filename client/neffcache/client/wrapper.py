"""The ``neuronx-cc`` wrapper: ``neffcache wrap -- neuronx-cc compile ...`` and the shim.

This module parses the command and runs the real compiler (compile_call.py);
``session.py`` does the cache's part of one call.

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

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from neffcache.client._log import log, warn_typos_once
from neffcache.client.compile_call import CompileCall, run_plain
from neffcache.client.config import ClientConfig, ConfigError
from neffcache.client.stats import STATS

if TYPE_CHECKING:
    from neffcache.client.remote import Remote

FLAGS = "compile_flags.json"
# Options that may repeat with other values without changing the NEFF: log verbosity
# (NxD ModelBuilder and libneuronxla each append ``--verbose=35``,
# docs/neuron-sdk.md#nxd-modelbuilder).
_REPEATABLE = frozenset({"--verbose"})
_HELP = frozenset({"-h", "--help", "--version", "-V"})
_KEPT_REMOTES = 8  # the hit daemon's server clients, one per cache configuration


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
    real = _real_compiler(program)
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
        from neffcache.protocol.counters import ClientCounter

        STATS.count(ClientCounter.WRAPPER_ERRORS)
        if session is not None and session.outcome is not None:  # compiled, or served
            log.exception("neffcache: the wrapper failed after its outcome was final")
            return session.outcome
        log.exception("neffcache: the wrapper failed; running the compiler without the cache")
        return run_plain(real, call.compiler_argv)


def serve_hit(
    argv: Sequence[str],
    remotes: dict[ClientConfig, Remote] | None = None,
    wanted: Callable[[], bool] | None = None,
) -> int | None:
    """The hit daemon's request (daemon.py): ``main``'s hit alone, in the caller's
    environment; 0 when a hit wrote --output, None for anything ``main`` would do
    otherwise (the shim then does it, in its own process). ``remotes``: the server
    clients the daemon keeps, by configuration, so that a hit reuses a connection.
    ``wanted``: whether the caller still waits (one that gave up serves itself: its
    --output is not written, nor its line, by the daemon after that)."""
    if os.environ.get("NEFFCACHE_IN_WRAPPER") or not argv:
        return None
    try:
        config = ClientConfig.from_env()
    except ConfigError:
        return None  # the shim says why
    real = _real_compiler(argv[0])
    call = parse(argv[1:])
    if config is None or real is None or call is None:
        return None
    from neffcache.client.session import Session

    if config.telemetry:
        from neffcache.client import telemetry

        telemetry.sender(threaded=False)  # its events go from a child after the answer
    remote = None
    if remotes is not None:
        from neffcache.client.remote import Remote

        remote = remotes.get(config)
        if remote is None:
            if len(remotes) >= _KEPT_REMOTES:  # the oldest goes: one job's settings at a time
                remotes.pop(next(iter(remotes))).close()
            remote = remotes[config] = Remote(config)
    session = Session(config, real, call, remote=remote, wanted=wanted or (lambda: True))
    return 0 if session.serve_hit() else None


def _real_compiler(program: str) -> str | None:
    from neffcache.client.compiler import find_real_compiler

    configured = os.environ.get("NEFFCACHE_REAL_COMPILER") or None
    return find_real_compiler(program, configured, os.environ.get("PATH"))


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
