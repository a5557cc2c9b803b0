"""One compile call through the wrapper: the argv adapter of ``resolver.py``.

Order, cheapest first: the direct key (raw bytes, no parsing) in L1 then on the server;
then the canonical key (metadata-insensitive) in L1 then on the server, under a per-key
lock so ranks on one host do one compile. The lock is released before publishing: the
others need the NEFF in L1, not the upload.

Once the compiler has run, or a hit has written ``--output``, the outcome is final:
nothing after it (a full L1, a publish that fails) can turn it into a second compile.
A rank that waited on the lock while the holder's compile failed replays that failure
(its exit code and log tail) instead of repeating it; a later run compiles again. So
does one that waited for another host's lease (``resolver.WRAPPER``'s policy).

What is the wrapper's own: L1 by key (manifests and blobs), ``--output`` and
``--logfile``, running the compiler, and the run-manifest line's fields. The decision
between server, fleet and compiler, and the lease's release, are the resolver's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neffcache.client._log import log
from neffcache.client.compile_call import (
    HLO,
    NEFF,
    CompileCall,
    flags_file,
    run_plain,
    run_teeing,
    stock_address_of,
)
from neffcache.client.config import ClientConfig
from neffcache.client.keys import SDK_VERSION_VARIABLE
from neffcache.client.l1limit import grew
from neffcache.client.manifests import Manifest
from neffcache.client.stats import STATS
from neffcache.protocol.counters import ClientCounter

if TYPE_CHECKING:
    from neffcache.client.inputs import GraphInput
    from neffcache.client.lease import Leases
    from neffcache.client.reasons import Explanation
    from neffcache.client.remote import Remote
    from neffcache.client.resolver import Replay, Resolver
    from neffcache.keying import CacheKey, CompileContext

# The largest HloModuleProto a miss's explanation reads again for its summary. The
# read runs beside the compiler, which needs the host's memory; a larger module's miss
# is explained without its graph's summary (the key's components still go).
SUMMARY_MAX = 64 << 20


class Session:
    def __init__(
        self,
        config: ClientConfig,
        real: str,
        call: CompileCall,
        *,
        remote: Remote | None = None,
        wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        """``remote`` and ``wanted`` are the hit daemon's: a server client kept across
        calls with its connection, and whether the caller still waits (a shim that
        gave up serves itself, so nothing is written for it after that)."""
        from neffcache.client.local import SDK_CACHE_VARIABLE, LocalStore

        if remote is not None:
            self.__dict__["remote"] = remote  # what the cached property below would hold
        self.wanted = wanted
        self.config = config
        self.real = real
        self.call = call
        self.local = LocalStore.of(config)
        # The SDK's cache: L1, or the hook's staging directory over a read-only L1.
        self.sdk_cache = LocalStore(os.environ.get(SDK_CACHE_VARIABLE) or config.local_dir)
        if self.sdk_cache.root == self.local.root:
            self.sdk_cache = self.local
        self.outcome: int | None = None  # set once the compiler ran or --output is written
        from neffcache.keying import StockEra

        # The stock layout's era its flags file follows: the SDK's, when the input is
        # an SDK entry's (libneuronxla decides it), else the current one.
        self._era = StockEra.TARGET
        self._holds = False  # while this call holds the graph's compile lease
        self._explanation: Explanation | None = None  # asked for as a miss starts compiling
        self._components: dict[str, Any] | None = None  # the missed key's, for its event
        # Whether a miss's explanation reads the input again for its graph's summary:
        # only an HloModuleProto has one, and a huge one is not read beside the compiler.
        self._summarized = False
        self.report: dict[str, Any] = {
            "via": "wrapper",
            "key": None,
            "direct_key": None,
            "neuron_address": None,
            "fallback": None,
        }

    @functools.cached_property
    def remote(self) -> Remote:
        """Made on first use: an L1 hit never loads the HTTP client."""
        from neffcache.client.remote import Remote

        return Remote(self.config)

    @functools.cached_property
    def resolver(self) -> Resolver:
        """Made on first use (a lookup on the server, a lock's wait): an L1 hit never
        loads it."""
        from neffcache.client.resolver import WRAPPER, Resolver

        def leases() -> Leases:
            # Here: only a wait for another host needs the lease client.
            from neffcache.client.lease import Leases

            return Leases(self.remote, self.config)

        return Resolver(self.config, WRAPPER, lambda: self.remote, leases)

    @property
    def _leases(self) -> Leases | None:
        """The leases, while this call holds the graph's."""
        return self.resolver.leases if self._holds else None

    def run(self) -> int:
        keyed = self._direct()
        if isinstance(keyed, str):
            return self._uncached(keyed)
        graph, ctx, direct = keyed
        del keyed  # the module is held by ``graph`` alone: dropped before it compiles
        if self._hit(direct.key, alias=True):
            return self._done(0)
        canonical = self._canonical(graph, ctx)
        self._summarized = graph.module is not None and len(graph.module) <= SUMMARY_MAX
        del graph  # a large module is not held while it compiles: read again after
        if isinstance(canonical, str):
            return self._uncached(canonical)
        alias: CacheKey | None = direct
        if canonical is None:  # no canonical form: the raw-bytes key is the entry's key
            canonical, alias = direct, None
        self.report["key"] = canonical.key
        return self._resolve(canonical, alias, ctx, direct)

    def serve_hit(self) -> bool:
        """``run``'s lookups alone, for the hit daemon: True when a hit wrote --output
        (and its line); False for anything else, having compiled, leased, waited and
        recorded nothing. Without the per-key compile lock: a hit only reads L1, or
        fetches into it under the key's lookup lock and the blob's own lock."""
        keyed = self._direct()
        if isinstance(keyed, str):
            return False
        graph, ctx, direct = keyed
        del keyed
        if self._hit(direct.key, alias=True):
            return True
        canonical = self._canonical(graph, ctx)
        del graph
        if isinstance(canonical, str) or canonical is None:
            return False  # None: the direct key was the entry's, and it missed
        self.report["key"] = canonical.key
        return self._hit(canonical.key, alias=False, also=direct.key)

    def _direct(self) -> tuple[GraphInput, CompileContext, CacheKey] | str:
        """The input, its context and its direct key; else why it cannot be keyed."""
        from neffcache.client.compiler import compiler_version
        from neffcache.client.inputs import Unkeyable, read_input
        from neffcache.client.keys import context

        missing = self._missing_directory()
        if missing is not None:  # the compiler fails on it: nothing to serve or record
            return f"{missing} is not a directory"
        version = compiler_version(self.real, self.local.root)
        if version is None:
            return "no compiler version"
        self.report["compiler_version"] = version
        sdk = os.environ.get(SDK_VERSION_VARIABLE) or version
        if sdk != version:
            self._warn_versions(sdk, version)
        try:
            graph = read_input(self.call.input)
            ctx = context(version, self.call.target, self.call.flags, os.environ)
            direct = graph.direct(ctx)
        except (OSError, ValueError, Unkeyable) as exc:
            return f"cannot key: {exc}"
        self.report["neuron_address"] = self._address(sdk, graph)
        self.report["direct_key"] = direct.key
        return graph, ctx, direct

    @staticmethod
    def _canonical(graph: GraphInput, ctx: CompileContext) -> CacheKey | str | None:
        """The metadata-insensitive key (None: the input has no canonical form), or why
        keying cannot read it."""
        from neffcache.client.inputs import Unkeyable

        unkeyable = None
        try:
            return graph.canonical(ctx)
        except (ValueError, Unkeyable) as exc:  # not a graph keying can read
            unkeyable = f"cannot key: {exc}"
        return unkeyable  # outside the handler: its traceback holds the bytes

    def _missing_directory(self) -> Path | None:
        """The directory of --output or --logfile when it does not exist: the compiler
        would fail, so a hit must not succeed (and a failure must not be recorded)."""
        for path in (self.call.output, self.call.logfile):
            if path is not None and not path.absolute().parent.is_dir():
                return path.absolute().parent
        return None

    def _address(self, sdk_version: str, graph: GraphInput) -> str | None:
        """The stock address the input's SDK-style name claims, when libneuronxla's
        entry at that address in L1 holds these very bytes: a name alone proves
        nothing, and a wrong address would serve this NEFF to the hook's lookups of
        another graph. Where the SDK's cache is not L1 nothing can vouch for it."""
        found = stock_address_of(self.call, sdk_version)
        data = getattr(graph, "data", None)
        if found is None or not isinstance(data, bytes):
            return None
        entry = self.sdk_cache.root.parent / found.address
        from neffcache.keying import STOCK_HLO_NAMES

        for name in STOCK_HLO_NAMES:
            with contextlib.suppress(OSError):
                path = entry / name
                if path.stat().st_size == len(data) and path.read_bytes() == data:
                    self._era = found.era  # the entry is written back in its era
                    return found.address
        STATS.count(ClientCounter.ADDRESS_UNVERIFIED)
        return None

    def _warn_versions(self, sdk: str, real: str) -> None:
        """Once per host and pair (the shim is a process per graph): libneuronxla names
        its entries with its interpreter's neuronxcc, while the compiler that runs is
        another. Stock addresses follow the SDK; keys, the compiler that ran."""
        import blake3

        mark = self.local.root / "warned" / blake3.blake3(f"{sdk} {real}".encode()).hexdigest()[:16]
        try:
            if self.local.read_only:
                raise OSError("L1 is read-only")
            mark.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return
        except OSError:
            pass  # an L1 we cannot write: warn every time rather than never
        log.warning(
            "neffcache: libneuronxla names its cache entries neuronxcc-%s, but the compiler "
            "on PATH (%s) is %s: two Python environments? Keys follow the compiler that "
            "runs; make the training interpreter's neuronx-cc the one on PATH",
            sdk,
            self.real,
            real,
        )

    def _resolve(
        self, canonical: CacheKey, direct: CacheKey | None, ctx: CompileContext, raw: CacheKey
    ) -> int:
        """Serve, wait for or compile the graph whose entry key is ``canonical`` (and
        whose direct key, when it has another, is ``direct``; ``raw`` is the direct
        key the input had when it was read, in context ``ctx``)."""
        also = None if direct is None else direct.key
        waited_from = time.time()
        code = 1
        compiled = False  # the compiler ran here, holding the lease
        published = False
        from neffcache.client.resolver import failed_while_waiting, failure_notice

        try:
            with self.local.lock(canonical.key, f"graph {canonical.key[:12]}") as _held:
                # Another rank may have fetched or compiled it while we waited.
                if self._hit(canonical.key, alias=False, also=also):
                    return self._done(0)
                failed = failed_while_waiting(self.local, canonical.key, waited_from)
                if failed is not None:
                    return self._done(self._replay(failed))
                # Other hosts: wait for one's compile, or hold the lease for ours.
                served = self._fleet(canonical.key, also, waited_from)
                if served is not None:
                    return self._done(served)
                self._explain(canonical, direct, ctx)
                code, seconds = self._compile(canonical, direct)
                compiled = True
                module = self._reread(ctx, raw, canonical) if code == 0 else None
                kept = module is not None and self._keep(module.module, canonical, direct, seconds)
            if kept:
                published = self._publish()
        finally:
            if self._holds:
                # After the publish, so waiters woken by the release find the entry.
                notice = compiled and failure_notice(code, published)
                self.resolver.release(canonical.key, failed=notice)
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
        served = self._in_l1(key)
        if served is None:
            # One process of a host asks the server for a key at a time; the others then
            # find its fetch in L1. A lookup may bring the NEFF inline, and the ranks of
            # a host start together: each would download it (the hook does the same
            # under its entry lock, proxy.py). Bounded by the longest a lookup takes:
            # past it, each asks for itself.
            from neffcache.client.remote import lookup_seconds

            wait = lookup_seconds(self.config) + 1.0
            with self.local.lock(f"lookup-{key}", f"the lookup of {key[:12]}", wait):
                served = self._in_l1(key) or self._from_server(key, alias, found)
        if served is None:
            return False
        manifest, source = served
        if also is not None:
            self.local.put_manifest(also, manifest)
        if not self.wanted():
            return False  # its caller gave up and serves itself: its line is its own
        self._note_log("neffcache: the NEFF came from the cache; the compiler did not run\n")
        self._record("hit", source, time.monotonic() - t0, None, manifest)
        STATS.count(ClientCounter.HITS_L1 if source == "l1" else ClientCounter.HITS_SERVER)
        return True

    def _in_l1(self, key: str) -> tuple[Manifest, str] | None:
        """L1's manifest for ``key`` with its NEFF at --output, and where the NEFF came
        from (L1, or the server when L1 had the manifest only)."""
        manifest = self.local.manifest(key)
        source = None if manifest is None else self._materialize(manifest)
        return None if manifest is None or source is None else (manifest, source)

    def _from_server(
        self, key: str, alias: bool, found: Manifest | None
    ) -> tuple[Manifest, str] | None:
        """The server's entry for ``key`` (or ``found``) with its NEFF at --output, kept
        in L1."""
        manifest = found
        if manifest is None and alias:
            manifest = self.resolver.lookup(direct=key)
        elif manifest is None:
            manifest = self.resolver.lookup(canonical=lambda: key)
        source = None if manifest is None else self._materialize(manifest)
        if manifest is None or source is None:
            return None
        self.local.put_manifest(key, manifest)
        grew(self.config)  # a download into L1
        return manifest, source

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
        if self.local.has_blob(digest, size):  # first: an L1 hit needs no HTTP client
            source: str | None = "l1"
        elif not self.wanted():
            return None
        elif self.local.read_only:
            # Nowhere in L1 to keep it: from the server straight to --output, verified.
            if not self.remote.fetch(digest, size, self.call.output):
                return None
            self.outcome = 0
            self.report["bytes"] = size
            return "server"
        else:
            source = self.remote.fetch_into(self.local, digest, size)
        if source is None or not self.wanted():
            return None
        try:
            copy_atomic(self.local.blob_path(digest), self.call.output, read_meanwhile=False)
        except OSError as exc:
            STATS.count(ClientCounter.LOCAL_ERRORS)
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
        from neffcache.client.resolver import Compile, Replay, Served

        outcome = self.resolver.fleet(key, began)
        if isinstance(outcome, Served) and self._hit(
            key, alias=False, also=direct, found=outcome.entry
        ):
            return 0
        if isinstance(outcome, Replay):
            return self._replay(outcome)
        if isinstance(outcome, Compile):
            self._holds = outcome.held
            if outcome.reason:
                log.info("neffcache: %s; compiling", outcome.reason)
        return None

    def _replay(self, failed: Replay) -> int:
        """A failure replayed (another rank's or another host's): its exit code, its
        log on stderr and in --logfile, and the graph's line."""
        from neffcache.client.resolver import replay

        code = replay(failed, self._note_log)
        self.report["fallback"] = failed.reason
        self.report["exit_code"] = code
        from neffcache.client.reasons import FAILED_BEFORE  # misses only: not on a hit's path

        self._record("miss", "compiler", 0.0, None, None, reason=FAILED_BEFORE)
        return code

    # -- misses -----------------------------------------------------------------------

    def _reread(self, ctx: CompileContext, raw: CacheKey, canonical: CacheKey) -> GraphInput | None:
        """The input read again once the compiler has run: its keys as they were, else
        None. Another writer (two jobs in one work directory) may have replaced it
        while it compiled; the NEFF is then of other bytes than the key says."""
        from neffcache.client.inputs import Unkeyable, read_input

        try:
            graph = read_input(self.call.input)
            same = graph.direct(ctx) == raw
            same = same and graph.canonical(ctx) in (canonical, None)
        except (OSError, ValueError, Unkeyable):
            same = False
        if same:
            return graph
        STATS.count(ClientCounter.INPUTS_CHANGED)
        log.warning("neffcache: %s changed while it compiled; not cached", self.call.input)
        return None

    def _compile(self, canonical: CacheKey, direct: CacheKey | None) -> tuple[int, float]:
        t0 = time.monotonic()
        before = _stamp(self.call.output)
        code, log_tail = run_teeing(self.real, self.call.compiler_argv)
        self.outcome = code
        seconds = time.monotonic() - t0
        self.report["exit_code"] = code
        # Only a file this compile wrote: a stale --output from an earlier run (the
        # compiler wrote elsewhere) must never be kept.
        written = self.call.output.is_file() and _stamp(self.call.output) != before
        if code != 0 or not written:
            STATS.count(ClientCounter.COMPILE_FAILURES)
            self._record("miss", "compiler", 0.0, seconds, None, outcome="failed")
            from neffcache.client.publish import failure_record
            from neffcache.client.resolver import remember_failure

            remember_failure(self.local, canonical.key, code, log_tail)

            address = self.report["neuron_address"]
            record = failure_record(canonical, direct, address, code, seconds, log_tail)
            self.remote.put_failure(canonical.key, record)
            return code, seconds
        STATS.count(ClientCounter.COMPILES)
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

        from neffcache.client.local import atomic_write, staging_parent
        from neffcache.client.publish import make_manifest

        # A read-only L1 keeps nothing: the flags and the HLO are staged for the upload
        # outside it, and removed after it (_publish).
        where = staging_parent() if self.local.read_only else self.local.root
        try:
            if self.local.read_only:
                where.mkdir(mode=0o700, exist_ok=True)
            self._staged = tempfile.TemporaryDirectory(dir=where)
            staged = Path(self._staged.name)
            flags_name, flags = flags_file(self.call, self._era)
            atomic_write(staged / flags_name, flags)
            files = {NEFF: self.call.output, flags_name: staged / flags_name}
            if module is not None:
                atomic_write(staged / HLO, module)
                files[HLO] = staged / HLO
            address = self.report["neuron_address"]
            self._manifest, self._paths = make_manifest(
                canonical, direct, address, files, seconds, self.config.model
            )
            self._manifest["stock_era"] = self._era.value
            digest = self._manifest["files"][NEFF]["digest"]
            if self.local.read_only:
                # The upload reads --output itself: it ends before we return, while the
                # file is still ours.
                return True
            # One copy, into L1; the upload reads that copy, which only we write, not
            # --output, which is the caller's once we return.
            self._paths[digest] = self.local.add_blob(self.call.output, digest)
            self.local.put_manifest(canonical.key, self._manifest)
            if direct is not None:
                self.local.put_manifest(direct.key, self._manifest)
        except OSError as exc:
            STATS.count(ClientCounter.LOCAL_ERRORS)
            log.warning("neffcache: cannot keep the new NEFF: %s", exc)
            if getattr(self, "_staged", None) is not None:
                self._unstage()
            return False
        return True

    def _unstage(self) -> None:
        from neffcache.client.local import tidy_staging

        self._staged.cleanup()
        if self.local.read_only:
            tidy_staging()

    def _publish(self) -> bool:
        from neffcache.client.publish import publish

        try:
            return publish(self.remote, self._manifest, self._paths)
        finally:
            self._unstage()
            grew(self.config)  # the compile kept; after the per-key lock, so no rank waits

    # -- the rest ---------------------------------------------------------------------

    def _uncached(self, reason: str) -> int:
        STATS.count(ClientCounter.UNCACHED)
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
            self.sdk_cache.note_wrapped(fields["neuron_address"])  # for the hook, if it called
        graph(self.config, components, **fields)

    def _explain(self, canonical: CacheKey, direct: CacheKey | None, ctx: CompileContext) -> None:
        """Ask the server why this graph missed, in the background (reasons.py)."""
        from neffcache.client.reasons import Explanation, Prepared, summarize

        self._components = canonical.as_json()

        summarized = self._summarized

        def prepare() -> Prepared:
            module = _module_of(self.call.input, ctx) if summarized else None
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


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_ino, status.st_size, status.st_mtime_ns


def _module_of(path: Path, ctx: CompileContext) -> bytes | None:
    """The HloModuleProto the input holds, read again (for an explanation's summary);
    None when it holds none or cannot be read."""
    from neffcache.client.inputs import Unkeyable, read_input

    try:
        graph = read_input(path)
        graph.canonical(ctx)
    except (OSError, ValueError, Unkeyable):
        return None
    return graph.module
