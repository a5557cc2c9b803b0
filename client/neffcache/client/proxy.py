"""The ``CompileCache`` the persistent-cache hook hands to libneuronxla
(docs/neuron-sdk.md#libneuronxla-cache-api).

It wraps the SDK's own filesystem cache over the L1 directory (``NEFFCACHE_LOCAL_DIR``,
the stock layout), so locks, ``get_hlos``, ``try_lookup_for_compile`` and
``clear_locks`` behave exactly as the SDK's do for ``neuron_parallel_compile``. Three
methods add the server:

* ``exists(<entry>/model.done)`` (and ``model.neff``, which older SDKs probe, #hit-detection):
  true if L1 has it; else the server is asked for the entry by its Neuron address
  and, when the entry's HLO is already in L1, by its direct and canonical keys; a
  found entry is written into L1 (``model.done`` last) before the answer is true.
* ``exists(<entry>/model.log)``: false unless ``NEFFCACHE_STOCK_FAILURES`` is set, so
  a failed compile is never replayed (the stock cache's "cached failed neff").
* ``upload_file``/``upload_string_to_file``: written to L1 as the SDK asked; when
  ``model.done`` arrives the entry is published in the background, and a
  ``model.log`` is reported to the server as a failure record.

The order in which the SDK writes the HLO and probes ``model.done`` is not public
(docs/neuron-sdk.md#hit-detection): when the probe comes first, only the address can be
looked up; a trace that differs in metadata then misses here and is caught by the
compiler wrapper, which is why both interception points are meant to be enabled
together.

``Core`` is the SDK-call adapter of ``resolver.py``: it maps the SDK's probes, locks
and uploads onto the resolver's lookup, lease and release (``resolver.HOOK``'s
policy), and keeps what is the hook's own: the SDK's entry folders in L1, its
per-entry lock, and publishing in the background once the SDK wrote ``model.done``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neffcache.client._log import log
from neffcache.client.config import ClientConfig
from neffcache.client.l1limit import entry_lock_name
from neffcache.client.l1limit import grew as _grew
from neffcache.client.l1limit import used as _used
from neffcache.client.reasons import UNKNOWN
from neffcache.client.resolver import (
    HOOK,
    Compile,
    Resolver,
    Served,
    failure_notice,
)
from neffcache.client.resolver import same_environment as same_environment  # prewarm's
from neffcache.client.runlog import DELEGATED_FIELDS, saved_seconds
from neffcache.client.stats import STATS
from neffcache.keying import (
    STOCK_DONE,
    STOCK_FLAGS_NAMES,
    STOCK_HLO_NAMES,
    STOCK_LOG,
    STOCK_NEFF,
    is_stock_artifact,
)
from neffcache.protocol.counters import ClientCounter

if TYPE_CHECKING:
    from neffcache.client.lease import Leases
    from neffcache.client.local import LocalStore
    from neffcache.client.reasons import Explanation, Prepared
    from neffcache.client.remote import Remote
    from neffcache.keying import StockFlags

DONE = STOCK_DONE
NEFF = STOCK_NEFF
LOG = STOCK_LOG
# compile_flags.json, or the oldest era's compile_flags.txt (docs/neuron-sdk.md#layout-eras).
FLAGS_NAMES = STOCK_FLAGS_NAMES
HLO_NAMES = STOCK_HLO_NAMES


def make_proxy_class(base: type) -> type:
    """A subclass of the SDK's ``CompileCache`` (so isinstance checks hold)."""

    class NeffcacheCompileCache(base):  # type: ignore[misc]
        """Server-backed; see the module docstring."""

        def __init__(
            self, stock: Any, config: ClientConfig, original_url: Any, lower: str | None = None
        ) -> None:
            # Not base.__init__: the stock cache already parsed its URL, and every path
            # the SDK builds from ``cache_path`` must point into L1 (or, while L1 is
            # read-only, into the staging directory over it: ``lower`` is L1).
            self._stock = stock
            self._core = Core(stock, config, lower)
            self.cache_url = stock.cache_url
            self.cache_path = stock.cache_path
            self.cache_type = getattr(stock, "cache_type", "fs")
            self.neffcache_url = original_url

        # -- the three methods with server behaviour ----------------------------------

        def exists(self, path: str) -> bool:
            return self._core.exists(path)

        def upload_file(self, cache_path: str, src_path: str) -> None:
            self._stock.upload_file(cache_path, src_path)
            self._core.uploaded(cache_path)

        def upload_string_to_file(self, cache_path: str, data: Any) -> None:
            self._stock.upload_string_to_file(cache_path, data)
            self._core.uploaded(cache_path, data)

        def hlo_acquire_lock(self, hlo_path: str, *args: Any, **kwargs: Any) -> None:
            self._core.acquire_entry(hlo_path, kwargs.get("timeout"))
            try:
                self._stock.hlo_acquire_lock(hlo_path, *args, **kwargs)
            except BaseException:
                self._core.release_entry(hlo_path)
                raise
            self._core.mark_entry(hlo_path)

        def hlo_release_lock(self, hlo_path: str, *args: Any, **kwargs: Any) -> None:
            try:
                self._stock.hlo_release_lock(hlo_path, *args, **kwargs)
            finally:
                self._core.release_entry(hlo_path)

        def get_hlos(self, *args: Any, **kwargs: Any) -> Any:
            return self._core.get_hlos(*args, **kwargs)

        # Reads that do not go through exists() (optimum's Hub proxy and NxD Inference
        # fetch whole entries, transformers-neuronx calls download_artifacts): the
        # entry comes from the server into L1 first when L1 lacks it.

        def download_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
            self._core.before_read(path)
            return self._stock.download_file(path, *args, **kwargs)

        def download_file_to_string(self, path: str, *args: Any, **kwargs: Any) -> Any:
            self._core.before_read(path)
            return self._stock.download_file_to_string(path, *args, **kwargs)

        def download_folder(self, folder_path: str, *args: Any, **kwargs: Any) -> Any:
            self._core.before_read(folder_path)
            return self._stock.download_folder(folder_path, *args, **kwargs)

        def download_artifacts(self, parent_dir: str, *args: Any, **kwargs: Any) -> Any:
            self._core.before_read(parent_dir)
            return self._stock.download_artifacts(parent_dir, *args, **kwargs)

        def try_lookup_for_compile(self, hlo_path: str) -> Any:
            entry = self._stock.try_lookup_for_compile(hlo_path)
            if entry is not None and hasattr(entry, "cache"):
                entry.cache = self  # its uploads then come through here, and publish
            return entry

        # -- everything else is the stock cache's -------------------------------------

        def __getattr__(self, name: str) -> Any:
            return getattr(self._stock, name)

    for name in _DELEGATED:
        if name not in NeffcacheCompileCache.__dict__:
            setattr(NeffcacheCompileCache, name, _delegate(name))
    return NeffcacheCompileCache


