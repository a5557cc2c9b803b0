"""Interpreters and PATH: the shim first, the real compiler behind it and its version,
the Python behind each tool with neffcache loading there, and the shim's hit daemon
(daemon_checks)."""

from __future__ import annotations

import os
from typing import Any

from neffcache.client.doctor import daemon_checks, words
from neffcache.client.doctor.context import COMPILER, SDK_TOOLS, Context, Tool
from neffcache.client.doctor.model import Check, Result, failed, passed, warned


def shim(ctx: Context) -> Result:
    compilers = ctx.compilers_on_path()
    shims = ctx.shims_on_path()
    data = {"on_path": compilers, "shims": shims}
    if not compilers:
        return failed(
            "no neuronx-cc on PATH: TorchNeuron, vLLM Neuron and torch_neuronx.trace run it "
            "by name, and nothing of theirs is cached",
            f"{words.SHIM_FIRST}, with the Neuron compiler installed behind it",
            **data,
        )
    if compilers[0] in shims:
        return passed(
            f"the first neuronx-cc on PATH is the neffcache shim ({compilers[0]})", **data
        )
    if shims:
        return failed(
            f"the first neuronx-cc on PATH is {compilers[0]}; the shim ({shims[0]}) comes "
            "after it, so compiles run by name skip the cache",
            f'export PATH="{os.path.dirname(shims[0])}:$PATH"',
            **data,
        )
    return failed(
        f"no neffcache shim on PATH: {compilers[0]} is the compiler itself",
        words.SHIM_FIRST,
        **data,
    )


def compiler(ctx: Context) -> Result:
    real = ctx.real_compiler()
    configured = ctx.environ.get("NEFFCACHE_REAL_COMPILER")
    fix = "install neuronx-cc on PATH after the shim, or set NEFFCACHE_REAL_COMPILER to its path"
    if real is None:
        return failed("no real neuronx-cc behind the shim: every compile fails (exit 127)", fix)
    if not (os.path.isfile(real) and os.access(real, os.X_OK)):
        return failed(f"the real compiler {real} is not an executable file", fix, path=real)
    how = "NEFFCACHE_REAL_COMPILER" if configured and real == configured else "PATH"
    return passed(f"the real compiler is {real} (from {how})", path=real)


def version(ctx: Context) -> Result:
    found, why = ctx.compiler_version()
    if found is None:
        return failed(
            f"neuronx-cc --version gave no version: {why}",
            "the shim caches nothing without the compiler's version: run "
            "`neuronx-cc --version` and see why it fails",
        )
    sdk = _sdk_versions(ctx)
    data: dict[str, Any] = {"compiler": found, "neuronxcc": sdk}
    other = {who: v for who, v in sdk.items() if v != found}
    if other:
        said = "; ".join(
            f"neuronxcc.__version__ is {v} in the Python of {who}" for who, v in other.items()
        )
        return warned(
            f"neuronx-cc --version says {found}; {said}",
            "libneuronxla names entries after its Python's neuronxcc and the shim keys by the "
            "compiler it runs: install one neuronx-cc, or put the training environment's "
            "bin first on PATH after the shim",
            **data,
        )
    agree = (
        " and neuronxcc.__version__"
        if sdk
        else " (neuronxcc does not import in the training Python)"
    )
    return passed(f"{found} from neuronx-cc --version{agree}", **data)


def _sdk_versions(ctx: Context) -> dict[str, str]:
    """``neuronxcc.__version__`` in each training Python that has one."""
    return {who: str(f["neuronxcc"]) for who, f in ctx.training_pythons() if f.get("neuronxcc")}


def interpreters(ctx: Context) -> Result:
    own = ctx.probe(ctx.own_command())
    reference = own.get("prefix")
    lines: list[str] = []
    apart: list[str] = []
    for tool in ctx.tools():
        where, prefix = _where(ctx, tool)
        lines.append(f"{tool.name} ({tool.path}): {where}")
        if prefix is not None and prefix != reference:
            apart.append(f"{tool.name} runs under {prefix}")
    missing = [name for name in (COMPILER, *SDK_TOOLS) if name not in {t.name for t in ctx.tools()}]
    if missing:
        lines.append(f"not on PATH: {words.listed(missing)}")
    data = {"reference": reference, "tools": lines}
    if apart:
        return warned(
            f"{'; '.join(apart)}, not this Python ({reference})",
            "run the tools of one environment: put its bin directory first on PATH (after "
            "the shim), or install neffcache and the SDK into the one each tool runs",
            details=lines,
            **data,
        )
    return passed(f"every Python tool runs under {reference}", details=lines, **data)


def _where(ctx: Context, tool: Tool) -> tuple[str, str | None]:
    if tool.command is None:
        return "not a Python script", None
    facts = ctx.probe(tool.command)
    if "error" in facts:
        return f"its Python did not answer: {facts['error']}", None
    return f"{facts.get('executable')} (prefix {facts.get('prefix')})", str(facts.get("prefix"))


def neffcache_loads(ctx: Context) -> Result:
    """neffcache imports in the shim's Python, and in every Python libneuronxla runs in
    neffcache imports and its ``.pth`` line ran (which arms the hook)."""
    pythons = [
        (t.name, ctx.probe(t.command)) for t in ctx.tools() if t.name == "the shim" and t.command
    ]
    pythons += ctx.training_pythons()
    lines = [f"{who}: {_loads(facts)}" for who, facts in pythons]
    problems = [p for who, facts in pythons if (p := _problem(who, facts))]
    if problems:
        return failed(problems[0][0], problems[0][1], details=lines + [p[0] for p in problems[1:]])
    return passed("neffcache loads in every Python that needs it", details=lines)


def _loads(facts: dict[str, Any]) -> str:
    if "error" in facts:
        return str(facts["error"])
    where = facts.get("prefix")
    if not facts.get("neffcache"):
        return f"{where}: neffcache does not import ({facts.get('neffcache_error')})"
    pth = "its .pth line ran" if facts.get("pth_loaded") else "its .pth line did not run"
    return f"{where}: neffcache from {facts['neffcache']}, {pth}"


def _problem(who: str, facts: dict[str, Any]) -> tuple[str, str] | None:
    prefix = facts.get("prefix", "?")
    if "error" in facts:
        return f"the Python of {who} did not answer: {facts['error']}", "run it by hand to see why"
    if not facts.get("neffcache"):
        if who == "the shim":
            return (
                f"the shim's Python ({prefix}) cannot import neffcache: every compile runs "
                "uncached",
                "make the shim again from the environment that has neffcache: "
                "neffcache shim-dir --dir DIR",
            )
        return (
            f"the Python of {who} ({prefix}) cannot import neffcache: the hook never arms there",
            f"pip install neffcache into {prefix}",
        )
    # The shim needs only the import; a Python running libneuronxla needs the hook too.
    if who != "the shim" and facts.get("libneuronxla_found") and not facts.get("pth_loaded"):
        return (
            f"neffcache imports in the Python of {who} ({prefix}), but its .pth line did not "
            "run there (installed from a path on PYTHONPATH?): the hook never arms",
            f"pip install neffcache into {prefix}, which installs neffcache_hook.pth",
        )
    return None


CHECKS = (
    Check("paths.shim", "the shim first on PATH", shim),
    Check("paths.compiler", "the real compiler", compiler),
    Check("paths.version", "compiler version", version),
    Check("paths.interpreters", "one Python behind the tools", interpreters),
    Check("paths.neffcache", "neffcache loads where needed", neffcache_loads),
    Check("paths.daemon", "the shim's hit daemon", daemon_checks.daemon),
)
