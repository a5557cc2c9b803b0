"""The persistent-cache hook: when ``libneuronxla`` is imported, its
``create_compile_cache`` is replaced wherever libneuronxla binds it (the way
optimum-neuron patches it, facts §9), by one that returns a server-backed cache for a
``neffcache+`` URL, so the SDK never treats that URL as a directory.

``install()`` puts a finder on ``sys.meta_path`` that lets every ``libneuronxla``
module load normally and then patches it: modules that libneuronxla imports later,
with their own ``from ... import create_compile_cache``, are patched as they load.
Nothing else is touched, and nothing happens without a ``neffcache+`` URL.

Every Python process of a configured image imports this module at start-up (through
the ``.pth`` file), so it imports almost nothing: the finder and loader are duck-typed
(``importlib.abc`` alone costs milliseconds), and the rest loads when libneuronxla does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from neffcache.client._log import log

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

        from neffcache.client.config import ClientConfig, ConfigError
        from neffcache.client.stats import STATS

        try:
            config = ClientConfig.from_env()
        except ConfigError as exc:
            STATS.count("config_errors")
            log.warning("neffcache: %s; using the stock cache", exc)
            config = None
        url = str(getattr(cache_url, "url", ""))
        if not _served_by_neffcache(url):
            return original(cache_url, *args, **kwargs)
        if config is None:
            # A neffcache URL we cannot use (malformed, or NEFFCACHE_DISABLE) must not
            # become a directory named "neffcache+http:": L1 serves, as a stock cache.
            return original(_local_url(os.environ.get("NEFFCACHE_LOCAL_DIR")), *args, **kwargs)
        try:
            config = _writable_l1(config)
            stock = original(_local_url(config.local_dir), *args, **kwargs)
            cls = _proxy_class(stock)
            return cls(stock, config, url)
        except Exception:
            STATS.count("hook_errors")
            log.exception("neffcache: cannot set up the cache; using the local directory")
            return original(_local_url(config.local_dir), *args, **kwargs)

    setattr(create_compile_cache, _PATCHED_MARK, True)
    create_compile_cache.__wrapped__ = original  # type: ignore[attr-defined]
    _replacements[id(original)] = create_compile_cache
    return create_compile_cache


def _served_by_neffcache(url: str) -> bool:
    """A neffcache URL, or, when ``NEFFCACHE_URL`` overrides the SDK's own URL, the
    URL the SDK resolves from its variables. A directory some code names explicitly
    (a sync tool's ``CacheUrl("/path")``) stays that directory."""
    from neffcache.client.config import DEFAULT_LOCAL_DIR, SCHEME_PREFIX, cache_url

    if url.startswith(SCHEME_PREFIX):
        return True
    if not os.environ.get("NEFFCACHE_URL"):
        return False
    environ = {k: v for k, v in os.environ.items() if k != "NEFFCACHE_URL"}
    sdk_url = cache_url(environ) or DEFAULT_LOCAL_DIR
    return url in (sdk_url, sdk_url.removeprefix("file://"))


_l1_dirs: dict[str, str] = {}  # configured L1 -> the directory used, once per process


def _writable_l1(config: Any) -> Any:
    """``config``, or a copy whose L1 is a private temporary directory when the
    configured one cannot be written (a read-only mount): the SDK's filesystem cache
    takes a lock file even to read (facts §6.1) and would fail the job. Decided once
    per process: the SDK asks for a cache per graph, and every graph of a run must
    find the ones before it in the same directory."""
    chosen = _l1_dirs.get(config.local_dir)
    if chosen is None:
        chosen = _l1_dirs[config.local_dir] = _probe_l1(config.local_dir)
    return config if chosen == config.local_dir else config._replace(local_dir=chosen)


def _probe_l1(local_dir: str) -> str:
    import tempfile

    try:
        os.makedirs(local_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=local_dir):
            pass
        return local_dir
    except OSError as exc:
        from neffcache.client._log import log
        from neffcache.client.stats import STATS

        STATS.count("l1_unwritable")
        private = tempfile.mkdtemp(prefix="neffcache-l1-")
        log.warning("neffcache: %s is not writable (%s); using %s", local_dir, exc, private)
        return private


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
