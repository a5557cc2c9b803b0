"""Server settings: environment ``NEFFCACHE_*`` over an optional TOML file over defaults.

>>> ServerSettings(data_dir="/srv/neffcache").blob_store_url()
'file:///srv/neffcache'

The TOML file is named by ``NEFFCACHE_CONFIG_FILE`` (or ``--config``); an unknown key
in it is an error. Unknown ``NEFFCACHE_*`` environment variables are not, because the
client reads its own ``NEFFCACHE_*`` variables from the same environments.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .config_errors import ConfigError

# The settings file load_settings was given; the settings sources read it from here.
_CONFIG_FILE: ContextVar[str | None] = ContextVar("neffcache_config_file", default=None)


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/neffcache``, else ``~/.local/share/neffcache``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "neffcache"


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NEFFCACHE_", extra="forbid")

    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8787, ge=0, le=65535, description="port to bind (0: any free port)")
    data_dir: Path = Field(default_factory=default_data_dir, description="embedded store home")
    blob_url: str | None = Field(
        None, description="file:///path or s3://bucket/prefix; default file://DATA_DIR/blobs"
    )
    index_url: str | None = Field(
        None, description="sqlite:///path or redis://host:port/db; default sqlite DATA_DIR/index.db"
    )
    max_blob_bytes: int = Field(16 * 2**30, gt=0, description="largest blob accepted")
    failure_ttl_seconds: float = Field(
        3600.0,
        gt=0,
        le=366 * 86400,
        allow_inf_nan=False,
        description="how long a failure record is kept (at most a year)",
    )
    # Bounded: a GET returns every record kept, each up to 256 KiB.
    failures_per_key: int = Field(
        5, ge=1, le=100, description="failure records kept per key, newest first"
    )
    reverify_seconds: float = Field(
        3600.0,
        ge=0,
        le=366 * 86400,
        allow_inf_nan=False,
        description="how long a blob verified on read is served without hashing it "
        "again while its file is unchanged (0: hash on every read)",
    )
    # Reads of a verified, unchanged file skip hashing (reverify_seconds): the scrub is
    # what still reads every blob, so rot no stamp shows is found (scrub.py).
    scrub_interval_seconds: float = Field(
        7 * 86400.0,
        ge=0,
        le=366 * 86400,
        allow_inf_nan=False,
        description="filesystem store: how often one replica reads and hashes every blob "
        "again, quarantining the corrupt (0: never)",
    )
    scrub_bytes_per_second: int = Field(
        32 * 2**20,
        ge=2**20,
        le=2**40,
        description="how fast the scrub reads at most (each blob counts as at least "
        "64 KiB), so that it never competes with serving",
    )
    accel_redirect_prefix: str | None = Field(
        None,
        pattern=r"^/[A-Za-z0-9._~/-]*[A-Za-z0-9._~-]$",
        description="filesystem store behind nginx: a verified blob's GET that nginx "
        "marks is answered with X-Accel-Redirect: PREFIX/blobs/ab/DIGEST and no body, "
        "for nginx to send the file (deploy/nginx/)",
    )
    # At most 7 days: the longest a SigV4 presigned URL may live.
    blob_redirect_seconds: int = Field(
        0,
        ge=0,
        le=7 * 86400,
        description="S3 store: answer a blob GET with a 307 to a presigned URL that lives "
        "this long, so the bytes do not pass through the server (0: never)",
    )
    blob_redirect_min_bytes: int = Field(
        2**20,
        ge=0,
        description="only blobs at least this big are redirected (smaller ones cost less "
        "served than the client's second request)",
    )
    lease_ttl_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        allow_inf_nan=False,
        description="how long a compile lease lives without renewal (clients renew at a third)",
    )
    lease_wait_max_seconds: float = Field(
        55.0,
        ge=0,
        le=600,
        allow_inf_nan=False,
        description="the longest one lease request may wait before answering (long-poll)",
    )
    lease_recheck_seconds: float = Field(
        2.0,
        gt=0,
        le=60,
        allow_inf_nan=False,
        description="how often a waiting request reads the index with no wake-up "
        "(a publish through another replica wakes no one here)",
    )
    lease_expected_max_seconds: float = Field(
        7200.0,
        ge=1,
        le=30 * 86400,
        allow_inf_nan=False,
        description="the longest compile time a lease holder may announce to waiters: a "
        "claim beyond it is told as this (a waiter's bound never rests on a claim alone)",
    )
    default_ttl_seconds: float | None = Field(
        30 * 86400.0,
        ge=60,
        le=3650 * 86400,
        allow_inf_nan=False,
        description="how long an entry of a namespace without its own ttl is kept after "
        'it was last served ("none": until a quota or an admin removes it)',
    )
    eviction_interval_seconds: float = Field(
        300.0,
        ge=0,
        le=86400,
        allow_inf_nan=False,
        description="how often one replica applies expiry, quotas and retention and "
        "removes unreferenced blobs (0: never in the background)",
    )
    blob_grace_seconds: float = Field(
        3600.0,
        ge=0,
        le=30 * 86400,
        allow_inf_nan=False,
        description="how long a blob stays after nothing references it: uploads not "
        "yet published, and downloads begun before their entry was evicted",
    )
    access_flush_seconds: float = Field(
        15.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="how often last-access times and hit counts are written to the index",
    )
    value_half_life_seconds: float = Field(
        86400.0,
        gt=0,
        allow_inf_nan=False,
        description="value ranking: an entry unused this long counts half as much",
    )
    audit_keep: int = Field(
        100_000, ge=100, le=10_000_000, description="audit records kept, newest first"
    )
    events_retention_seconds: float = Field(
        90 * 86400.0,
        ge=3600,
        le=3 * 366 * 86400,
        allow_inf_nan=False,
        description="how long clients' telemetry events are kept (reports, explanations)",
    )
    events_keep: int = Field(
        2_000_000,
        ge=1000,
        le=100_000_000,
        description="telemetry events kept at most, newest first (bounds the index)",
    )
    # At least 16 MiB: four whole batches (4 MiB each), so that no one batch trims
    # its own namespace's events away; at most 1 TiB, past any index's size.
    events_max_bytes: int = Field(
        2**30,
        ge=16 * 2**20,
        le=2**40,
        description="stored bytes of telemetry events kept at most per namespace, newest "
        "first (bounds what one namespace's clients can make the index hold)",
    )
    price_table: Path | None = Field(
        None,
        description="TOML file of instance prices over the shipped table (reports' money figures)",
    )
    bootstrap_admin_token: SecretStr | None = Field(
        None, description="an admin token the server creates at start-up if absent"
    )
    metrics_require_token: bool = Field(
        False,
        description="/metrics answers only a token for every namespace (*): it names "
        "them all, with their sizes",
    )
    config_file: Path | None = Field(None, description="TOML file with these settings")
    access_log: bool = Field(False, description="log every request (costs throughput)")
    # A client sends its head in one write; this bounds connections that never finish
    # one (connections.py). It is also the keep-alive idle time, which it replaces.
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="how long a connection may take to send a complete request head, "
        "from when it opens or its previous response ends (then it is closed)",
    )
    # Lowered at start-up to what the descriptor limit allows (connections.py).
    max_connections: int = Field(
        4096,
        ge=1,
        le=10_000_000,
        description="connections open at once; a new one beyond it closes the one waiting "
        "longest for a request head, or is itself closed when every one is serving",
    )

    @field_validator("default_ttl_seconds", mode="before")
    @classmethod
    def _none(cls, value: Any) -> Any:
        # Neither TOML nor an environment variable can say null: "none" does.
        if isinstance(value, str) and value.strip().lower() in ("none", "never"):
            return None
        return value

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _CONFIG_FILE.get() or os.environ.get("NEFFCACHE_CONFIG_FILE")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)

    def blob_store_url(self) -> str:
        # as_uri quotes what a URL cannot hold as is (%, #, ?, spaces).
        return self.blob_url or self.data_dir.as_uri()

    def index_store_url(self) -> str:
        # sqlite:// takes the path as it is (no percent-decoding), unlike file://.
        return self.index_url or f"sqlite://{self.data_dir / 'index.db'}"


def load_settings(**overrides: Any) -> ServerSettings:
    """Settings from the environment (and file), with explicit overrides on top.

    Raises ConfigError with the validation problems in one message.
    """
    from pydantic import ValidationError

    config_file = overrides.pop("config_file", None) or os.environ.get("NEFFCACHE_CONFIG_FILE")
    if config_file and not Path(config_file).is_file():
        raise ConfigError(f"the settings file {config_file} does not exist")
    token = _CONFIG_FILE.set(str(config_file) if config_file else None)
    try:
        return ServerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the settings file {config_file}: {exc}") from None
    finally:
        _CONFIG_FILE.reset(token)


def redact(url: str) -> str:
    """A URL fit for logs: any password or query (which may hold keys) replaced."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    if "@" in rest.split("/", 1)[0]:
        userinfo, _, hostpart = rest.partition("@")
        user = userinfo.split(":", 1)[0]
        rest = f"{user}:***@{hostpart}" if ":" in userinfo else f"{user}@{hostpart}"
    rest = rest.split("?", 1)[0] + ("?***" if "?" in rest else "")
    return f"{scheme}://{rest}"
