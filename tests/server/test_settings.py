"""ServerSettings: environment over file over defaults, and errors that name the fix."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from neffcache.server.config_errors import ConfigError
from neffcache.server.settings import ServerSettings, load_settings, redact


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NEFFCACHE_") or name == "XDG_DATA_HOME":
            monkeypatch.delenv(name)


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    settings = load_settings()
    assert (settings.host, settings.port) == ("127.0.0.1", 8787)
    assert settings.data_dir == tmp_path / "neffcache"
    assert settings.blob_store_url() == (tmp_path / "neffcache").as_uri()
    assert settings.index_store_url() == f"sqlite://{tmp_path / 'neffcache' / 'index.db'}"


def test_environment_over_file_over_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "neffcache.toml"
    config.write_text('port = 9000\nhost = "127.0.0.2"\nmax_blob_bytes = 1024\n')
    monkeypatch.setenv("NEFFCACHE_CONFIG_FILE", str(config))
    monkeypatch.setenv("NEFFCACHE_PORT", "9100")
    settings = load_settings()
    assert settings.port == 9100  # environment wins
    assert settings.host == "127.0.0.2"  # from the file
    assert settings.max_blob_bytes == 1024
    assert load_settings(port=9200).port == 9200  # a command-line option wins over both


def test_unknown_key_in_the_file_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "neffcache.toml"
    config.write_text("prot = 9000\n")
    monkeypatch.setenv("NEFFCACHE_CONFIG_FILE", str(config))
    with pytest.raises(ConfigError, match="prot"):
        load_settings()


@pytest.mark.parametrize(
    ("name", "value"), [("NEFFCACHE_PORT", "http"), ("NEFFCACHE_PORT", "70000")]
)
def test_bad_values_name_the_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="port"):
        load_settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NEFFCACHE_FAILURE_TTL_SECONDS", "0"),
        ("NEFFCACHE_FAILURE_TTL_SECONDS", "-5"),
        ("NEFFCACHE_FAILURE_TTL_SECONDS", "inf"),
        ("NEFFCACHE_FAILURE_TTL_SECONDS", "nan"),
        ("NEFFCACHE_FAILURES_PER_KEY", "0"),
        ("NEFFCACHE_FAILURES_PER_KEY", "101"),
    ],
)
def test_failure_retention_must_be_positive_and_bounded(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name.removeprefix("NEFFCACHE_").lower()):
        load_settings()


def test_failure_retention_defaults_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = load_settings()
    assert (defaults.failure_ttl_seconds, defaults.failures_per_key) == (3600.0, 5)
    monkeypatch.setenv("NEFFCACHE_FAILURE_TTL_SECONDS", "0.25")
    monkeypatch.setenv("NEFFCACHE_FAILURES_PER_KEY", "100")
    settings = load_settings()
    assert (settings.failure_ttl_seconds, settings.failures_per_key) == (0.25, 100)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(config_file=tmp_path / "absent.toml", port=1)


def test_the_bootstrap_token_is_a_secret() -> None:
    settings = ServerSettings(bootstrap_admin_token="nfc_very_secret")
    assert "nfc_very_secret" not in repr(settings)
    assert "nfc_very_secret" not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://user:hunter2@cache:6379/0", "redis://user:***@cache:6379/0"),
        ("s3://bucket/prefix?access_key=AKIA123", "s3://bucket/prefix?***"),
        ("sqlite:///var/lib/neffcache/index.db", "sqlite:///var/lib/neffcache/index.db"),
    ],
)
def test_urls_are_redacted_for_logs(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert "hunter2" not in redact(url)


@pytest.mark.parametrize(
    ("opener", "url", "extra"),
    [
        ("blob", "s3://bucket/prefix", "neffcache[s3]"),
        ("index", "redis://h:6379/0", "neffcache[redis]"),
    ],
)
def test_a_missing_extra_names_the_install(
    monkeypatch: pytest.MonkeyPatch, opener: str, url: str, extra: str
) -> None:
    import sys

    from neffcache.server.blobs import open_blob_store
    from neffcache.server.index import open_index

    # As if boto3 / redis-py were not installed.
    for module in ("boto3", "redis", "neffcache.server.blobs.s3", "neffcache.server.index.redis"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError, match=re.escape(extra)):
        (open_blob_store if opener == "blob" else open_index)(url)


def test_default_stores_open_in_a_data_dir_with_awkward_characters(tmp_path: Path) -> None:
    from neffcache.server.blobs import open_blob_store
    from neffcache.server.index import open_index

    data_dir = tmp_path / "cache dir 100%#1"
    settings = load_settings(data_dir=str(data_dir))
    blobs = open_blob_store(settings.blob_store_url())
    index = open_index(settings.index_store_url())
    try:
        assert (data_dir / "blobs").is_dir()
        assert (data_dir / "index.db").is_file()
    finally:
        blobs.close()
        index.close()


def test_default_ttl_can_be_lifted_from_env_and_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert load_settings().default_ttl_seconds == 30 * 86400
    config = tmp_path / "neffcache.toml"
    config.write_text('default_ttl_seconds = "none"\n')
    assert load_settings(config_file=str(config)).default_ttl_seconds is None
    monkeypatch.setenv("NEFFCACHE_DEFAULT_TTL_SECONDS", "Never")
    assert load_settings().default_ttl_seconds is None
    monkeypatch.setenv("NEFFCACHE_DEFAULT_TTL_SECONDS", "30")  # under a minute
    with pytest.raises(ConfigError, match="default_ttl_seconds"):
        load_settings()
