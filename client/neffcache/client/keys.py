"""The keys of one compile, from what the client can see: the HLO bytes, the flags,
the target, the compiler version and the compile-affecting environment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from neffcache.keying import CacheKey, CompileContext, KeyInputs, compile_env, compute_key
from neffcache.keying import direct_key as _direct_key

# The compiler version libneuronxla names its entries with (its interpreter's
# neuronxcc), set by the hook for the compiler shim the SDK then runs (session.py).
SDK_VERSION_VARIABLE = "NEFFCACHE_SDK_COMPILER_VERSION"


def context(
    compiler_version: str, target: str, flags: Sequence[str], environ: Mapping[str, str]
) -> CompileContext:
    return CompileContext.create(
        compiler_version=compiler_version,
        target=target,
        flags=list(flags),
        env=compile_env(environ),
        frameworks=framework_versions(),
    )


_frameworks: dict[str, str] | None = None


def framework_versions() -> dict[str, str]:
    """The installed version of each package in keying's FRAMEWORK_ALLOWLIST (NKI,
    which lowers kernels at compile time), found as the import system would find it:
    the first ``sys.path`` entry holding the package, and its ``.dist-info`` there.
    Read from the directory's name, never by importing (NKI's import takes seconds,
    ``importlib.metadata``'s milliseconds a shim hit does not have); once per process.
    Both interception points key with it, so their keys agree."""
    global _frameworks
    if _frameworks is None:
        from neffcache.keying import FRAMEWORK_ALLOWLIST

        versions = {name: installed_version(name) for name in FRAMEWORK_ALLOWLIST}
        _frameworks = {name: version for name, version in versions.items() if version}
    return dict(_frameworks)


def forget_frameworks() -> None:
    """Read the installed frameworks again at the next ``framework_versions`` (the hit
    daemon, before each request: a package upgraded meanwhile changes the keys)."""
    global _frameworks
    _frameworks = None


def installed_version(name: str, path: Sequence[str] | None = None) -> str | None:
    """The version of distribution ``name`` whose package ``name`` is importable from
    ``path`` (``sys.path``), or None when it is not installed."""
    import os
    import sys

    prefix = f"{name}-"
    for directory in sys.path if path is None else path:
        if not os.path.isdir(os.path.join(directory or ".", name)):
            continue  # one stat per entry: a listing only where the package is
        try:
            entries = os.listdir(directory or ".")
        except OSError:
            continue
        for entry in sorted(entries):
            if entry.startswith(prefix) and entry.endswith(".dist-info"):
                return entry[len(prefix) : -len(".dist-info")] or None
        return None  # importable from here, but with no metadata: unknown, not older
    return None


def direct_key(module: bytes, ctx: CompileContext) -> CacheKey:
    """The raw-bytes key: cheap (no parsing), hits a re-run of the very same trace."""
    return _direct_key(module, ctx)


def canonical_key(module: bytes, ctx: CompileContext) -> CacheKey:
    """The key of the canonical fingerprint: hits any trace of the same program."""
    from neffcache.keying import fingerprint_hlo  # protobuf: loaded only when needed

    return compute_key(KeyInputs(fingerprint_hlo(module), ctx))
