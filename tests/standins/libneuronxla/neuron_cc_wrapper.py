"""STAND-IN for ``libneuronxla.neuron_cc_wrapper``; this is NOT AWS's code (whose source
is not public, docs/neuron-sdk.md#provenance).

Written only from docs/neuron-sdk.md:

* #where-the-cache-sits: the call paths (``neuron_xla_compile`` as called by
  transformers-neuronx and NxD ModelBuilder; the PJRT path's target-prefixed flags);
* #cache-location: ``NEURON_CC_FLAGS`` and its wrapper-only flags (via ``libncc``);
* #hit-detection: probe order on a lookup (``model.done``, then ``model.log``);
* #flags-hash and #stock-address: the key (flags hash over
  ``['--target=<t>', *user_flags]``);
* #neuronx-cc-invocation-and-outputs: the work directory, the compiler argv (the
  neuronxcc >= 2.15 form), the log lines, the outputs copied back (``model.neff``, then
  the 0-byte ``model.done``; on failure ``model.log``),
  ``NEURON_PARALLEL_COMPILE_MAX_RETRIES``, the warning for str flags,
  ``compile_cache_entry``;
* #per-entry-compile-lock: the per-entry lock held while compiling;
* #trial-run: ``NEURON_EXTRACT_GRAPHS_ONLY`` and ``NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG``.

``create_compile_cache`` and ``CacheUrl`` are imported by name into this module and
called through this module's binding at call time, so a caller that patches
``libneuronxla.create_compile_cache`` (or ``neuron_cc_cache.create_compile_cache``) alone
does NOT reach this module: it must patch every binding, as optimum-neuron's
``patch_everywhere`` does (#libneuronxla-cache-api).

Stand-in environment variables (not real SDK variables):

* ``NEFFCACHE_STANDIN_HLO_FIRST``: the order in which the real SDK writes the HLO and
  probes ``model.done`` is not public. Unset/``0`` (default): probe first, write the HLO
  and ``compile_flags.json`` only on a miss, under the entry lock. ``1``: write
  ``model.hlo_module.pb`` and ``compile_flags.json`` into the entry on every call, BEFORE
  the ``model.done`` probe (hits included).
* ``NEFFCACHE_STANDIN_PATH_LOG``: what the trial run writes to
  ``NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG`` (not public): ``url`` (default) the
  resolved cache URL, ``cache_path`` the ``cache_path`` of the cache object
  ``create_compile_cache`` returned.
* ``NEFFCACHE_STANDIN_HASH_TARGET``: ``1`` (default) hashes ``['--target=<t>',
  *user_flags]`` (#flags-hash item 5, the PJRT path A form). ``0`` hashes the user flags
  alone, the form #flags-hash item 6 shows for transformers-neuronx (path B), whose
  calls go through ``neuron_xla_compile`` too. docs/neuron-sdk.md does not say how the
  real ``neuron_xla_compile`` tells the two apart.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import uuid
import warnings

from libneuronxla import libncc
from libneuronxla.neuron_cc_cache import (
    DONE_FILENAME,
    FLAGS_FILENAME,
    HLO_FILENAME,
    LOG_FILENAME,
    NEFF_FILENAME,
    CacheEntry,
    CacheUrl,
    CompileCache,
    create_compile_cache,
    get_compiler_version,
)

logger = logging.getLogger(__name__)

# [GUESS] Extraction returns placeholder outputs (docs/neuron-sdk.md#trial-run); these are
# the bytes.
EXTRACT_ONLY_PLACEHOLDER = b"NEFFCACHE-STANDIN-EXTRACT-ONLY-PLACEHOLDER\n"
# [GUESS] Used when an entry has no compile_flags.json to read the target from.
DEFAULT_TARGET = "trn1"

NEURONCC_WRAPPER_ENV_INFO = """\
(neffcache test stand-in; the real help text was not seen)
NEURON_CC_FLAGS: compiler flags plus the wrapper-only --cache_dir, --no_cache,
  --retry_failed_compilation, --log_level, --dump, --compile_workdir
