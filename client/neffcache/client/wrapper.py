"""The ``neuronx-cc`` wrapper: ``neffcache wrap -- neuronx-cc compile ...`` and the shim.

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
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, NoReturn

from neffcache.client._log import log
from neffcache.client.config import ClientConfig, ConfigError
from neffcache.client.stats import STATS

NEFF = "model.neff"
HLO = "model.hlo_module.pb"
FLAGS = "compile_flags.json"
_LOG_TAIL = 64 * 1024
# Options the wrapper reads, with their values.
_VALUE_OPTIONS = frozenset({"--output", "--framework", "--target", "--logfile", "--verbose"})
# Options the SDK adds to each call (facts §5), which its compile_flags.json lacks.
_SDK_ADDED = frozenset({"--output", "--framework", "--target", "--verbose"})


class CompileCall(NamedTuple):
    """What a ``neuronx-cc compile`` command line says."""

    argv: list[str]  # everything after the program name
    input: Path
    output: Path
    target: str
    flags: list[str]  # argv minus the input path, for keying (normalized there)
    command: int  # where the ``compile`` word is in argv
    input_at: int  # where the input path is in argv


def parse(argv: Sequence[str]) -> CompileCall | None:
    """The compile call, or None when argv is anything else (pass it through).

    The first bare word must be ``compile``; the one bare word ending in ``.pb`` after
    it is the input; other bare words are values of the options before them
    (``--model-type transformer``, ``--pipeline compile SaveTemps``)."""
    args = list(argv)
    values: dict[str, str] = {}
    command: int | None = None
    inputs: list[int] = []
    takes_words = False  # the previous token was an option (or its value) without "="
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-") and len(token) > 1:
            if token in ("-h", "--help", "--version", "-V"):
                return None
            name, eq, value = token.partition("=")
            takes_words = not eq
            if name in _VALUE_OPTIONS:
                if not eq:
                    if i + 1 >= len(args):
                        return None
                    i += 1
                    value = args[i]
                    takes_words = False
                if name in values:
                    return None  # repeated: let the compiler decide what it means
                values[name] = value
        elif command is None:
            if token != "compile":
                return None  # another subcommand
            command = i
        elif token.endswith(".pb"):
            inputs.append(i)
            takes_words = False
        elif not takes_words:
            return None  # a second positional: the compiler's business
        i += 1
    framework = values.get("--framework", "XLA")
    if command is None or len(inputs) != 1 or framework != "XLA":
        return None
    if "--output" not in values or "--target" not in values:
        return None
    return CompileCall(
        argv=args,
        input=Path(args[inputs[0]]),
        output=Path(values["--output"]),
        target=values["--target"],
        flags=[t for j, t in enumerate(args) if j != inputs[0]],
        command=command,
        input_at=inputs[0],
    )


def main(argv: Sequence[str]) -> int:
    """``argv``: the compiler command, program name first (``neuronx-cc compile ...``)."""
    if not argv:
        print("neffcache wrap: give the compiler command after --", file=sys.stderr)
        return 2
    program, args = argv[0], list(argv[1:])
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
    call = parse(args)
    if config is None or call is None or os.environ.get("NEFFCACHE_IN_WRAPPER"):
        return _run_plain(real, args)
    try:
        return Session(config, real, call).run()
    except Exception:  # the cache's own bug: never the job's problem
        STATS.count("wrapper_errors")
        log.exception("neffcache: the wrapper failed; running the compiler without the cache")
        return _run_plain(real, args)


def exit_fast(code: int) -> NoReturn:
    """End the process now, skipping the interpreter's teardown (about 5 ms, a fifth of
    a wrapper hit): flush what is buffered, then ``os._exit``. Only for the wrapper's
    own process (the shim, ``neffcache wrap``), never for a caller's."""
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    import contextlib

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to do
            stream.flush()
    os._exit(code)


def _run_plain(real: str, args: list[str]) -> int:
    import subprocess

    env = dict(os.environ, NEFFCACHE_IN_WRAPPER="1")
    try:
        return subprocess.run([real, *args], env=env, check=False).returncode
    except OSError as exc:
        print(f"neffcache wrap: cannot run {real}: {exc}", file=sys.stderr)
        return 127


