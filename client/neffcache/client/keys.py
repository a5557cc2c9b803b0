"""The keys of one compile, from what the client can see: the HLO bytes, the flags,
the target, the compiler version and the compile-affecting environment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from neffcache.keying import CacheKey, CompileContext, KeyInputs, compile_env, compute_key
from neffcache.keying import direct_key as _direct_key


def context(
    compiler_version: str, target: str, flags: Sequence[str], environ: Mapping[str, str]
) -> CompileContext:
    return CompileContext.create(
        compiler_version=compiler_version,
        target=target,
        flags=list(flags),
        env=compile_env(environ),
    )


def direct_key(module: bytes, ctx: CompileContext) -> CacheKey:
    """The raw-bytes key: cheap (no parsing), hits a re-run of the very same trace."""
    return _direct_key(module, ctx)


def canonical_key(module: bytes, ctx: CompileContext) -> CacheKey:
    """The key of the canonical fingerprint: hits any trace of the same program."""
    from neffcache.keying import fingerprint_hlo  # protobuf: loaded only when needed

    return compute_key(KeyInputs(fingerprint_hlo(module), ctx))