NEURON_COMPILE_CACHE_URL: cache location when --cache_dir is not given
NEURON_EXTRACT_GRAPHS_ONLY: write HLOs into the cache without compiling
NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG: file to write the cache path to
NEURON_PARALLEL_COMPILE_MAX_RETRIES: compile retries (default 0)
"""

_program_counter = itertools.count()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def module_fingerprint(module_bytes: bytes) -> str:
    """Stand-in module key for ``cache_key=None``: a decimal 64-bit number, like the
    PJRT path's keys. The real algorithm is not public (docs/neuron-sdk.md#module_key
    and #open-questions); this one is the first 8 bytes of sha256 of the serialized
    module, big-endian."""
    return str(int.from_bytes(hashlib.sha256(module_bytes).digest()[:8], "big"))


def hashed_flags(platform_target: str, user_flags: list[str]) -> list[str]:
    """The list whose json.dumps is hashed into the key and stored as compile_flags.json."""
    if os.environ.get("NEFFCACHE_STANDIN_HASH_TARGET", "1") == "0":
        return list(user_flags)
    # [GUESS] --target is prepended even when the user flags carry their own --target.
    return [f"--target={platform_target}", *user_flags]


def _normalize_flags(compiler_flags: str | list[str] | None) -> list[str]:
    if compiler_flags is None:
        return []
    if isinstance(compiler_flags, str):
        # docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs: "SyntaxWarning: str
        # format compiler_flags is discouraged … Use list[str] instead". [GUESS] The
        # elided middle of the message.
        warnings.warn(
            "str format compiler_flags is discouraged and its support may be removed in "
            "a future release. Use list[str] instead",
            SyntaxWarning,
            stacklevel=3,
        )
        return shlex.split(compiler_flags)
    return list(compiler_flags)


def _make_work_dir(
    work_dir: str | None, create_subdir: bool, compile_workdir: str | None
) -> tuple[str, bool]:
    """(directory, whether we created it and should remove it)."""
    if work_dir is not None and not create_subdir:
        os.makedirs(work_dir, exist_ok=True)
        return work_dir, False
    # docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs:
    # /tmp/<$USER or no-user>/neuroncc_compile_workdir/<uuid>/. [GUESS]
    # --compile_workdir in NEURON_CC_FLAGS replaces the base; tempfile.gettempdir() is
    # /tmp unless TMPDIR says otherwise.
    base = (
        work_dir
        or compile_workdir
        or os.path.join(
            tempfile.gettempdir(), os.environ.get("USER") or "no-user", "neuroncc_compile_workdir"
        )
    )
    path = os.path.join(base, str(uuid.uuid4()))
    os.makedirs(path)
    return path, True


def call_neuron_compiler(
    work_dir: str,
    input_file: str,
    compile_flags: list[str],
    output_file: str,
    platform_target: str = DEFAULT_TARGET,
    dump: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``neuronx-cc`` from PATH with the argv of
    docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs (neuronxcc >= 2.15)."""
    cmd = [
        "neuronx-cc",
        "compile",
        f"--target={platform_target}",
        "--framework=XLA",
        input_file,
        "--output",
        output_file,
        *compile_flags,
    ]
    if dump:
        cmd += ["--pipeline", "compile", "SaveTemps"]
        program_dir = os.path.join(dump, f"pid{os.getpid()}-program{next(_program_counter)}")
        os.makedirs(program_dir, exist_ok=True)
        with open(os.path.join(program_dir, "neuronx_cc_metadata.json"), "w") as f:
            json.dump([get_compiler_version(), cmd], f)
    cmd.append("--verbose=35")
    if shutil.which("neuronx-cc") is None:
        raise RuntimeError("neuronx-cc was not found on PATH")
    logger.info("||NEURON_CC_WRAPPER||: Call compiler with cmd: %s", cmd)
    return subprocess.run(cmd, cwd=work_dir, capture_output=True, text=True, check=False)


def _compile(
    work_dir: str,
    input_file: str,
    user_flags: list[str],
    output_file: str,
    platform_target: str,
    dump: str | None,
) -> tuple[bool, int, str]:
    """(success, retries used, stderr of the last attempt); retries as
    docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs describes."""
    max_retries = int(os.environ.get("NEURON_PARALLEL_COMPILE_MAX_RETRIES") or 0)
    stderr = ""
    for attempt in range(max_retries + 1):
        done = call_neuron_compiler(
            work_dir, input_file, user_flags, output_file, platform_target, dump
        )
        if done.returncode == 0 and os.path.exists(output_file):
            return True, attempt, ""
        stderr = done.stderr
        logger.error("||NEURON_CC_WRAPPER||: Failed compilation with %s: %s", done.args, stderr)
    return False, max_retries, stderr


def _upload_inputs(
    cache: CompileCache, entry_dir: str, input_file: str, flags_list: list[str]
) -> None:
    cache.upload_file(os.path.join(entry_dir, HLO_FILENAME), input_file)
    # [GUESS] compile_flags.json holds the json.dumps of the hashed flag list
    # (docs/neuron-sdk.md#entry-layout).
    cache.upload_string_to_file(os.path.join(entry_dir, FLAGS_FILENAME), json.dumps(flags_list))


def _upload_success(cache: CompileCache, entry_dir: str, neff_file: str, work_dir: str) -> None:
    cache.upload_file(os.path.join(entry_dir, NEFF_FILENAME), neff_file)
    empty = os.path.join(work_dir, DONE_FILENAME)
    with open(empty, "wb"):
        pass
    # model.done last: it is what a lookup probes (docs/neuron-sdk.md#hit-detection).
    cache.upload_file(os.path.join(entry_dir, DONE_FILENAME), empty)
    # [GUESS] A retried entry's old model.log is removed once it succeeds.
    log = os.path.join(entry_dir, LOG_FILENAME)
    if cache.exists(log):
        cache.remove(log)