class Session:
    """One compile call's lookup, compile and publish."""

    def __init__(self, config: ClientConfig, real: str, call: CompileCall) -> None:
        from neffcache.client.local import LocalStore
        from neffcache.client.remote import Remote

        self.config = config
        self.real = real
        self.call = call
        self.local = LocalStore(config.local_dir)
        self.remote = Remote(config)
        self.started = time.monotonic()
        self.report: dict[str, Any] = {
            "via": "wrapper",
            "key": None,
            "direct_key": None,
            "neuron_address": None,
            "fallback": None,
        }

    def run(self) -> int:
        from neffcache.client.compiler import compiler_version
        from neffcache.client.keys import context, direct_key

        version = compiler_version(self.real, self.local.root)
        if version is None:
            return self._uncached("no compiler version")
        self.report["neuron_address"] = neuron_address_of(self.call.input, version)
        try:
            module = self.call.input.read_bytes()
            ctx = context(version, self.call.target, self.call.flags, os.environ)
        except (OSError, ValueError) as exc:
            return self._uncached(f"cannot key: {exc}")
        direct = direct_key(module, ctx)
        self.report["direct_key"] = direct.key
        if self._hit(direct.key, alias=True):
            return 0
        from neffcache.client.keys import canonical_key

        try:
            canonical = canonical_key(module, ctx)
        except ValueError as exc:  # KeyingError: not an HloModuleProto we can read
            return self._uncached(f"cannot fingerprint: {exc}")
        self.report["key"] = canonical.key
        with self.local.lock(canonical.key, f"graph {canonical.key[:12]}") as _held:
            # Another rank may have fetched or compiled it while we waited.
            if self._hit(canonical.key, alias=False, also=direct.key):
                return 0
            return self._compile(module, canonical, direct)

    # -- hits -------------------------------------------------------------------------

    def _hit(self, key: str, *, alias: bool, also: str | None = None) -> bool:
        """Serve ``key`` from L1, else from the server; True when --output is written.
        The run manifest's source is where the NEFF's bytes came from: a manifest
        found on the server for a NEFF already in L1 is an L1 hit."""
        t0 = time.monotonic()
        manifest = self.local.manifest(key)
        source = None if manifest is None else self._materialize(manifest)
        if source is None:
            manifest = self.remote.alias(key) if alias else self.remote.entry(key)
            source = None if manifest is None else self._materialize(manifest)
            if manifest is None or source is None:
                return False
            self.local.put_manifest(key, manifest)
        assert manifest is not None
        if also is not None:
            self.local.put_manifest(also, manifest)
        self._record("hit", source, time.monotonic() - t0, None, manifest)
        STATS.count(f"hits_{source}")
        return True

    def _materialize(self, manifest: dict[str, Any]) -> str | None:
        """Put the manifest's NEFF at --output, fetching it into L1 if needed; where
        its bytes came from (``l1`` or ``server``), or None."""
        from neffcache.client.local import copy_atomic

        ref = manifest.get("files", {}).get(NEFF)
        if not isinstance(ref, dict):
            return None
        digest, size = ref.get("digest"), ref.get("size")
        if not isinstance(digest, str) or not isinstance(size, int):
            return None
        source = "l1"
        if not self.local.has_blob(digest, size):
            if not self.remote.fetch(digest, size, self.local.blob_path(digest)):
                return None
            source = "server"
        try:
            copy_atomic(self.local.blob_path(digest), self.call.output)
        except OSError as exc:
            STATS.count("local_errors")
            log.warning("neffcache: cannot write %s: %s", self.call.output, exc)
            return None
        self.report["bytes"] = size
        return source

    # -- misses -----------------------------------------------------------------------

    def _compile(self, module: bytes, canonical: Any, direct: Any) -> int:
        t0 = time.monotonic()
        code, log_tail = _run_teeing(self.real, self.call.argv)
        seconds = time.monotonic() - t0
        self.report["exit_code"] = code
        if code != 0 or not self.call.output.is_file():
            STATS.count("compile_failures")
            self._record("miss", "compiler", 0.0, seconds, None)
            self._report_failure(canonical, direct, code, seconds, log_tail)
            return code
        STATS.count("compiles")
        self._record("miss", "compiler", 0.0, seconds, None, size=self.call.output.stat().st_size)
        self._store_and_publish(module, canonical, direct, seconds)
        return code

    def _store_and_publish(
        self, module: bytes, canonical: Any, direct: Any, seconds: float
    ) -> None:
        import tempfile

        from neffcache.client.local import atomic_write
        from neffcache.client.publish import make_manifest, publish

        try:
            with tempfile.TemporaryDirectory(dir=self.local.root) as tmp:
                staged = Path(tmp)
                atomic_write(staged / HLO, module)
                atomic_write(staged / FLAGS, _flags_json(self.call))
                files = {NEFF: self.call.output, HLO: staged / HLO, FLAGS: staged / FLAGS}
                manifest, paths = make_manifest(
                    canonical, direct, self.report["neuron_address"], files, seconds
                )
                ref = manifest["files"][NEFF]
                self.local.add_blob(self.call.output, ref["digest"])
                self.local.put_manifest(canonical.key, manifest)
                self.local.put_manifest(direct.key, manifest)
                publish(self.remote, manifest, paths)
        except OSError as exc:
            STATS.count("local_errors")
            log.warning("neffcache: cannot keep or publish the new NEFF: %s", exc)

    def _report_failure(
        self, canonical: Any, direct: Any, code: int, seconds: float, log_tail: str
    ) -> None:
        record: dict[str, Any] = {
            "compiler_version": canonical.components["compiler_version"],
            "direct_key": direct.key,
            "components": canonical.as_json(),
            "exit_code": code,
            "compile_seconds": round(seconds, 3),
            "log": log_tail,
        }
        if self.report["neuron_address"]:
            record["neuron_address"] = self.report["neuron_address"]
        self.remote.put_failure(canonical.key, record)

    def _uncached(self, reason: str) -> int:
        STATS.count("uncached")
        self.report["fallback"] = reason
        log.info("neffcache: %s; compiling without the cache", reason)
        t0 = time.monotonic()
        code = _run_plain(self.real, self.call.argv)
        self.report["exit_code"] = code
        size = self.call.output.stat().st_size if code == 0 and self.call.output.is_file() else 0
        self._record("miss", "compiler", 0.0, time.monotonic() - t0, None, size=size)
        return code

    def _record(
        self,
        result: str,
        source: str,
        fetch: float,
        compile_seconds: float | None,
        manifest: dict[str, Any] | None,
        size: int | None = None,
    ) -> None:
        from neffcache.client.runlog import record

        if manifest is not None:
            self.report["key"] = manifest.get("key", self.report["key"])
            self.report["neuron_address"] = self.report["neuron_address"] or manifest.get(
                "neuron_address"
            )
        fields = {
            **self.report,
            "result": result,
            "source": source,
            "fetch_seconds": round(fetch, 6),
            "compile_seconds": None if compile_seconds is None else round(compile_seconds, 3),
            "bytes": size if size is not None else self.report.get("bytes", 0),
            "exit_code": self.report.get("exit_code", 0),
        }
        record(self.config.run_manifest, **fields)