# Methods the SDK's base class may define itself (so __getattr__ would not see them):
# they go to the stock L1 cache explicitly.
_DELEGATED = (
    "get_cache_dir",
    "get_cache_dir_with_cache_key",
    "upload_folder",
    "remove",
    "clean",
    "clear_locks",
    "clear_neffs",
)


def _delegate(name: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._stock, name)(*args, **kwargs)

    method.__name__ = name
    return method


class Core:
    """The proxy's logic, independent of the SDK's classes (tested directly)."""

    def __init__(self, stock: Any, config: ClientConfig, lower: str | None = None) -> None:
        from neffcache.client.local import LocalStore
        from neffcache.client.remote import Remote

        self.stock = stock
        self.config = config
        self.root = Path(stock.cache_path)
        self.local = LocalStore.of(config)
        # A read-only L1 under the SDK's cache (a staging directory): its complete
        # entries are linked in as the SDK first asks for them, and never written.
        self.lower = None if lower is None else Path(lower)
        self.remote = Remote(config)
        self.resolver = Resolver(config, HOOK, lambda: self.remote, _shared_leases(config))
        self._hlo_seen: dict[str, float] = {}  # entry dir -> when its HLO was written
        self._entry_locks: dict[str, int] = {}  # HLO path -> held flock descriptor
        self._locked_entries: set[str] = set()  # entry dirs whose SDK lock we hold
        self._waited_from: dict[str, float] = {}  # entry dir -> when this rank began to wait
        self._holding: dict[str, str] = {}  # entry dir -> the address this process leases
        # Entries whose hit this process counted under the SDK's lock (fetched, or found
        # fetched by another rank of the host): the SDK's probe that follows finds them
        # in L1 and must not count them again.
        self._counted: set[str] = set()

    @property
    def _leases(self) -> Leases | None:
        """This process's leases (one per process: the SDK makes a new cache object per
        compile), once this object asked for one."""
        return self.resolver.leases

    # -- the SDK's per-entry compile lock, made safe against dead holders ---------------
    #
    # The SDK's lock is a file that exists while someone compiles
    # (docs/neuron-sdk.md#per-entry-compile-lock); a killed compile leaves it forever.
    # Here a neffcache process first takes a flock (which the kernel drops when the
    # process dies), then the SDK's lock, and writes its pid into the lock file. So a
    # lock file with a pid, found while holding the flock, belongs to a dead neffcache
    # process and is removed; an empty one was made by a process without neffcache and
    # is waited for, as the SDK does.

    def acquire_entry(self, hlo_path: str, timeout: float | None = None) -> None:
        import blake3

        name = "hlo-" + blake3.blake3(hlo_path.encode()).hexdigest()[:32]
        # Kept if set earlier: a rank that waited for another host's lease began then.
        self._waited_from.setdefault(_dir_of(hlo_path), time.time())
        fd = self.local.acquire(name, f"the compile lock of {hlo_path}", wait=timeout or 0.0)
        if fd is None:
            return  # no flock possible here: the SDK's own lock still serializes
        self._entry_locks[hlo_path] = fd
        stale = Path(hlo_path + ".lock")
        try:
            if stale.read_text().strip().startswith("neffcache pid"):
                stale.unlink()
                STATS.count(ClientCounter.STALE_LOCKS_REMOVED)
                log.warning("neffcache: removed %s, left by a killed compile", stale)
        except (OSError, UnicodeDecodeError):
            pass

    def mark_entry(self, hlo_path: str) -> None:
        entry = _dir_of(hlo_path)
        self._locked_entries.add(entry)
        if hlo_path in self._entry_locks:
            with contextlib.suppress(OSError):
                Path(hlo_path + ".lock").write_text(f"neffcache pid {os.getpid()}\n")
        try:
            self._lease_under_lock(Path(entry))
            self._explain(Path(entry))
        except Exception:  # the cache's trouble is never the job's
            STATS.count(ClientCounter.HOOK_ERRORS)
            log.exception("neffcache: the compile lease of %s failed; compiling", entry)

    def _lease_under_lock(self, entry: Path) -> None:
        """Just before the SDK compiles (it holds its entry lock now): hold the fleet's
        lease on the graph, or wait for the host that holds it and put its entry into
        L1, where an SDK that probes again under the lock finds it. Here, not in a
        probe: whether the SDK probes again after taking the lock is not public
        (docs/neuron-sdk.md#hit-detection), and a probe may be followed by no compile at
        all."""
        if (entry / DONE).exists() or not self.config.leases:
            return
        address = self._address(entry)
        if address is None:
            return
        began = self._waited_from.get(_spelled(entry), time.time())
        t0 = time.monotonic()
        manifest = self._fleet(entry, address, began, take=True)
        if manifest is None:
            return
        # Another rank of this host may be fetching the same entry in a probe (it holds
        # the host's entry lock meanwhile, see _fetch): one download per host.
        with self.local.lock(entry_lock_name(address), f"entry {address}"):
            if (entry / DONE).exists():
                self._record(entry, "hit", "l1", None)
            elif self._materialize(entry, manifest):
                self._record(entry, "hit", "server", None, manifest, time.monotonic() - t0)
            else:
                return
        self._counted.add(_spelled(entry))

    def release_entry(self, hlo_path: str) -> None:
        from neffcache.client.local import release

        # A compile that ended with neither model.done nor model.log (an exception
        # in the SDK) leaves nothing to wait for: let the others go.
        entry = _dir_of(hlo_path)
        self.resolver.release(self._holding.pop(entry, None), failed=False)
        _take_explanation(entry)
        self._locked_entries.discard(entry)
        self._waited_from.pop(entry, None)
        self._counted.discard(entry)
        fd = self._entry_locks.pop(hlo_path, None)
        if fd is not None:
            release(fd)

    def exists(self, path: str) -> bool:
        name = os.path.basename(path)
        if name == LOG and not self.config.stock_failures:
            return self._failed_while_waiting(path)
        if name in (DONE, NEFF):
            _used(path)  # before the probe: l1limit's handshake with an eviction under way
            self._from_lower(path)
        if self.stock.exists(path):
            if name == DONE:
                entry = _dir_of(path)
                if entry in self._counted:
                    self._counted.discard(entry)
                else:
                    self._record(Path(path).parent, "hit", "l1", None)
            return True
        folder = self._entry_of(path)
        if folder is None or name not in (DONE, NEFF, folder.name):
            return False  # an entry's other files, or no entry: nothing to ask for
        try:
            return self._fetch(folder) and self.stock.exists(path)
        except Exception:  # the cache's trouble is never the job's
            STATS.count(ClientCounter.HOOK_ERRORS)
            log.exception("neffcache: lookup of %s failed; compiling", path)
            return False

    def before_read(self, path: str) -> None:
        """Before the SDK reads ``path`` (a file of an entry, or the entry's folder)
        other than through ``exists``: fetch the entry from the server into L1 when L1
        has no complete one. Never raises: a read the server cannot serve is the SDK's
        own miss."""
        entry = self._entry_of(path)
        if entry is None or (entry / DONE).exists() or self._from_lower(path):
            return
        try:
            self._fetch(entry)
        except Exception:  # the cache's trouble is never the job's
            STATS.count(ClientCounter.HOOK_ERRORS)
            log.exception("neffcache: fetching %s failed", entry)

    def _from_lower(self, path: str) -> bool:
        """Link the read-only L1's entry for ``path`` into the SDK's cache when it has a
        complete one and the SDK's cache has none (``local.link_entry``); True when
        linked now. Its compile time comes along, for the hit's line."""
        entry = None if self.lower is None else self._entry_of(path)
        if self.lower is None or entry is None or (entry / DONE).exists():
            return False
        from neffcache.client.local import LocalStore, link_entry

        source = self.lower / entry.relative_to(self.root)
        if not link_entry(source, entry):
            return False
        seconds = compile_seconds_of(LocalStore(self.lower, read_only=True), source)
        remember_compile_seconds(self.local, entry, seconds)
        return True

    def _entry_of(self, path: str) -> Path | None:
        """The entry folder ``path`` is or lies in (``<root>/neuronxcc-*/MODULE_*``)."""
        try:
            parts = Path(os.path.abspath(path)).relative_to(os.path.abspath(self.root)).parts
        except ValueError:
            return None
        if len(parts) not in (2, 3) or not parts[1].startswith("MODULE_"):
            return None
        return self.root / parts[0] / parts[1]

    def _failed_while_waiting(self, log_path: str) -> bool:
        """A failure is recorded, never replayed to a later run; but a rank that was
        waiting on the compile lock while the holder failed gets the holder's answer
        instead of compiling the same failing graph once more after it."""
        waited_from = self._waited_from.get(_dir_of(log_path))
        if waited_from is None:
            return False
        try:
            failed_at = os.stat(log_path).st_mtime
        except OSError:
            return False
        if failed_at < waited_from:
            return False
        STATS.count(ClientCounter.FAILURES_REPLAYED)
        return True

    def get_hlos(self, *args: Any, **kwargs: Any) -> Any:
        """The SDK's classification, with failed entries back in ``todo``: a failure is
        not replayed, so ``neuron_parallel_compile`` must try them again, as training
        would (unless ``NEFFCACHE_STOCK_FAILURES``)."""
        found = self.stock.get_hlos(*args, **kwargs)
        if self.config.stock_failures or not (isinstance(found, tuple) and len(found) == 4):
            return found  # the stock behaviour, or an SDK whose answer we do not know
        todo, locked, done, failed = found
        return [*todo, *failed], locked, done, []

    def uploaded(self, cache_path: str, data: Any = None) -> None:
        try:
            name = os.path.basename(cache_path)
            entry = _dir_of(cache_path)
            if name in HLO_NAMES or name in FLAGS_NAMES:
                if name in HLO_NAMES:
                    self._hlo_seen.setdefault(entry, time.monotonic())
                if entry in self._locked_entries:  # the SDK writes its inputs, then compiles
                    self._explain(Path(entry))
            elif name == DONE:
                # The lease goes with the publish, released once the entry is up.
                lease = self._holding.pop(entry, None)
                started = self._hlo_seen.pop(entry, None)
                seconds = None if started is None else time.monotonic() - started
                remember_compile_seconds(self.local, Path(entry), seconds)
                self._record(Path(entry), "miss", "compiler", seconds, outcome="ok", began=started)
                environ = dict(os.environ)  # as the compile saw it, not as publishing will
                queued = _publisher(self.config).submit(
                    lambda: self._publish(Path(entry), seconds, environ, lease)
                )
                if not queued:  # dropped: nothing will be published for the waiters
                    self.resolver.release(lease, failed=failure_notice(0, published=False))
            elif name == LOG:
                lease = self._holding.pop(entry, None)
                started = self._hlo_seen.pop(entry, None)
                seconds = None if started is None else time.monotonic() - started
                self._record(
                    Path(entry), "miss", "compiler", seconds, outcome="failed", began=started
                )
                text = data if isinstance(data, str) else _read_text(cache_path)
                environ = dict(os.environ)
                queued = _publisher(self.config).submit(
                    lambda: self._report(Path(entry), text, seconds, environ, lease)
                )
                if not queued:
                    self.resolver.release(lease, failed=failure_notice(None, published=False))
        except Exception:
            STATS.count(ClientCounter.HOOK_ERRORS)
            log.exception("neffcache: could not handle the upload of %s", cache_path)

    def _record(
        self,
        entry: Path,
        result: str,
        source: str,
        seconds: float | None,
        manifest: dict[str, Any] | None = None,
        fetch: float = 0.0,
        *,
        outcome: str | None = None,
        began: float | None = None,
    ) -> None:
        """Count a graph and write its run-manifest line and event (runlog.graph):
        found in L1, fetched from the server (``manifest``: what it found), compiled
        by the SDK (``outcome`` ``ok``) or failed to (``failed``), its inputs having
        come at ``began`` (monotonic). When the SDK's compiler was the wrapper's shim,
        which resolved the graph meanwhile, the line says ``delegated`` (runlog.py)
        and there is no event: the wrapper's line counts the graph."""
        from neffcache.client.runlog import graph

        address = self._address(entry)
        wrapped = result == "miss" and self._wrapped(entry, address, began)
        # A compile the wrapper's shim ran is counted by the wrapper's process (as the
        # compile or the hit it was): counted here too, it would count twice.
        if outcome != "failed" and not wrapped:
            STATS.count(
                ClientCounter.COMPILES
                if source == "compiler"
                else ClientCounter.HITS_L1
                if source == "l1"
                else ClientCounter.HITS_SERVER
            )
        # Without a run manifest or telemetry, the graph still goes to the host's
        # counters (runlog.graph), with no wait added for its miss's reason.
        reported = bool(self.config.run_manifest or self.config.telemetry)
        if wrapped and not reported:
            return  # nothing would be written, nor counted: the wrapper counts it
        try:
            size = (entry / NEFF).stat().st_size if outcome != "failed" else 0
        except OSError:
            size = 0
        found = manifest or {}
        fields: dict[str, Any] = {
            "via": "hook",
            "key": found.get("key"),
            "direct_key": found.get("direct_key"),
            "neuron_address": address,
            "result": result,
            "source": source,
            "fetch_seconds": round(fetch, 6),
            "compile_seconds": None if seconds is None else round(seconds, 3),
            "bytes": size,
            "fallback": None,
            "compiler_version": _version_of(address),
        }
        components = None
        keys: dict[str, Any] = {}
        if result == "hit":
            fields["saved_seconds"] = (
                saved_seconds(manifest)
                if manifest is not None
                else compile_seconds_of(self.local, entry)
            )
        else:
            fields["outcome"] = outcome
            reason, summary, prepared = _miss_reason(entry, wait=reported and not wrapped)
            fields["reason"], fields["reason_summary"] = reason, summary
            if prepared is not None:
                keys = {"key": prepared.key, "direct_key": prepared.direct_key}
                components = prepared.components
                # Not ``key``: prewarm fetches a line's graph by its key into the
                # wrapper's side of L1, and the SDK looks for this one by address.
                fields["explain_key"] = prepared.key
        if wrapped:
            fields.update(DELEGATED_FIELDS)
        graph(self.config, components, event=not wrapped, also=keys, **fields)

    def _wrapped(self, entry: Path, address: str | None, began: float | None) -> bool:
        """Whether the wrapper's shim resolved the graph at ``entry`` during this
        compile: since its inputs came (``began``, monotonic); else (an HLO written by
        another process, as neuron_parallel_compile's trial run writes them) since
        this process took the entry's lock."""
        since = (
            self._waited_from.get(_spelled(entry))
            if began is None
            else time.time() - (time.monotonic() - began)
        )
        return (
            address is not None and since is not None and self.local.wrapped_since(address, since)
        )

    def _explain(self, entry: Path) -> None:
        """Once the SDK holds the entry's lock and its HLO and flags are in place (it
        compiles next), ask the server in the background why the graph missed."""
        spelled = _spelled(entry)
        if spelled in _explanations or (entry / DONE).exists():
            return
        if _flags_path(entry) is None or not any((entry / n).is_file() for n in HLO_NAMES):
            return
        address = self._address(entry)
        if address is None:
            return
        from neffcache.client.reasons import Explanation, Prepared, summarize

        environ = dict(os.environ)

        def prepare() -> Prepared | None:
            inputs = self._inputs(entry, address, environ)
            if inputs is None:
                return None
            module, ctx = inputs
            from neffcache.client.keys import canonical_key, direct_key

            try:
                canonical = canonical_key(module, ctx)
            except ValueError:  # KeyingError: not an HloModuleProto keying can read
                return None
            components = canonical.as_json()
            summary = summarize(module)
            if summary is not None:
                components["graph"] = summary
            return Prepared(canonical.key, direct_key(module, ctx).key, components)

        with _explanations_lock:
            if spelled not in _explanations:
                _explanations[spelled] = Explanation(self.remote, prepare)

    # -- lookups ----------------------------------------------------------------------

    def _address(self, entry: Path) -> str | None:
        try:
            relative = entry.relative_to(self.root)
        except ValueError:
            return None
        parts = relative.parts
        if len(parts) != 2 or not parts[0].startswith("neuronxcc-"):
            return None
        from neffcache.keying import KeyingError, parse_neuron_address

        try:
            address = str(parse_neuron_address("/".join(parts)))
        except KeyingError:
            return None
        # The version libneuronxla names its entries with is this interpreter's
        # neuronxcc; the compiler it runs is the first neuronx-cc on PATH, which can
        # be another's. The shim, which the SDK runs, inherits it from here and checks.
        from neffcache.client.keys import SDK_VERSION_VARIABLE

        os.environ[SDK_VERSION_VARIABLE] = address.split("/")[0][len("neuronxcc-") :]
        return address

    def _fetch(self, entry: Path) -> bool:
        """Find the entry on the server and write it into L1; True when it is there."""
        address = self._address(entry)
        if address is None or self.remote.skips():
            return False
        if _spelled(entry) in self._holding:
            # This process holds the lease: it compiles. (The SDK probes again after
            # taking its entry lock; ranks waiting for us hold the lock below.)
            return False
        t0 = time.monotonic()
        began = time.time()
        with self.local.lock(entry_lock_name(address), f"entry {address}") as _held:
            if (entry / DONE).exists():  # another rank on this host fetched it meanwhile
                self._record(entry, "hit", "l1", None)
                return True
            manifest = self.resolver.lookup(address=address)
            if manifest is None:
                keys = self._keys(entry, address)
                if keys is not None:
                    direct, canonical = keys
                    manifest = self.resolver.lookup(
                        direct=direct.key, canonical=lambda: canonical().key
                    )
            if manifest is None and _spelled(entry) not in self._locked_entries:
                # Before the SDK's entry lock: wait for a host that compiles it, never
                # take the lease (that happens under the lock, in mark_entry).
                manifest = self._fleet(entry, address, began, take=False)
                if manifest is None:
                    # A failure written while this rank waited is replayed to it.
                    self._waited_from.setdefault(_spelled(entry), began)
            if manifest is None or not self._materialize(entry, manifest):
                return False
        self._record(entry, "hit", "server", None, manifest, time.monotonic() - t0)
        return True

    def _fleet(self, entry: Path, address: str, began: float, take: bool) -> dict[str, Any] | None:
        """Another host's entry for this graph once its compile ends, or None: the
        SDK compiles here, holding the lease if ``take`` and this process got it."""
        outcome = self.resolver.fleet(address, began, take=take)
        if isinstance(outcome, Served):
            return outcome.entry
        if isinstance(outcome, Compile) and outcome.held:
            self._holding[_spelled(entry)] = address
        elif isinstance(outcome, Compile) and outcome.reason and not outcome.again:
            log.info("neffcache: %s; compiling %s", outcome.reason, address)
        return None  # HOOK replays no failure: the SDK compiles

    def _keys(
        self, entry: Path, address: str, environ: dict[str, str] | None = None
    ) -> tuple[Any, Any] | None:
        """The entry's direct key and a function for its canonical key, when its HLO
        and flags are in L1; None otherwise (nothing to key)."""
        inputs = self._inputs(entry, address, environ)
        if inputs is None:
            return None
        from neffcache.client.keys import canonical_key, direct_key

        module, ctx = inputs
        return direct_key(module, ctx), lambda: canonical_key(module, ctx)

    def _inputs(
        self, entry: Path, address: str, environ: dict[str, str] | None = None
    ) -> tuple[bytes, Any] | None:
        return entry_inputs(entry, address, environ)

    def _materialize(self, entry: Path, manifest: dict[str, Any]) -> bool:
        def mark_done(done: Path) -> None:
            self.stock.upload_string_to_file(str(done), "")
            _grew(self.config, background=True)  # L1 holds one more entry

        return write_entry(self.local, self.remote, entry, manifest, mark_done)

    # -- publishing -------------------------------------------------------------------

    def _publish(
        self, entry: Path, seconds: float | None, environ: dict[str, str], lease: str | None = None
    ) -> None:
        published = False
        try:
            published = self._publish_entry(entry, seconds, environ)
        finally:
            # After the publish: the waiters the release wakes find the entry.
            self.resolver.release(lease, failed=failure_notice(0, published))
            # This Core's connection on the publisher's thread: the SDK makes a new
            # cache object (and Core) per compile, so none would be used again.
            self.remote.close()
            _grew(self.config)  # the SDK's new entry; on the publisher's thread, not the SDK's

    def _publish_entry(self, entry: Path, seconds: float | None, environ: dict[str, str]) -> bool:
        """True when the server holds the entry under this entry's address."""
        from neffcache.client.publish import make_manifest, publish

        address = self._address(entry)
        if address is None or not (entry / NEFF).is_file():
            return False
        if placeholder_mode(environ) and not self._resolved_by_shim(entry, address):
            STATS.count(ClientCounter.PLACEHOLDERS_KEPT_BACK)
            log.info("neffcache: %s not published: the SDK may return placeholders", address)
            return False
        keys = self._keys(entry, address, environ)
        if keys is None:
            # No --target in the flags (docs/neuron-sdk.md#flags-hash item 6): the wrapper
            # keys such graphs from the compiler's own command line.
            STATS.count(ClientCounter.UNKEYABLE)
            return False
        direct, canonical = keys
        files = {p.name: p for p in entry.iterdir() if p.is_file() and is_stock_artifact(p.name)}
        manifest, paths = make_manifest(
            canonical(), direct, address, files, seconds, self.config.model
        )
        read = stock_flags(entry)
        if read is not None:
            # An export writes the entry back as this SDK wrote it (bridge exporter).
            manifest["stock_era"] = read.era.value
        return publish(self.remote, manifest, paths)

    def _resolved_by_shim(self, entry: Path, address: str) -> bool:
        """Whether the compiler shim compiled or served this entry's graph since the SDK
        wrote its HLO: then its NEFF is a real compiler's, whatever the SDK's mode."""
        hlo = next((entry / n for n in HLO_NAMES if (entry / n).is_file()), None)
        try:
            since = os.stat(hlo).st_mtime if hlo is not None else time.time()
        except OSError:
            return False
        return self.local.wrapped_since(address, since - 1.0)

    def _report(
        self,
        entry: Path,
        text: str,
        seconds: float | None,
        environ: dict[str, str],
        lease: str | None = None,
    ) -> None:
        try:
            self._report_failure(entry, text, seconds, environ)
        finally:
            # The SDK's compile failed (model.log); how, it does not say.
            self.resolver.release(lease, failed=failure_notice(None, published=False))
            self.remote.close()

    def _report_failure(
        self, entry: Path, text: str, seconds: float | None, environ: dict[str, str]
    ) -> None:
        from neffcache.client.publish import failure_record

        address = self._address(entry)
        keys = None if address is None else self._keys(entry, address, environ)
        if keys is None:
            return
        direct, canonical = keys
        key = canonical()
        STATS.count(ClientCounter.COMPILE_FAILURES)
        record = failure_record(key, direct, address, None, seconds, text)
        self.remote.put_failure(key.key, record)