def _failed_neff_message(neff_path: str) -> str:
    return (
        f"Got a cached failed neff at {neff_path}. Will skip compilation, please set "
        "--retry_failed_compilation"
    )


def _log_cache_path(cache_url: CacheUrl, cache: CompileCache) -> None:
    """docs/neuron-sdk.md#trial-run and #neuron_parallel_compiles-environment: the trial
    run writes "the actual cache path" to ``NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG`` for
    the parent to read back. [GUESS] Whether that is the URL or the cache object's path
    is not known: ``NEFFCACHE_STANDIN_PATH_LOG=cache_path`` writes the latter."""
    path_log = os.environ.get("NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG")
    if not path_log:
        return
    which = os.environ.get("NEFFCACHE_STANDIN_PATH_LOG", "url")
    with open(path_log, "w") as f:
        f.write(cache.cache_path if which == "cache_path" else cache_url.url)


def neuron_xla_compile_impl(
    input_file: str,
    compiler_flags: list[str],
    output: str,
    platform_target: str = DEFAULT_TARGET,
    *,
    cache_key: str,
    retry_failed_compilation: bool = False,
    use_cache: bool = True,
    cache_dir: str | None = None,
    work_dir: str,
    dump: str | None = None,
) -> None:
    """Look up, or compile and store, ``input_file``; the NEFF ends up at ``output``.

    ``compiler_flags`` are the user flags, wrapper-only flags already removed.
    """
    if not use_cache:
        ok, retries, _ = _compile(
            work_dir, input_file, compiler_flags, output, platform_target, dump
        )
        if not ok:
            raise RuntimeError(f"Compilation failed for {input_file} after {retries} retries.")
        return

    cache_url = CacheUrl.get_cache_url(cache_dir)
    logger.info("||NEURON_CACHE||: Compile cache path: %s", cache_url.url)
    # Through this module's own binding, looked up now (see the module docstring).
    cache = create_compile_cache(cache_url)
    _log_cache_path(cache_url, cache)
    flags_list = hashed_flags(platform_target, compiler_flags)
    entry_dir, _ = cache.get_cache_dir(cache_key, flags_list)
    hlo_path = os.path.join(entry_dir, HLO_FILENAME)
    neff_path = os.path.join(entry_dir, NEFF_FILENAME)
    done_path = os.path.join(entry_dir, DONE_FILENAME)
    log_path = os.path.join(entry_dir, LOG_FILENAME)
    hlo_first = _env_flag("NEFFCACHE_STANDIN_HLO_FIRST")

    def hit() -> bool:
        if not cache.exists(done_path):
            return False
        cache.download_file(neff_path, output)
        logger.info(
            "||NEURON_CC_WRAPPER||: Using a cached neff at %s. "
            "Exiting with a successfully compiled graph.",
            neff_path,
        )
        return True

    def replay_failure() -> None:
        if not retry_failed_compilation and cache.exists(log_path):
            logger.error("||NEURON_CC_WRAPPER||: %s", _failed_neff_message(neff_path))
            raise RuntimeError(_failed_neff_message(neff_path))

    if hlo_first:
        _upload_inputs(cache, entry_dir, input_file, flags_list)
    # [GUESS] With NEURON_EXTRACT_GRAPHS_ONLY a hit still returns the cached NEFF: section
    # 8.2 says the trial run's log lists only the new HLOs.
    if hit():
        return
    if _env_flag("NEURON_EXTRACT_GRAPHS_ONLY"):
        # [GUESS] Extraction writes the entry without the entry lock, and ignores a
        # cached failure: nothing is compiled in this mode anyway.
        if not hlo_first:
            _upload_inputs(cache, entry_dir, input_file, flags_list)
        logger.info(
            "||NEURON_CC_WRAPPER||: Extracting graphs (%s) for ahead-of-time parallel "
            "compilation. No compilation was done.",
            hlo_path,
        )
        with open(output, "wb") as placeholder:
            placeholder.write(EXTRACT_ONLY_PLACEHOLDER)
        return
    replay_failure()

    cache.hlo_acquire_lock(hlo_path)
    try:
        # Another process may have finished (or failed) while we waited for the lock.
        if hit():
            return
        replay_failure()
        if not hlo_first:
            _upload_inputs(cache, entry_dir, input_file, flags_list)
        ok, retries, stderr = _compile(
            work_dir, input_file, compiler_flags, output, platform_target, dump
        )
        if ok:
            _upload_success(cache, entry_dir, output, work_dir)
            return
        cache.upload_string_to_file(log_path, stderr)
        message = f"Compilation failed for {input_file} after {retries} retries."
        logger.error("||NEURON_CC_WRAPPER||: %s", message)
        raise RuntimeError(message)
    finally:
        cache.hlo_release_lock(hlo_path)


