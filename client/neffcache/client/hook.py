"""The persistent-cache hook: when ``libneuronxla`` is imported, its
``create_compile_cache`` is replaced wherever libneuronxla binds it (the way
optimum-neuron patches it, docs/neuron-sdk.md#libneuronxla-cache-api), by one that
returns a server-backed cache for a ``neffcache+`` URL, so the SDK never treats that URL
as a directory.

``install()`` puts a finder on ``sys.meta_path`` that lets every ``libneuronxla``
module load normally and then patches it: modules that libneuronxla imports later,
with their own ``from ... import create_compile_cache``, are patched as they load.
The SDK's cache classes are guarded too: code that builds ``CompileCacheFs(url)`` itself
(optimum-neuron's sessions replace ``create_compile_cache`` by such a function,
docs/neuron-sdk.md#optimum-neuron-sessions) gets a stock cache on the L1 directory for a
``neffcache+`` URL.

Which URL is in force is read each time libneuronxla asks for a cache, from the
environment as it is then (scripts and NxD Training set the URL after start-up,
docs/neuron-sdk.md#when-the-cache-url-is-set) and from the URL the SDK hands over.

Every process that imports libneuronxla imports this module (one started with a
``neffcache+`` URL in its environment, at start-up), so it imports almost nothing: the
finder and loader are duck-typed (``importlib.abc`` alone costs milliseconds), and the
rest loads when libneuronxla asks for a cache.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from neffcache.client._log import log, warn_typos_once

PACKAGE = "libneuronxla"
_ATTRIBUTE = "create_compile_cache"
_PATCHED_MARK = "__neffcache_patched__"


class _Finder:
    """Finds nothing itself: wraps the real loader of libneuronxla modules."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)  # type: ignore[assignment]
                return spec
        return None


class _PatchingLoader:
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        result: ModuleType | None = self.loader.create_module(spec)
        return result

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            patch_loaded()
            guard_constructors()
        except Exception as exc:  # never break the SDK's import
            print(f"neffcache: cannot patch libneuronxla: {exc}", file=sys.stderr)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ...
        return getattr(self.loader, name)


_FINDER = _Finder()