def placeholder_mode(environ: dict[str, str]) -> bool:
    """Whether libneuronxla may hand back placeholder outputs instead of compiling
    (``neuron_parallel_compile``'s trial run, whose environment its compile pool
    inherits; Ray's workers). Such a process's entries are published only when the
    shim vouches for them: these variables are not in the key (keying's _env.py)."""
    return any(
        environ.get(name, "") not in ("", "0")
        for name in ("NEURON_EXTRACT_GRAPHS_ONLY", "NEURON_FALL_BACK_TO_NULL_NEFF")
    )


def write_entry(
    local: LocalStore,
    remote: Remote,
    entry: Path,
    manifest: dict[str, Any],
    mark_done: Callable[[Path], None],
) -> bool:
    """Write an entry's files into its stock-layout directory in L1 (files already
    there, such as the SDK's own HLO and flags, are kept), each verified, then
    ``mark_done(entry / "model.done")``; True when written."""
    from neffcache.client.local import copy_atomic

    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(files.get(NEFF), dict):
        return False
    for name, ref in sorted(files.items()):
        if not isinstance(ref, dict) or not isinstance(name, str) or not is_stock_artifact(name):
            continue  # a lock named in a manifest would make the SDK wait for no one
        target = entry / name
        if name != NEFF and target.exists():
            continue
        digest, size = ref.get("digest"), ref.get("size")
        if not isinstance(digest, str) or not isinstance(size, int):
            return False
        # Straight into the entry, verified (one copy on disk, not two); from L1's
        # blobs when the wrapper already holds the file.
        if local.has_blob(digest, size):
            copy_atomic(local.blob_path(digest), target)
        elif not remote.fetch(digest, size, target):
            return False
    remember_compile_seconds(local, entry, saved_seconds(manifest))
    mark_done(entry / DONE)
    return True


