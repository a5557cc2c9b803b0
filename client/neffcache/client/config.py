"""Where the cache is and how the client behaves, read from the environment once.

The URL lives where a Neuron user already puts a cache URL, with the SDK's precedence
(docs/neuron-sdk.md#cache-location): ``--cache_dir=`` inside ``NEURON_CC_FLAGS``, then
``NEURON_COMPILE_CACHE_URL``; ``NEFFCACHE_URL`` overrides both. Only a
``neffcache+http(s)://HOST:PORT/NAMESPACE`` URL turns neffcache on: anything else (a
directory, ``s3://``) leaves the stock cache alone.

This module is imported by the persistent-cache hook in every Python process that
imports libneuronxla, so it imports nothing beyond the standard library's cheapest
modules.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import NamedTuple

SCHEME_PREFIX = "neffcache+"
DEFAULT_LOCAL_DIR = "/var/tmp/neuron-compile-cache"
_CACHE_DIR = re.compile(r"--cache_dir(?:=|\s+)(\S+)")


class ConfigError(ValueError):
    """A neffcache URL or setting that cannot be used (the message names the fix)."""


def cache_url(environ: Mapping[str, str]) -> str | None:
    """The cache URL in force, by the precedence above (None: the SDK default)."""
    if environ.get("NEFFCACHE_URL"):
        return environ["NEFFCACHE_URL"]
    flags = environ.get("NEURON_CC_FLAGS", "")
    if "--cache_dir" in flags:
        import shlex

        try:
            tokens = shlex.split(flags)
        except ValueError:
            tokens = flags.split()
        found = _CACHE_DIR.search(" ".join(tokens))
        if found:
            return found[1]
    return environ.get("NEURON_COMPILE_CACHE_URL") or None


def sdk_urls(environ: Mapping[str, str]) -> list[str]:
    """Every cache location the SDK's own settings name, whatever their precedence:
    ``--cache_dir`` in ``NEURON_CC_FLAGS``, ``NEURON_COMPILE_CACHE_URL`` and the
    default. Callers resolve these themselves and disagree on the order
    (docs/neuron-sdk.md#cache-location: optimum-neuron passes the default as
    ``cache_dir`` while the variable is set)."""
    sdk_env = {k: v for k, v in environ.items() if k != "NEFFCACHE_URL"}
    found = [cache_url(sdk_env), environ.get("NEURON_COMPILE_CACHE_URL"), DEFAULT_LOCAL_DIR]
    return [url for url in dict.fromkeys(found) if url]


def location(url: str) -> str:
    """``url`` in a form to compare: ``file://`` dropped, ``~`` expanded, absolute,
    no trailing slash; an ``s3://`` URL only loses its trailing slash. The SDK's
    handling of these spellings is not documented (docs/neuron-sdk.md#cache-location),
    so each counts as one location."""
    if url.startswith("s3://"):
        return url.rstrip("/")
    path = url.removeprefix("file://")
    return os.path.abspath(os.path.expanduser(path)) if path else path


def overridden(url: str, environ: Mapping[str, str]) -> bool:
    """Whether ``NEFFCACHE_URL`` takes over a cache the SDK is asked for at ``url``: it
    is set, and ``url`` is one of the locations of :func:`sdk_urls`. A directory some
    code names for itself (a sync tool's ``CacheUrl("/path")``) stays that directory."""
    if not environ.get("NEFFCACHE_URL") or not url:
        return False
    return location(url) in {location(sdk) for sdk in sdk_urls(environ)}


def wants_neffcache(environ: Mapping[str, str]) -> bool:
    """Cheap test for the .pth hook: is any neffcache URL configured?"""
    url = cache_url(environ)
    return url is not None and url.startswith(SCHEME_PREFIX)


class ClientConfig(NamedTuple):
    server: str  # http(s)://host:port, no trailing slash
    namespace: str
    token: str | None
    local_dir: str
    connect_timeout: float
    timeout: float
    backoff: float
    publish_wait: float
    real_compiler: str | None
    run_manifest: str | None
    stock_failures: bool  # replay cached failures like the stock cache does
    leases: bool = True  # ask the server who compiles a missing graph (fleet single-flight)
    lease_wait: float = 3600.0  # longest wait for another host's compile of unknown length
    model: str | None = None  # NEFFCACHE_MODEL: a label on what this job publishes (pins, reports)
    telemetry: bool = True  # NEFFCACHE_TELEMETRY=0: send no events (explanations stay on)
    job_id: str | None = None  # NEFFCACHE_JOB_ID, else the scheduler's (see ``job_id``)
    instance_type: str | None = None  # NEFFCACHE_INSTANCE_TYPE (else telemetry reads the DMI)
    # NEFFCACHE_LOCAL_MAX_SIZE in bytes: None for the default (l1limit.default_limit,
    # which needs the filesystem, so not read here), 0 for no limit.
    local_max_size: int | None = None
    # NEFFCACHE_LOCAL_READ_ONLY: never write to L1 (an image's baked entries, served as
    # they are); a directory this process cannot write is treated the same (local.py).
    local_read_only: bool = False

    @property
    def url(self) -> str:
        return f"{SCHEME_PREFIX}{self.server}/{self.namespace}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientConfig | None:
        """The configuration, or None when no neffcache URL is configured (or
        ``NEFFCACHE_DISABLE`` is set). Raises ConfigError for a malformed one."""
        env = os.environ if environ is None else environ
        if _flag(env, "NEFFCACHE_DISABLE"):
            return None
        url = cache_url(env)
        if url is None or not url.startswith(SCHEME_PREFIX):
            return None
        server, namespace = parse_url(url)
        return cls(
            server=server,
            namespace=namespace,
            token=env.get("NEFFCACHE_TOKEN") or None,
            local_dir=env.get("NEFFCACHE_LOCAL_DIR") or DEFAULT_LOCAL_DIR,
            connect_timeout=_seconds(env, "NEFFCACHE_CONNECT_TIMEOUT", 2.0),
            timeout=_seconds(env, "NEFFCACHE_TIMEOUT", 10.0),
            backoff=_seconds(env, "NEFFCACHE_BACKOFF", 60.0),
            publish_wait=_seconds(env, "NEFFCACHE_PUBLISH_WAIT", 30.0),
            real_compiler=env.get("NEFFCACHE_REAL_COMPILER") or None,
            run_manifest=env.get("NEFFCACHE_RUN_MANIFEST") or None,
            stock_failures=_flag(env, "NEFFCACHE_STOCK_FAILURES"),
            leases=not _off(env, "NEFFCACHE_LEASES"),
            lease_wait=_seconds(env, "NEFFCACHE_LEASE_WAIT", 3600.0),
            model=_label(env.get("NEFFCACHE_MODEL")),
            telemetry=not _off(env, "NEFFCACHE_TELEMETRY"),
            job_id=job_id(env),
            instance_type=_name(env.get("NEFFCACHE_INSTANCE_TYPE")),
            local_max_size=_size(env, "NEFFCACHE_LOCAL_MAX_SIZE"),
            local_read_only=local_read_only(env),
        )


def local_read_only(env: Mapping[str, str]) -> bool:
    """Whether ``NEFFCACHE_LOCAL_READ_ONLY`` declares L1 read-only."""
    return _flag(env, "NEFFCACHE_LOCAL_READ_ONLY")


def parse_url(url: str) -> tuple[str, str]:
    """``neffcache+http://host:port/namespace`` -> (``http://host:port``, namespace)."""
    rest = url[len(SCHEME_PREFIX) :]
    scheme, sep, tail = rest.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise ConfigError(
            f"{url!r}: use neffcache+http://HOST:PORT/NAMESPACE (or neffcache+https://)"
        )
    from neffcache.protocol import is_namespace  # here: the .pth line imports this module

    host, slash, namespace = tail.partition("/")
    namespace = namespace.strip("/")
    if not host or not slash or not is_namespace(namespace):
        raise ConfigError(
            f"{url!r}: the URL must end with one namespace name "
            "(lowercase letters, digits, '.', '_', '-'), as in "
            "neffcache+http://cache.internal:8787/team-a"
        )
    return f"{scheme}://{host}", namespace


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{name}={raw!r} must be a finite number of seconds >= 0")
    return value


# The admin commands' spelling of sizes (``500M``, ``2G``, ``1.5TiB``: powers of 1024).
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(?:i?b)?\s*")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def _size(env: Mapping[str, str], name: str) -> int | None:
    """Bytes from ``50G`` / ``500M`` / ``1073741824``; ``0`` (or ``none``) for no limit;
    None when unset (the caller's default)."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if raw.lower() == "none":
        return 0
    found = _SIZE.fullmatch(raw.lower())
    if not found:
        raise ConfigError(
            f"{name}={raw!r} is not a size: use bytes or a number with K, M, G or T "
            "(powers of 1024) such as 50G, or 0 for no limit"
        )
    return int(float(found[1]) * _SIZE_UNITS[found[2]])


def _off(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("0", "false", "no", "off")


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


# The schedulers' own job ids, first set wins (NEFFCACHE_JOB_ID before them all). Each
# names one job across all its hosts and ranks, which is what reports group by; a pod
# name or a host name is not a job. TORCHELASTIC_RUN_ID is torchrun's --rdzv-id: last,
# because it is "none" unless set, and a fixed id may be reused by many jobs.
JOB_ID_VARIABLES = (
    "SLURM_JOB_ID",
    "AWS_BATCH_JOB_ID",
    "TRAINING_JOB_NAME",  # SageMaker training jobs
    "PBS_JOBID",
    "LSB_JOBID",
    "TORCHELASTIC_RUN_ID",
)
_BATCH_NODE = re.compile(r"#[0-9]+$")


def job_id(env: Mapping[str, str]) -> str | None:
    """This job's id: ``NEFFCACHE_JOB_ID``, else the first of ``JOB_ID_VARIABLES`` set;
    None when there is none. An AWS Batch multi-node job's ``#<node>`` suffix is cut
    (its nodes are one job); an LSF array element keeps its index, as ``ID[INDEX]``."""
    own = _name(env.get("NEFFCACHE_JOB_ID"))
    if own is not None:
        return own
    for variable in JOB_ID_VARIABLES:
        value = _name(env.get(variable))
        if value is None or (variable == "TORCHELASTIC_RUN_ID" and value == "none"):
            continue
        if variable == "AWS_BATCH_JOB_ID":
            value = _BATCH_NODE.sub("", value)
        elif variable == "LSB_JOBID" and env.get("LSB_JOBINDEX", "0") not in ("", "0"):
            value = _name(f"{value}[{env['LSB_JOBINDEX']}]") or value
        return value
    return None


def _name(value: str | None) -> str | None:
    """An identifier as the server takes it (1 to 255 printable characters, trimmed);
    None otherwise: a value that is not is dropped rather than failing the job."""
    value = (value or "").strip()
    if not value or len(value) > 255 or not value.isprintable():
        return None
    return value


def _label(value: str | None) -> str | None:
    """A model label as the server takes it: printable, at most 200 characters; a
    label that is not is dropped rather than failing the job."""
    if not value or len(value) > 200 or not value.isprintable():
        return None
    return value