_SDK_INPUT = re.compile(r"model\.(MODULE_[0-9A-Za-z]{1,128}\+[0-9a-f]{8})\.hlo(?:_module)?\.pb")


def neuron_address_of(input_file: Path, version: str) -> str | None:
    """The stock address when the input follows the SDK's work-dir naming
    (``model.MODULE_<key>+<flags8>.hlo_module.pb``, facts §5), so an entry compiled
    through the wrapper is also found by the persistent-cache hook; else None."""
    match = _SDK_INPUT.fullmatch(input_file.name)
    return f"neuronxcc-{version}/{match[1]}" if match else None


def _flags_json(call: CompileCall) -> bytes:
    """``compile_flags.json`` as the SDK writes it (facts §3.1, §4.3): the user's flags,
    spelled as given, after ``--target``; not the options the SDK adds per call."""
    import json

    from neffcache.keying import neuron_cache_flags

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
    return json.dumps(neuron_cache_flags(user, call.target)).encode()


def _run_teeing(real: str, args: list[str]) -> tuple[int, str]:
    """Run the compiler with our stdin and stdout; copy its stderr to ours as it comes
    and keep the last 64 KiB of it."""
    import subprocess
    import threading

    env = dict(os.environ, NEFFCACHE_IN_WRAPPER="1")
    try:
        proc = subprocess.Popen([real, *args], env=env, stderr=subprocess.PIPE)
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
    code = proc.wait()
    thread.join()
    proc.stderr.close()
    return code, tail.decode("utf-8", "replace")