def _saved_path(local: LocalStore, entry: Path) -> Path:
    import blake3

    name = blake3.blake3(os.path.abspath(entry).encode()).hexdigest()[:32]
    return local.root / "compiled" / name


def remember_compile_seconds(local: LocalStore, entry: Path, seconds: float | None) -> None:
    """Keep the compile time of the stock entry at ``entry`` in L1 (best effort): an L1
    hit on it later reports what it saved, with no manifest at hand."""
    if seconds is None:
        return
    from neffcache.client.local import atomic_write

    with contextlib.suppress(OSError):
        atomic_write(_saved_path(local, entry), repr(round(seconds, 3)).encode())


def compile_seconds_of(local: LocalStore, entry: Path) -> float | None:
    try:
        value = float(_saved_path(local, entry).read_text())
    except (OSError, ValueError):
        return None
    return value if 0 <= value < 7 * 86400 else None


def _flags_path(entry: Path) -> Path | None:
    """The entry's flags file: ``compile_flags.json``, else the oldest era's
    ``compile_flags.txt``; None when it has neither."""
    return next((entry / n for n in FLAGS_NAMES if (entry / n).is_file()), None)


def stock_flags(entry: Path) -> StockFlags | None:
    """The entry's flags file as read (its era, its tokens), or None when it has none
    or one keying cannot read."""
    from neffcache.keying import KeyingError, read_stock_flags

    path = _flags_path(entry)
    if path is None:
        return None
    try:
        return read_stock_flags(path.name, path.read_bytes())
    except (OSError, KeyingError):
        return None