def neuron_xla_compile(
    module_bytes: bytes,
    compiler_flags: str | list[str] | None,
    input_format: str = "hlo",
    platform_target: str = DEFAULT_TARGET,
    cache_key: str | None = None,
    retry_failed_compilation: bool = False,
    lazy: bool = True,
    use_cache: bool = True,
    cache_dir: str | None = None,
    work_dir: str | None = None,
    create_subdir: bool = True,
) -> bytes:
    """Compile a serialized ``HloModuleProto`` through the cache; returns the NEFF bytes.

    ``lazy`` is accepted and ignored. Only ``input_format="hlo"`` is supported.
    """
    if input_format != "hlo":
        raise NotImplementedError(f"stand-in: input_format={input_format!r} is not supported")
    env_args, _, _ = libncc.setup_args()
    # [GUESS] Wrapper-only flags in the caller's list are handled like NEURON_CC_FLAGS';
    # the caller's compiler flags come first, then NEURON_CC_FLAGS'.
    caller_args = libncc.split_wrapper_flags(_normalize_flags(compiler_flags))
    user_flags = caller_args.compiler_flags + env_args.compiler_flags
    use_cache = use_cache and not (env_args.no_cache or caller_args.no_cache)
    retry = (
        retry_failed_compilation
        or env_args.retry_failed_compilation
        or caller_args.retry_failed_compilation
    )
    # [GUESS] NEURON_PLATFORM_TARGET_OVERRIDE (docs/neuron-sdk.md#flags-hash, row
    # +70e3f644) wins over the argument.
    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or platform_target
    module_key = cache_key if cache_key is not None else module_fingerprint(module_bytes)
    flags_hash = CompileCache.get_compiler_flags_hash(hashed_flags(target, user_flags))

    wd, remove_wd = _make_work_dir(work_dir, create_subdir, env_args.compile_workdir)
    try:
        stem = os.path.join(wd, f"model.MODULE_{module_key}+{flags_hash}")
        input_file = stem + ".hlo_module.pb"
        output = stem + ".neff"
        with open(input_file, "wb") as hlo_file:
            hlo_file.write(module_bytes)
        neuron_xla_compile_impl(
            input_file,
            user_flags,
            output,
            target,
            cache_key=module_key,
            retry_failed_compilation=retry,
            use_cache=use_cache,
            cache_dir=cache_dir or caller_args.cache_dir,
            work_dir=wd,
            dump=env_args.dump or caller_args.dump,
        )
        with open(output, "rb") as neff_file:
            return neff_file.read()
    finally:
        if remove_wd:
            shutil.rmtree(wd, ignore_errors=True)


def compile_cache_entry(
    output_neff_path: str,
    cache_entry: CacheEntry,
    dump: str | None = None,
    work_dir: str | None = None,
) -> tuple[bool, int]:
    """Compile one cache entry for ``neuron_parallel_compile``
    (docs/neuron-sdk.md#parallel-compile).

    The caller holds the entry lock (``with cache_entry:``). Returns ``(status,
    retry)``: [GUESS] status is True on success, retry the number of retries used.
    The NEFF is also copied to ``output_neff_path``.
    """
    cache = cache_entry.cache
    ncc_args, _, _ = libncc.setup_args()
    wd, remove_wd = _make_work_dir(work_dir, True, ncc_args.compile_workdir)
    try:
        stem = os.path.join(wd, f"model.{cache_entry.key}")
        input_file = stem + ".hlo_module.pb"
        output = stem + ".neff"
        cache_entry.download_hlo(input_file)
        flags_path = os.path.join(cache_entry.entry_dir, FLAGS_FILENAME)
        flags: list[str] = []
        if cache.exists(flags_path):
            flags = json.loads(cache.download_file_to_string(flags_path))
        target = DEFAULT_TARGET
        if flags and flags[0].startswith("--target="):
            target, flags = flags[0][len("--target=") :], flags[1:]
        ok, retries, stderr = _compile(wd, input_file, flags, output, target, dump)
        if ok:
            _upload_success(cache, cache_entry.entry_dir, output, wd)
            parent = os.path.dirname(output_neff_path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            shutil.copyfile(output, output_neff_path)
        else:
            cache.upload_string_to_file(os.path.join(cache_entry.entry_dir, LOG_FILENAME), stderr)
            logger.error(
                "||NEURON_CC_WRAPPER||: Compilation failed for %s after %d retries.",
                cache_entry.hlo_path,
                retries,
            )
        return ok, retries
    finally:
        if remove_wd:
            shutil.rmtree(wd, ignore_errors=True)
