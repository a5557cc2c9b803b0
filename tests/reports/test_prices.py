"""The shipped price table, the ``price_table`` setting's overrides, and bad files:
each a ConfigError naming the file, and a server that will not start with one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.config_errors import ConfigError
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.reports.prices import load_prices
from neffcache.server.settings import ServerSettings

# What the brief asked the shipped table to cover.
TRAINIUM = ("trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge")
INFERENTIA = (
    *(f"inf1.{size}" for size in ("xlarge", "2xlarge", "6xlarge", "24xlarge")),
    *(f"inf2.{size}" for size in ("xlarge", "8xlarge", "24xlarge", "48xlarge")),
)
DATE = re.compile(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]")


def test_the_shipped_table_covers_trainium_and_inferentia_with_date_and_source() -> None:
    table = load_prices(None)
    assert DATE.fullmatch(table.shipped_checked)
    assert table.label == f"shipped {table.shipped_checked}"
    for name in (*TRAINIUM, *INFERENTIA):
        price = table.prices[name]
        assert DATE.fullmatch(price.listed), name
        assert price.source.startswith("https://"), name
        assert price.region, name
        # Either a price, or the reason there is none; never both, never neither.
        assert (price.usd_per_hour is None) == bool(price.unpriced), name


def test_shipped_prices_are_the_ones_found_and_unconfirmed_ones_stay_unpriced() -> None:
    table = load_prices(None)
    assert table.hourly("trn1.32xlarge") == 21.50
    assert table.hourly("trn1.2xlarge") == 1.34375
    assert table.hourly("trn1n.32xlarge") == 24.78
    assert table.hourly("inf2.48xlarge") == 12.98127
    assert table.hourly("inf1.xlarge") == 0.228
    # No on-demand price could be confirmed for Trainium2: hours stay unpriced.
    assert table.hourly("trn2.48xlarge") is None
    assert table.hourly("trn2u.48xlarge") is None
    assert "on-demand" in table.prices["trn2.48xlarge"].unpriced


def test_unknown_or_missing_instance_types_have_no_price() -> None:
    table = load_prices(None)
    assert table.hourly("p5.48xlarge") is None
    assert table.hourly(None) is None
    assert table.hourly("") is None
    assert table.hourly(" TRN1.32XLARGE ") == 21.50  # as a host may report it


def test_a_price_file_overrides_shipped_prices_and_adds_types(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(
        '[instances."trn1.32xlarge"]\nusd_per_hour = 13.23\nnote = "our 1-year plan"\n'
        '[instances."trn3.big"]\nusd_per_hour = 50\n'
        '[instances."inf1.xlarge"]\nunpriced = "we do not pay for these"\n'
    )
    table = load_prices(path)
    assert table.hourly("trn1.32xlarge") == 13.23
    assert table.hourly("trn3.big") == 50.0
    assert table.hourly("inf1.xlarge") is None
    assert table.hourly("trn1.2xlarge") == 1.34375  # untouched shipped price
    assert table.label == f"file {path}"


BAD_FILES = {
    "not TOML": ("[instances\n", "not valid TOML"),
    "unknown top-level key": ('region = "eu-west-1"\n', "unknown key 'region'"),
    "unknown field": ('[instances."trn1.2xlarge"]\nusd = 1\n', "unknown key 'usd'"),
    "negative price": ('[instances."trn1.2xlarge"]\nusd_per_hour = -1\n', "must be a number"),
    "text price": ('[instances."trn1.2xlarge"]\nusd_per_hour = "1.3"\n', "must be a number"),
    "no price": ('[instances."trn1.2xlarge"]\nregion = "us-east-1"\n', "give usd_per_hour"),
    "both": (
        '[instances."trn1.2xlarge"]\nusd_per_hour = 1\nunpriced = "why"\n',
        "give usd_per_hour",
    ),
    "bad name": ('[instances."Trn 1"]\nusd_per_hour = 1\n', "not an instance type name"),
    "other currency": ('currency = "EUR"\n', "USD only"),
    "not a table": ("instances = 3\n", "must be tables"),
    "text note": ('[instances."trn1.2xlarge"]\nusd_per_hour = 1\nnote = 3\n', "must be a string"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_price_file_is_a_config_error_naming_it(tmp_path: Path, name: str) -> None:
    text, message = BAD_FILES[name]
    path = tmp_path / f"{name.replace(' ', '-')}.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_prices(path)
    assert str(path) in str(raised.value)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_price_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match="cannot read it"):
        load_prices(path)


@contextmanager
def _app(tmp_path: Path, price_table: Path) -> Iterator[TestClient]:
    settings = ServerSettings(
        data_dir=tmp_path, eviction_interval_seconds=0, price_table=price_table
    )
    blobs, index = MemoryBlobStore(), MemoryIndex()
    try:
        with TestClient(create_app(settings, blob_store=blobs, index=index)) as client:
            yield client
    finally:
        blobs.close()
        index.close()


def test_the_server_does_not_start_with_a_bad_price_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[instances."trn1.2xlarge"]\nusd_per_hour = -3\n')
    with pytest.raises(ConfigError, match=r"bad\.toml"), _app(tmp_path, path):
        pass


def test_reports_use_the_configured_price_file(tmp_path: Path) -> None:
    path = tmp_path / "ours.toml"
    path.write_text('[instances."trn1.32xlarge"]\nusd_per_hour = 10\n')
    with _app(tmp_path, path) as client:
        answer = client.get("/v1/reports/cost")
    assert answer.status_code == 200, answer.text
    assert answer.json()["prices"]["table"] == f"file {path}"