def entry_inputs(
    entry: Path, address: str, environ: dict[str, str] | None = None
) -> tuple[bytes, Any] | None:
    """The HLO bytes and compile context of the stock entry at ``entry`` (its address
    ``address``), as the hook keys it, or None when they cannot be had (no HLO or
    flags in L1, no target: neither ``--target`` among the flags, as ``--target=trn2``
    or NxDI's two words, nor NEURON_PLATFORM_TARGET_OVERRIDE). The flags come from
    whichever era's file the entry has (docs/neuron-sdk.md#layout-eras).
    ``neffcache explain`` keys a stock entry with it too (explain_target.py), so both
    say the same key."""
    hlo = next((entry / n for n in HLO_NAMES if (entry / n).is_file()), None)
    read = None if hlo is None else stock_flags(entry)
    if hlo is None or read is None:
        return None
    from neffcache.client.keys import context

    target = read.target or os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or None
    if target is None:
        return None
    try:
        ctx = context(
            _version_of(address) or "",
            target,
            read.flags,
            os.environ if environ is None else environ,
        )
        module = hlo.read_bytes()
    except (OSError, ValueError):
        return None
    return module, ctx


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


_the_publisher: list[Any] = []  # one per process, made on the first publish
_publisher_lock = threading.Lock()


# Explanations under way, by entry directory: asked for under the SDK's entry lock,
# taken when the compile ends (the SDK makes a new cache object, and Core, per compile).
_explanations: dict[str, Explanation] = {}
_explanations_lock = threading.Lock()


