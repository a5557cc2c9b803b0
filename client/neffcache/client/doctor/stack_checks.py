"""Stacks: which Neuron stacks the training Pythons have, which interception point
serves each (docs/client.md's table), whether that point works here, and the known
traps of each.

Versions come from the distributions' metadata, never from importing the stacks
(torch alone takes seconds, and the point is what is installed, not what runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple, TypeGuard

from neffcache.client.doctor import words
from neffcache.client.doctor.context import Context
from neffcache.client.doctor.model import Check, Result, failed, passed, skipped, warned
from neffcache.client.doctor.mounts import filesystem_type, is_network

# PyTorch 2.9 is the last with PyTorch/XLA; TorchNeuron needs PyTorch >= 2.10
# (docs/neuron-sdk.md#timeline).
TORCHNEURON_TORCH = (2, 10)
TORCHNEURON_CACHE = "TORCH_NEURONX_NEFF_CACHE_DIR"
TORCHNEURON_CACHE_DEFAULT = "/tmp/neff_cache"
TORCHNEURON_CACHE_OFF = "TORCH_NEURONX_NEFF_DISABLE_CACHE"
VLLM_REMOTE_CACHE = "NEURON_LIBTORCH_REMOTE_CACHE"


class Points(NamedTuple):
    """Whether each interception point works here, and why not."""

    shim: str | None  # None: works; else what is wrong
    hook: str | None
    url: str | None


def points(ctx: Context) -> Points:
    compilers, shims = ctx.compilers_on_path(), ctx.shims_on_path()
    shim = None
    if not compilers or compilers[0] not in shims:
        shim = "the shim is not first on PATH (see paths.shim)"
    elif ctx.real_compiler() is None:
        shim = "no real compiler behind the shim (see paths.compiler)"
    hook = None
    for who, facts in ctx.training_pythons():
        state = (facts.get("hook") or {}) if facts.get("libneuronxla_found") else None
        if state is not None and not state.get("armed"):
            hook = f"the hook is not armed in the Python of {who} (see hook.armed)"
    config = ctx.config()
    usable = config.config is not None and not config.disabled
    return Points(shim, hook, None if usable else "no usable neffcache URL (see config.url)")


def version_of(ctx: Context, *names: str) -> tuple[str, str] | None:
    """(name, version) of the first of the distributions ``names`` installed."""
    dists = ctx.dists()
    for name in names:
        if dists.get(name):
            return name, str(dists[name])
    return None


def release(version: str) -> tuple[int, ...]:
    """A version's major and minor numbers (``2.10.0+cpu`` -> ``(2, 10)``)."""
    parts = []
    for part in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _url_in_flags(ctx: Context) -> bool:
    return "--cache_dir" in ctx.environ.get("NEURON_CC_FLAGS", "")


def _served(
    what: str, needs: list[str | None], traps: list[tuple[str, str]], **data: str
) -> Result:
    """PASS, FAIL when a needed point does not work, WARN for a trap."""
    broken = [n for n in needs if n]
    if broken:
        return failed(f"{what}; {broken[0]}", _fix_for(broken[0]), details=broken[1:], **data)
    if traps:
        lines = [f"{t}; fix: {f}" for t, f in traps]
        return warned(f"{what}; {traps[0][0]}", traps[0][1], details=lines[1:], **data)
    return passed(what, **data)


def _fix_for(problem: str) -> str:
    if "shim" in problem or "compiler" in problem:
        return words.SHIM_FIRST
    if "hook" in problem:
        return "pip install neffcache into that Python (see hook.armed)"
    return words.SET_URL


def torch_neuronx(ctx: Context) -> Result:
    found = version_of(ctx, "torch-neuronx")
    if found is None:
        return skipped("torch-neuronx is not installed")
    torch = ctx.dists().get("torch")
    data = {"torch_neuronx": found[1], "torch": str(torch)}
    if is_torchneuron(torch):
        return _torchneuron(ctx, found[1], torch, data)
    p = points(ctx)
    what = f"torch-neuronx {found[1]} (torch-xla era, torch {torch or '?'}): the hook and the shim"
    return _libneuronxla_path(ctx, what, p, data)


def is_torchneuron(torch: str | None) -> TypeGuard[str]:
    """Whether torch-neuronx with this torch is TorchNeuron (else the torch-xla era)."""
    return bool(torch) and release(str(torch)) >= TORCHNEURON_TORCH


def _torchneuron(ctx: Context, version: str, torch: str, data: dict[str, str]) -> Result:
    p = points(ctx)
    what = f"torch-neuronx {version} (TorchNeuron, torch {torch}): served by the shim"
    traps = _neuron_cc_flags_trap(ctx, "TorchNeuron") + _neff_cache_trap(ctx)
    return _served(what, [p.url, p.shim], traps, **data)


def _neff_cache_trap(ctx: Context) -> list[tuple[str, str]]:
    """TorchNeuron's own cache answers before the shim and its key leaves the compiler
    version out (docs/neuron-sdk.md#torchneurons-neff-cache): harmless per host and
    toolchain (a container's /tmp), wrong when shared or kept across an upgrade."""
    if ctx.environ.get(TORCHNEURON_CACHE_OFF, "").strip() not in ("", "0"):
        return []
    cache = os.path.abspath(ctx.environ.get(TORCHNEURON_CACHE) or TORCHNEURON_CACHE_DEFAULT)
    compiler, _ = ctx.compiler_version()
    fs = filesystem_type(cache)
    if (compiler and compiler in cache) or (cache.startswith("/tmp/") and not is_network(fs)):
        return []
    return [
        (
            f"TorchNeuron's own NEFF cache {cache} ({fs or 'filesystem unknown'}) is not keyed "
            "by the compiler version: shared across hosts or kept across a compiler upgrade, "
            "it serves NEFFs of another compiler",
            f"keep {TORCHNEURON_CACHE} per host, or with the compiler version in its path (the "
            f"default {TORCHNEURON_CACHE_DEFAULT} is per container), or set "
            f"{TORCHNEURON_CACHE_OFF}=1",
        )
    ]


