"""One compile call through the wrapper: lookup, compile, keep, publish.

Order, cheapest first: the direct key (raw bytes, no parsing) in L1 then on the server;
then the canonical key (metadata-insensitive) in L1 then on the server, under a per-key
lock so ranks on one host do one compile. The lock is released before publishing: the
others need the NEFF in L1, not the upload.

Once the compiler has run, or a hit has written ``--output``, the outcome is final:
nothing after it (a full L1, a publish that fails) can turn it into a second compile.
A rank that waited on the lock while the holder's compile failed replays that failure
(its exit code and log tail) instead of repeating it; a later run compiles again.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neffcache.client._log import log
from neffcache.client.config import ClientConfig
from neffcache.client.manifests import Manifest
from neffcache.client.stats import STATS
from neffcache.client.wrapper import (
    FLAGS,
    HLO,
    NEFF,
    CompileCall,
    flags_json,
    neuron_address_of,
    run_plain,
    run_teeing,
)

if TYPE_CHECKING:
    from neffcache.client.lease import Leases
    from neffcache.client.reasons import Explanation
    from neffcache.keying import CacheKey


class Session:
    def __init__(self, config: ClientConfig, real: str, call: CompileCall) -> None:
        from neffcache.client.local import LocalStore
        from neffcache.client.remote import Remote

        self.config = config
        self.real = real
        self.call = call
        self.local = LocalStore(config.local_dir)
        self.remote = Remote(config)
        self.outcome: int | None = None  # set once the compiler ran or --output is written
        self._leases: Leases | None = None  # set while this call holds a compile lease
        self._explanation: Explanation | None = None  # asked for as a miss starts compiling
        self._components: dict[str, Any] | None = None  # the missed key's, for its event
        self.report: dict[str, Any] = {
            "via": "wrapper",
            "key": None,
            "direct_key": None,
            "neuron_address": None,
            "fallback": None,
        }

    def run(self) -> int:
        from neffcache.client.compiler import compiler_version
        from neffcache.client.inputs import Unkeyable, read_input
        from neffcache.client.keys import context

        version = compiler_version(self.real, self.local.root)
        if version is None:
            return self._uncached("no compiler version")
        self.report["compiler_version"] = version
        self.report["neuron_address"] = neuron_address_of(self.call, version)
        try:
            graph = read_input(self.call.input)
            ctx = context(version, self.call.target, self.call.flags, os.environ)
            direct = graph.direct(ctx)
        except (OSError, ValueError, Unkeyable) as exc:
            return self._uncached(f"cannot key: {exc}")
        self.report["direct_key"] = direct.key
        if self._hit(direct.key, alias=True):
            return self._done(0)
        try:
            canonical = graph.canonical(ctx)
        except (ValueError, Unkeyable) as exc:  # not a graph keying can read
            return self._uncached(f"cannot key: {exc}")
        alias: CacheKey | None = direct
        if canonical is None:  # no canonical form: the raw-bytes key is the entry's key
            canonical, alias = direct, None
        self.report["key"] = canonical.key
        return self._resolve(graph.module, canonical, alias)

    def _resolve(self, module: bytes | None, canonical: CacheKey, direct: CacheKey | None) -> int:
        """Serve, wait for or compile the graph whose entry key is ``canonical`` (and
        whose direct key, when it has another, is ``direct``)."""
        also = None if direct is None else direct.key
        waited_from = time.time()
        code = 1
        compiled = False  # the compiler ran here, holding the lease
        published = False
        try:
            with self.local.lock(canonical.key, f"graph {canonical.key[:12]}") as _held:
                # Another rank may have fetched or compiled it while we waited.
                if self._hit(canonical.key, alias=False, also=also):
                    return self._done(0)
                replayed = self._replay_failure(canonical.key, waited_from)
                if replayed is not None:
                    return self._done(replayed)
                # Other hosts: wait for one's compile, or hold the lease for ours.
                served = self._fleet(canonical.key, also, waited_from)
                if served is not None:
                    return self._done(served)
                self._explain(module, canonical, direct)
                code, seconds = self._compile(canonical, direct)
                compiled = True
                kept = code == 0 and self._keep(module, canonical, direct, seconds)
            if kept:
                published = self._publish()
        finally:
            if self._leases is not None:
                # After the publish, so waiters woken by the release find the entry.
                # A failure notice tells them to stop waiting: the graph failed to
                # compile (they replay it), or it compiled and nothing could be
                # published (they compile at once rather than one after another).
                # A failure of this host (a signal, a compiler that cannot start) is
                # no notice: one of them takes over, as from a dead holder.
                failed = (code == 0 and not published) or replayable(code)
                self._leases.release(canonical.key, failed=compiled and failed)
        return code

    def _done(self, code: int) -> int:
        self.outcome = code
        return code

    # -- hits -------------------------------------------------------------------------

    def _hit(
        self, key: str, *, alias: bool, also: str | None = None, found: Manifest | None = None
    ) -> bool:
        """Serve ``key`` from L1, else from the server (or ``found``, an entry the
        server already sent); True when --output is written. The run manifest's
        source is where the NEFF's bytes came from: a manifest found on the server
        for a NEFF already in L1 is an L1 hit."""
        t0 = time.monotonic()
        manifest = self.local.manifest(key)
        source = None if manifest is None else self._materialize(manifest)
        if source is None:
            if found is not None:
                manifest = found
            else:
                manifest = self.remote.alias(key) if alias else self.remote.entry(key)
            source = None if manifest is None else self._materialize(manifest)
            if manifest is None or source is None:
                return False
            self.local.put_manifest(key, manifest)
        assert manifest is not None
        if also is not None:
            self.local.put_manifest(also, manifest)
        self._note_log("neffcache: the NEFF came from the cache; the compiler did not run\n")
        self._record("hit", source, time.monotonic() - t0, None, manifest)
        STATS.count(f"hits_{source}")
        return True

    def _materialize(self, manifest: dict[str, Any]) -> str | None:
        """Put the manifest's NEFF at --output, fetching it into L1 if needed (one
        fetch per blob per host: ranks wait for it); where its bytes came from
        (``l1`` or ``server``), or None."""
        from neffcache.client.local import copy_atomic

        ref = manifest.get("files", {}).get(NEFF)
        if not isinstance(ref, dict):
            return None
        digest, size = ref.get("digest"), ref.get("size")
        if not isinstance(digest, str) or not isinstance(size, int):
            return None
        source = self.remote.fetch_into(self.local, digest, size)
        if source is None:
            return None
        try:
            copy_atomic(self.local.blob_path(digest), self.call.output)
        except OSError as exc:
            STATS.count("local_errors")
            log.warning("neffcache: cannot write %s: %s", self.call.output, exc)
            return None
        self.outcome = 0
        self.report["bytes"] = size
        return source

    # -- other hosts ------------------------------------------------------------------

    def _fleet(self, key: str, direct: str | None, began: float) -> int | None:
        """Wait for the host that compiles this graph (then serve its entry, or replay
        its failure), or take the lease and compile here; the exit code when served,
        None to compile."""
        from neffcache.client.lease import Leases

        leases = Leases(self.remote, self.config)
        wait = leases.acquire_or_wait(key, began=began)
        if wait.state == "granted":
            self._leases = leases
            return None
        if wait.state == "done" and self._hit(key, alias=False, also=direct, found=wait.entry):
            return 0
        if wait.state == "failed" and wait.failure is not None:
            return self._replay_remote_failure(wait.failure, wait.reason)
        if wait.reason:
            log.info("neffcache: %s; compiling", wait.reason)
        return None

    def _replay_remote_failure(self, record: dict[str, Any], reason: str) -> int | None:
        """The failure another host's compile of this graph just reported (its record,
        as the server attached it to the lease's answer), replayed: its exit code, its
        log on stderr; None when the record does not say how it failed."""
        code = record.get("exit_code")
        if not isinstance(code, int) or not replayable(code):
            return None
        text = record.get("log")
        if isinstance(text, str):
            sys.stderr.write(text)
            self._note_log(text)
        STATS.count("failures_replayed")
        self.report["fallback"] = reason
        self.report["exit_code"] = code
        from neffcache.client.reasons import FAILED_BEFORE  # misses only: not on a hit's path

        self._record("miss", "compiler", 0.0, None, None, reason=FAILED_BEFORE)
        return code

    # -- misses -----------------------------------------------------------------------

    def _compile(self, canonical: CacheKey, direct: CacheKey | None) -> tuple[int, float]:
        t0 = time.monotonic()
        code, log_tail = run_teeing(self.real, self.call.compiler_argv)
        self.outcome = code
        seconds = time.monotonic() - t0
        self.report["exit_code"] = code
        if code != 0 or not self.call.output.is_file():
            STATS.count("compile_failures")
            self._record("miss", "compiler", 0.0, seconds, None, outcome="failed")
            self._remember_failure(canonical.key, code, log_tail)
            from neffcache.client.publish import failure_record

            address = self.report["neuron_address"]
            record = failure_record(canonical, direct, address, code, seconds, log_tail)
            self.remote.put_failure(canonical.key, record)
            return code, seconds
        STATS.count("compiles")
        size = self.call.output.stat().st_size
        self._record("miss", "compiler", 0.0, seconds, None, size=size, outcome="ok")
        return code, seconds

    def _keep(
        self, module: bytes | None, canonical: CacheKey, direct: CacheKey | None, seconds: float
    ) -> bool:
        """The new NEFF into L1 (best effort: a full disk costs a later hit, nothing
        more); True when there is something to publish. The HloModuleProto goes with
        it when the input has one (for explanations and export); StableHLO and trace
        folders' weights do not."""
        import tempfile

        from neffcache.client.local import atomic_write
        from neffcache.client.publish import make_manifest

        try:
            self._staged = tempfile.TemporaryDirectory(dir=self.local.root)
            staged = Path(self._staged.name)
            atomic_write(staged / FLAGS, flags_json(self.call))
            files = {NEFF: self.call.output, FLAGS: staged / FLAGS}
            if module is not None:
                atomic_write(staged / HLO, module)
                files[HLO] = staged / HLO
            address = self.report["neuron_address"]
            self._manifest, self._paths = make_manifest(
                canonical, direct, address, files, seconds, self.config.model
            )
            digest = self._manifest["files"][NEFF]["digest"]
            # One copy, into L1; the upload reads that copy, which only we write, not
            # --output, which is the caller's once we return.
            self._paths[digest] = self.local.add_blob(self.call.output, digest)
            self.local.put_manifest(canonical.key, self._manifest)
            if direct is not None:
                self.local.put_manifest(direct.key, self._manifest)
        except OSError as exc:
            STATS.count("local_errors")
            log.warning("neffcache: cannot keep the new NEFF: %s", exc)
            return False
        return True

    def _publish(self) -> bool:
        from neffcache.client.publish import publish

        try:
            return publish(self.remote, self._manifest, self._paths)
        finally:
            self._staged.cleanup()

    # -- failures seen by ranks that waited ---------------------------------------------

    def _failure_path(self, key: str) -> Path:
        return self.local.root / "failures" / f"{key}.json"

    def _remember_failure(self, key: str, code: int, log_tail: str) -> None:
        from neffcache.client.local import atomic_write

        record = {"exit_code": code, "log": log_tail[-8192:], "time": time.time()}
        with contextlib.suppress(OSError):  # waiters then compile: slower, never wrong
            atomic_write(self._failure_path(key), json.dumps(record).encode())

    def _replay_failure(self, key: str, waited_from: float) -> int | None:
        """The holder's failure, if it failed while this rank waited; else None."""
        try:
            record = json.loads(self._failure_path(key).read_bytes())
            code, when, text = record["exit_code"], record["time"], record["log"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(code, int) or not isinstance(when, (int, float)) or when < waited_from:
            return None
        if isinstance(text, str):
            sys.stderr.write(text)
            self._note_log(text)
        STATS.count("failures_replayed")
        self.report["fallback"] = "the rank that held the lock failed to compile this graph"
        self.report["exit_code"] = code
        from neffcache.client.reasons import FAILED_BEFORE

        self._record("miss", "compiler", 0.0, None, None, reason=FAILED_BEFORE)
        return code

    # -- the rest ---------------------------------------------------------------------

    def _uncached(self, reason: str) -> int:
        STATS.count("uncached")
        self.report["fallback"] = reason
        log.info("neffcache: %s; compiling without the cache", reason)
        t0 = time.monotonic()
        code = run_plain(self.real, self.call.compiler_argv)
        self.outcome = code
        self.report["exit_code"] = code
        size = self.call.output.stat().st_size if code == 0 and self.call.output.is_file() else 0
        outcome = "ok" if size else "failed"
        seconds = time.monotonic() - t0
        from neffcache.client.reasons import UNKEYABLE

        self._record(
            "miss", "compiler", 0.0, seconds, None, size=size, outcome=outcome, reason=UNKEYABLE
        )
        return code

    def _record(
        self,
        result: str,
        source: str,
        fetch: float,
        compile_seconds: float | None,
        manifest: dict[str, Any] | None,
        size: int | None = None,
        *,
        outcome: str | None = None,
        reason: str | None = None,
    ) -> None:
        """The graph's run-manifest line and event (runlog.graph). A miss's ``reason``
        is given, or the explanation's, waited for now (boundedly)."""
        from neffcache.client.runlog import graph, saved_seconds

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
        components = None
        if result == "hit":
            fields["saved_seconds"] = saved_seconds(manifest)
        else:
            fields["outcome"] = outcome
            fields["reason"], fields["reason_summary"] = self._reason(reason)
            components = self._components
        if fields["neuron_address"]:
            self.local.note_wrapped(fields["neuron_address"])  # for the hook, if it called
        graph(self.config, components, **fields)

    def _explain(self, module: bytes | None, canonical: CacheKey, direct: CacheKey | None) -> None:
        """Ask the server why this graph missed, in the background (reasons.py)."""
        from neffcache.client.reasons import Explanation, Prepared, summarize

        self._components = canonical.as_json()

        def prepare() -> Prepared:
            summary = None if module is None else summarize(module)
            components = canonical.as_json()
            if summary is not None:
                components["graph"] = summary
            self._components = components
            return Prepared(canonical.key, None if direct is None else direct.key, components)

        self._explanation = Explanation(self.remote, prepare)

    def _note_log(self, text: str) -> None:
        """The caller's ``--logfile`` when the compiler did not run to write it: the
        log of a failure replayed, or one line saying the NEFF came from the cache."""
        if self.call.logfile is None:
            return
        from neffcache.client.local import atomic_write

        try:
            atomic_write(self.call.logfile, text.encode("utf-8", "replace"))
        except OSError as exc:  # the NEFF is what the caller needs; the log is not
            log.warning("neffcache: cannot write %s: %s", self.call.logfile, exc)

    def _reason(self, given: str | None) -> tuple[str, str | None]:
        from neffcache.client.reasons import UNKNOWN

        if given is not None:
            return given, None
        if self._explanation is None:
            return UNKNOWN, None
        return self._explanation.result()


def replayable(code: int) -> bool:
    """Whether a compiler's exit code is the graph's failure, which another host would
    meet too, rather than this host's: killed by a signal (negative: the OOM killer,
    say), or not runnable (126, 127)."""
    return code > 0 and code not in (126, 127)