def _take_explanation(entry: str) -> Explanation | None:
    with _explanations_lock:
        return _explanations.pop(entry, None)


def _miss_reason(entry: Path, wait: bool) -> tuple[str, str | None, Prepared | None]:
    """The reason of the miss at ``entry``, its summary and what it was asked with;
    ``unknown`` when no explanation was asked for (the hook did not see the graph's
    inputs under the SDK's lock). ``wait``: up to REASON_WAIT for an answer."""
    from neffcache.client.reasons import REASON_WAIT

    explanation = _take_explanation(_spelled(entry))
    if explanation is None:
        return UNKNOWN, None, None
    reason, summary = explanation.result(REASON_WAIT if wait else 0.0)
    return reason, summary, explanation.prepared


def _version_of(address: str | None) -> str | None:
    """The compiler version in a stock address (``neuronxcc-<ver>/MODULE_...``)."""
    if address is None or not address.startswith("neuronxcc-"):
        return None
    return address.split("/")[0][len("neuronxcc-") :] or None


def _dir_of(path: str) -> str:
    """The entry directory of a file in it, spelled one way for every map keyed by it
    (``./l1//x`` and ``l1/x`` are one entry)."""
    return os.path.normpath(os.path.dirname(path))


def _spelled(entry: Path) -> str:
    return os.path.normpath(str(entry))


def _flush_publishes() -> None:
    with _publisher_lock:
        publisher = _the_publisher[0] if _the_publisher else None
    if publisher is not None:
        publisher.flush()


def _shared_leases(config: ClientConfig) -> Callable[[], Leases]:
    def make() -> Leases:
        from neffcache.client.lease import shared_leases

        # The publish flush first at exit: a waiter woken by a release finds the entry.
        return shared_leases(config, before_exit=_flush_publishes)

    return make


def _publisher(config: ClientConfig) -> Any:
    from neffcache.client.publish import Publisher

    with _publisher_lock:
        if not _the_publisher:
            _the_publisher.append(Publisher(config.publish_wait))
        return _the_publisher[0]