def install() -> None:
    """Arm the hook (idempotent); patch at once if libneuronxla is already imported."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if PACKAGE in sys.modules:
        patch_loaded()
        guard_constructors()


def find_spec(fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
    """Arm the hook, then find ``fullname`` as the armed hook does: for a finder that
    meets libneuronxla's import before the hook's own finder was on ``sys.meta_path``."""
    install()
    return _FINDER.find_spec(fullname, path, target)


def patch_loaded() -> int:
    """Replace the original ``create_compile_cache`` in every loaded libneuronxla
    module; returns how many bindings were replaced now."""
    cache_module = sys.modules.get(f"{PACKAGE}.neuron_cc_cache")
    original = getattr(cache_module, _ATTRIBUTE, None) if cache_module else None
    if original is None or getattr(original, _PATCHED_MARK, False):
        # Not loaded yet, or already patched there: look for any unpatched binding.
        original = _find_original()
        if original is None:
            return 0
    replacement = _replacement(original)
    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or (name != PACKAGE and not name.startswith(PACKAGE + ".")):
            continue
        if getattr(module, _ATTRIBUTE, None) is original:
            setattr(module, _ATTRIBUTE, replacement)
            count += 1
    return count


_replacements: dict[int, Any] = {}


def _find_original() -> Any:
    for name, module in list(sys.modules.items()):
        if module is None or (name != PACKAGE and not name.startswith(PACKAGE + ".")):
            continue
        value = getattr(module, _ATTRIBUTE, None)
        if value is not None and not getattr(value, _PATCHED_MARK, False):
            return value
    return None


def _replacement(original: Any) -> Any:
    existing = _replacements.get(id(original))
    if existing is not None:
        return existing

    def create_compile_cache(cache_url: Any, *args: Any, **kwargs: Any) -> Any:
        # The settings as they are now: a script may have set them after start-up,
        # when the .pth line checked them.
        warn_typos_once(os.environ)
        url = str(getattr(cache_url, "url", ""))
        if not _served_by_neffcache(url):
            return original(cache_url, *args, **kwargs)
        config = _config_for(url)
        if config is None:
            # A neffcache URL we cannot use (malformed, or NEFFCACHE_DISABLE) must not
            # become a directory named "neffcache+http:": L1 serves, as a stock cache.
            return original(_local_url(_usable_l1(_configured_l1())), *args, **kwargs)
        try:
            configured, config = config, _writable_l1(config)
            stock = original(_local_url(config.local_dir), *args, **kwargs)
            cls = _proxy_class(stock)
            _flush_at_worker_exit()
            staged = config.local_dir != configured.local_dir
            return cls(stock, config, url, lower=configured.local_dir if staged else None)
        except Exception:
            from neffcache.client.stats import STATS
            from neffcache.protocol.counters import ClientCounter

            STATS.count(ClientCounter.HOOK_ERRORS)
            log.exception("neffcache: cannot set up the cache; using the local directory")
            return original(_local_url(config.local_dir), *args, **kwargs)

    setattr(create_compile_cache, _PATCHED_MARK, True)
    create_compile_cache.__wrapped__ = original  # type: ignore[attr-defined]
    _replacements[id(original)] = create_compile_cache
    return create_compile_cache


def _served_by_neffcache(url: str) -> bool:
    """A neffcache URL (anywhere in ``url``: an SDK may have made it absolute); L1's own
    directory while neffcache is configured (``neuron_parallel_compile`` hands the pool
    the path its trial run logged,
    docs/neuron-sdk.md#neuron_parallel_compiles-environment); or a location of the SDK's
    own settings that ``NEFFCACHE_URL`` overrides."""
    from neffcache.client.config import SCHEME_PREFIX, location, overridden, wants_neffcache

    if SCHEME_PREFIX in url:
        return True
    if url and wants_neffcache(os.environ) and location(url) == location(_configured_l1()):
        return True
    return overridden(url, os.environ)


def _config_for(url: str) -> Any:
    """The configuration for a cache the SDK asks for at ``url``, from the environment
    as it is now; when that names no neffcache URL, from ``url`` itself, which is then
    exported as ``NEFFCACHE_URL``. None: disabled or malformed (the reason is logged).

    ``neuron_parallel_compile`` hands its pool the URL its trial run resolved when only
    the training script set it (NxD Training,
    docs/neuron-sdk.md#the-libneuronxla-path-in-practice): exported, it reaches the pool
    it forks next and the compiler shim under it, which vouches for the pool's NEFFs
    (the pool inherits ``NEURON_EXTRACT_GRAPHS_ONLY``)."""
    from neffcache.client.config import SCHEME_PREFIX, ClientConfig, ConfigError, wants_neffcache

    handed = None
    if SCHEME_PREFIX in url and not wants_neffcache(os.environ):
        handed = url[url.index(SCHEME_PREFIX) :]
    try:
        config = ClientConfig.from_env({**os.environ, "NEFFCACHE_URL": handed} if handed else None)
    except ConfigError as exc:
        from neffcache.client.stats import STATS
        from neffcache.protocol.counters import ClientCounter

        STATS.count(ClientCounter.CONFIG_ERRORS)
        log.warning("neffcache: %s; using the stock cache", exc)
        return None
    if handed and config is not None:
        os.environ["NEFFCACHE_URL"] = handed
    return config


def guard_constructors() -> int:
    """Make the SDK's cache classes build a ``neffcache+`` URL's cache on L1 (as a stock
    cache: no server) wherever they are constructed; returns how many were guarded
    now. Idempotent."""
    module = sys.modules.get(f"{PACKAGE}.neuron_cc_cache")
    base = getattr(module, "CompileCache", None)
    if module is None or not isinstance(base, type):
        return 0
    count = 0
    for value in list(vars(module).values()):
        init = vars(value).get("__init__") if isinstance(value, type) else None
        if init is None or not issubclass(value, base) or getattr(init, _PATCHED_MARK, False):
            continue
        value.__init__ = _guarded_init(init)
        count += 1
    return count


def _guarded_init(init: Any) -> Any:
    def guarded(self: Any, cache_url: Any, *args: Any, **kwargs: Any) -> None:
        init(self, _off_neffcache(cache_url), *args, **kwargs)

    setattr(guarded, _PATCHED_MARK, True)
    guarded.__wrapped__ = init  # type: ignore[attr-defined]
    guarded.__name__, guarded.__qualname__ = init.__name__, init.__qualname__
    guarded.__doc__ = init.__doc__
    return guarded


def _off_neffcache(cache_url: Any) -> Any:
    """``cache_url``, or the L1 directory's when it names a neffcache URL."""
    from neffcache.client.config import SCHEME_PREFIX

    try:
        if SCHEME_PREFIX not in str(getattr(cache_url, "url", "")):
            return cache_url
        from neffcache.client.stats import STATS
        from neffcache.protocol.counters import ClientCounter

        STATS.count(ClientCounter.STOCK_CACHES_ON_L1)
        log.info("neffcache: a stock cache was asked for %s; it is built on L1", cache_url.url)
        return _local_url(_usable_l1(_configured_l1()))
    except Exception:  # defensive: the SDK's constructor must still run
        log.exception("neffcache: cannot move a stock cache to L1")
        return cache_url


_worker_flushes: set[int] = set()  # processes whose multiprocessing exit flushes


def _flush_at_worker_exit() -> None:
    """In a multiprocessing worker (``neuron_parallel_compile``'s pool,
    docs/neuron-sdk.md#parallel-compile), have its exit wait for the background
    publishes: a worker ends in ``os._exit`` after multiprocessing's finalizers, so the
    ``atexit`` flush never runs there and the graphs it compiled last would never reach
    the server. Once per process: the finalizers are per process too (a fork starts with
    none)."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return
    if os.getpid() in _worker_flushes:
        return
    from multiprocessing.util import Finalize

    from neffcache.client.proxy import _flush_publishes

    _worker_flushes.add(os.getpid())
    Finalize(None, _flush_publishes, exitpriority=10)


def _configured_l1() -> str:
    from neffcache.client.config import DEFAULT_LOCAL_DIR

    return os.environ.get("NEFFCACHE_LOCAL_DIR") or DEFAULT_LOCAL_DIR


_l1_dirs: dict[str, str] = {}  # configured L1 -> the directory used, once per process


def _writable_l1(config: Any) -> Any:
    """``config``, with its L1 replaced as :func:`_usable_l1` says (a staging directory
    is the process's own: no size limit, writable)."""
    chosen = _usable_l1(config.local_dir)
    if chosen == config.local_dir:
        return config
    return config._replace(local_dir=chosen, local_max_size=0, local_read_only=False)


def _usable_l1(local_dir: str) -> str:
    """``local_dir``, or this process's staging directory when L1 is read-only
    (``NEFFCACHE_LOCAL_READ_ONLY``, or a directory it cannot write): the SDK's
    filesystem cache takes a lock file even to read (docs/neuron-sdk.md#cache-wide-lock)
    and would fail the job, so the SDK's cache works there while the proxy serves L1's
    own entries (``lower``). Decided once per process: the SDK asks for a cache per
    graph, and every graph of a run must find the ones before it in the same
    directory."""
    chosen = _l1_dirs.get(local_dir)
    if chosen is None:
        chosen = _l1_dirs[local_dir] = _probe_l1(local_dir)
    return chosen


def _probe_l1(local_dir: str) -> str:
    from neffcache.client.config import local_read_only
    from neffcache.client.local import SDK_CACHE_VARIABLE, l1_read_only, staging_dir

    if not l1_read_only(local_dir, local_read_only(os.environ)):
        return local_dir
    from neffcache.client.stats import STATS
    from neffcache.protocol.counters import ClientCounter

    STATS.count(ClientCounter.L1_UNWRITABLE)
    cache = staging_dir() / "cache"
    cache.mkdir(exist_ok=True)
    staged = str(cache)
    os.environ[SDK_CACHE_VARIABLE] = staged  # for the shim the SDK runs
    log.warning(
        "neffcache: L1 %s is read-only: its entries are served as they are, and the SDK's "
        "cache works in %s until this process exits",
        local_dir,
        staged,
    )
    return staged


def _local_url(local_dir: str | None) -> Any:
    from neffcache.client.config import DEFAULT_LOCAL_DIR

    module = sys.modules[f"{PACKAGE}.neuron_cc_cache"]
    return module.CacheUrl(local_dir or DEFAULT_LOCAL_DIR, url_type="fs")


_proxy_classes: dict[type, type] = {}


def _proxy_class(stock: Any) -> type:
    from neffcache.client.proxy import make_proxy_class

    module = sys.modules[f"{PACKAGE}.neuron_cc_cache"]
    base = getattr(module, "CompileCache", object)
    cls = _proxy_classes.get(base)
    if cls is None:
        cls = _proxy_classes[base] = make_proxy_class(base)
    return cls
