"""Hook: armed when libneuronxla loads, ``create_compile_cache`` replaced in every
module that binds it, the SDK handed neffcache's cache, and the SDK's real
``CompileCache`` surface against the methods the proxy serves.

The last is how the first real host tells us where the stand-ins (written from public
callers, docs/neuron-sdk.md#libneuronxla-cache-api) are wrong: a method of the SDK's
base class that the proxy neither overrides nor delegates runs the SDK's own code on the
proxy, and never asks the server.
"""

from __future__ import annotations

from typing import Any

from neffcache.client.doctor import words
from neffcache.client.doctor.context import Context
from neffcache.client.doctor.model import (
    Check,
    Result,
    Status,
    failed,
    passed,
    skipped,
    warned,
)

_SEND = "attach `neffcache doctor --report FILE` to an issue"


def _hooked(ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    """(who, the hook's facts) for each training Python where libneuronxla imports."""
    return [
        (who, facts.get("hook") or {"import_error": f"the probe failed: {facts.get('error')}"})
        for who, facts in ctx.training_pythons()
        if facts.get("libneuronxla_found") or "error" in facts
    ]


def armed(ctx: Context) -> Result:
    hooked = _hooked(ctx)
    if not hooked:
        return skipped(
            "libneuronxla is not installed: nothing for the hook to arm (TorchNeuron and vLLM "
            "Neuron images are served by the shim alone)"
        )
    lines: list[str] = []
    for who, facts in hooked:
        if "import_error" in facts:
            return failed(
                f"libneuronxla does not import in the Python of {who}: {facts['import_error']}",
                "import libneuronxla by hand there to see why",
            )
        lines.append(f"{who}: {'armed' if facts.get('armed') else 'not armed'}")
        if not facts.get("armed"):
            return failed(
                f"the hook is not armed in the Python of {who} after libneuronxla loaded: "
                "the SDK's persistent cache never reaches the server",
                "see paths.neffcache: neffcache and its neffcache_hook.pth must be installed "
                "(pip install neffcache) in that Python",
                details=lines,
            )
    return passed(f"armed when libneuronxla loads, in {len(hooked)} Python(s)", details=lines)


def patched(ctx: Context) -> Result:
    hooked = [(w, f) for w, f in _hooked(ctx) if f.get("armed")]
    if not hooked:
        return skipped("the hook is not armed anywhere (see hook.armed)")
    lines: list[str] = []
    asked: list[Result] = []
    for who, facts in hooked:
        bindings: dict[str, bool] = facts.get("bindings") or {}
        left = sorted(name for name, done in bindings.items() if not done)
        lines.append(f"{who}: {len(bindings) - len(left)} of {len(bindings)} bindings replaced")
        if left or not bindings:
            return failed(
                f"create_compile_cache is not replaced in {words.listed(left, 'any module')} "
                f"(Python of {who})",
                f"{_SEND}: the SDK binds it where neffcache does not look",
                details=lines,
                bindings=bindings,
            )
        answer = _served(who, facts.get("cache") or {})
        if isinstance(answer, Result):
            asked.append(answer)
        else:
            lines.append(answer)
    if asked:  # a FAIL before a WARN
        worst = min(asked, key=lambda r: r.status is not Status.FAIL)
        return Result(worst.status, worst.evidence, worst.fix, (*lines, *worst.details), worst.data)
    return passed("create_compile_cache replaced wherever libneuronxla binds it", details=lines)


def _served(who: str, cache: dict[str, Any]) -> Result | str:
    """What the SDK got when it asked for its cache: a detail line when neffcache's, a
    FAIL when another, a WARN when the asking itself failed (our idea of how the SDK is
    asked, ``CacheUrl.get_cache_url()``, is what is wrong then, not the hook)."""
    if "skipped" in cache:
        return f"{who}: {cache['skipped']}"
    if "error" in cache:
        return warned(
            f"asking the SDK for its cache as torch-xla does failed (Python of {who}): "
            f"{cache['error']}",
            f"{_SEND}: the SDK is asked differently from what neffcache assumes",
            cache=cache,
        )
    if cache.get("type") != "NeffcacheCompileCache":
        return failed(
            f"asked for its cache at {words.url(cache.get('sdk_url'))}, the SDK got a "
            f"{cache.get('module')}.{cache.get('type')}, not neffcache's (Python of {who})",
            f"{_SEND}: the SDK resolves or builds its cache differently from what neffcache "
            "assumes",
            cache=cache,
        )
    return (
        f"{who}: get_cache_url() gave {words.url(cache.get('sdk_url'))}; the SDK got "
        f"neffcache's cache on {cache.get('cache_path')}"
    )


def surface(ctx: Context) -> Result:
    hooked = [(w, f) for w, f in _hooked(ctx) if "import_error" not in f]
    if not hooked:
        return skipped("libneuronxla is not installed")
    who, facts = hooked[0]
    setup = str(facts.get("setup_args", "?"))
    for key in ("surface_error", "proxy_error"):
        if key in facts:
            return failed(
                f"{facts[key]} (Python of {who})", f"{_SEND}: neffcache cannot build its cache"
            )
    unserved: list[str] = facts.get("unserved") or []
    details = _surface_lines(facts, setup)
    data = {
        key: facts.get(key) for key in ("base", "unserved", "inherited", "absent", "subclasses")
    }
    data.update(setup_args=setup, libneuronxla=facts.get("version"))
    if unserved:
        return warned(
            f"CompileCache methods the proxy neither overrides nor delegates: "
            f"{words.listed(unserved)}; setup_args() returns {setup}",
            f"{_SEND}: these run the SDK's own code on neffcache's cache and never ask the server",
            details=details,
            **data,
        )
    if not setup.startswith("tuple(") or "lacks" in setup:
        return warned(
            f"setup_args() returns {setup}, not the 3-tuple public callers unpack "
            "(docs/neuron-sdk.md#setup_args)",
            f"{_SEND}: what neffcache assumes of the SDK differs here",
            details=details,
            **data,
        )
    return passed(
        f"every CompileCache method is overridden or delegated; setup_args() returns {setup}",
        details=details,
        **data,
    )


def _surface_lines(facts: dict[str, Any], setup: str) -> list[str]:
    base: dict[str, str] = facts.get("base") or {}
    inherited, absent = facts.get("inherited") or [], facts.get("absent") or []
    lines = [
        f"setup_args() returns {setup}",
        f"CompileCache: {len(base)} public members; the proxy overrides or delegates "
        f"{len(facts.get('served') or [])}",
        f"inherited as they are (not instance methods): {words.listed(inherited)}",
        f"served by the proxy, absent from this SDK: {words.listed(absent)}",
    ]
    return lines + [
        f"{name} adds: {words.listed(extra)} (delegated to the L1 cache)"
        for name, extra in (facts.get("subclasses") or {}).items()
    ]


CHECKS = (
    Check("hook.armed", "armed", armed),
    Check("hook.patched", "create_compile_cache replaced", patched),
    Check("hook.surface", "CompileCache surface", surface),
)