def _neuron_cc_flags_trap(ctx: Context, stack: str) -> list[tuple[str, str]]:
    if not _url_in_flags(ctx):
        return []
    return [
        (
            f"--cache_dir is in NEURON_CC_FLAGS, whose words {stack} appends to its compiler "
            "command: an option only libneuronxla takes (the shim removes it)",
            "move the URL to NEFFCACHE_URL and remove --cache_dir from NEURON_CC_FLAGS",
        )
    ]


def _libneuronxla_path(ctx: Context, what: str, p: Points, data: dict[str, str]) -> Result:
    """Served by the hook and the shim: neither working is a FAIL, one a WARN."""
    traps: list[tuple[str, str]] = []
    if "--no_cache" in ctx.environ.get("NEURON_CC_FLAGS", ""):
        traps.append(
            (
                "--no_cache in NEURON_CC_FLAGS turns libneuronxla's persistent cache off: the "
                "hook is never asked (the shim still serves)",
                "remove --no_cache from NEURON_CC_FLAGS",
            )
        )
    if p.hook and p.shim:
        return failed(f"{what}; {p.hook}, and {p.shim}", words.SHIM_FIRST, **data)
    if p.hook or p.shim:
        lack = p.hook or p.shim or ""
        traps.insert(0, (f"{lack}: the other point serves it, less well", _fix_for(lack)))
    return _served(what, [p.url], traps, **data)


def libneuronxla(ctx: Context) -> Result:
    found = version_of(ctx, "libneuronxla")
    pythons = [who for who, f in ctx.training_pythons() if f.get("libneuronxla_found")]
    if found is None and not pythons:
        return skipped("libneuronxla is not installed")
    version = found[1] if found else "(no metadata)"
    nxd = version_of(ctx, "neuronx-distributed-inference", "neuronx-distributed")
    with_nxd = f", {nxd[0]} {nxd[1]}" if nxd else ""
    what = f"libneuronxla {version}{with_nxd}: the hook and the shim"
    return _libneuronxla_path(ctx, what, points(ctx), {"libneuronxla": version})


def vllm_neuron(ctx: Context) -> Result:
    found = version_of(ctx, "vllm-neuron", "libtorch-neuronx-lite")
    if found is None:
        return skipped("vllm-neuron and libtorch-neuronx-lite are not installed")
    p = points(ctx)
    traps = _neuron_cc_flags_trap(ctx, "vLLM Neuron")
    if ctx.environ.get(VLLM_REMOTE_CACHE):
        traps.append(
            (
                f"{VLLM_REMOTE_CACHE} is set: vLLM Neuron's own shared tier answers first, and "
                "its key leaves out NEURON_CC_FLAGS and the LNC",
                f"unset {VLLM_REMOTE_CACHE} when neffcache serves the fleet",
            )
        )
    what = f"{found[0]} {found[1]}: served by the shim"
    return _served(what, [p.url, p.shim], traps, **{found[0]: found[1]})


def jax_neuronx(ctx: Context) -> Result:
    found = version_of(ctx, "jax-neuronx")
    if found is None:
        return skipped("jax-neuronx is not installed")
    p = points(ctx)
    what = (
        f"jax-neuronx {found[1]}: served by the shim when the compiler runs by name (JAX's "
        "own compilation cache answers first)"
    )
    return _served(what, [p.url, p.shim], [], jax_neuronx=found[1])


def optimum_neuron(ctx: Context) -> Result:
    found = version_of(ctx, "optimum-neuron")
    if found is None:
        return skipped("optimum-neuron is not installed")
    p = points(ctx)
    traps: list[tuple[str, str]] = []
    source = ctx.config().source
    if source is not None and source != "NEFFCACHE_URL":
        traps.append(
            (
                f"the URL is in {source}: optimum-neuron's sessions build their cache from the "
                "SDK's URL themselves, and the hook can only move that cache to L1 (no server)",
                "set the URL in NEFFCACHE_URL, and keep the shim first on PATH (it serves what "
                "the sessions compile)",
            )
        )
    what = f"optimum-neuron {found[1]}: the hook and the shim"
    return _served(what, [p.url, p.shim], traps, optimum_neuron=found[1])


def nki(ctx: Context) -> Result:
    found = version_of(ctx, "nki")
    if found is None:
        return skipped("nki is not installed")
    return passed(
        f"nki {found[1]}: in every key (it lowers kernels at compile time); nothing to set",
        nki=found[1],
    )


_STACKS: tuple[tuple[str, str, Callable[[Context], Result]], ...] = (
    ("torch-neuronx", "torch-neuronx", torch_neuronx),
    ("libneuronxla", "libneuronxla, NxD", libneuronxla),
    ("vllm-neuron", "vLLM Neuron", vllm_neuron),
    ("jax-neuronx", "JAX", jax_neuronx),
    ("optimum-neuron", "optimum-neuron", optimum_neuron),
    ("nki", "NKI", nki),
)
CHECKS = tuple(Check(f"stacks.{name}", title, run) for name, title, run in _STACKS)
