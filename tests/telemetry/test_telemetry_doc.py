"""docs/telemetry.md cannot drift from the code: every field, bound and metric it
lists is checked here."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

import neffcache.server.index.redis as redis_module
from neffcache.server.metrics import Metrics
from neffcache.server.settings import ServerSettings
from neffcache.server.telemetry import schema
from neffcache.server.telemetry.schema import Components, CountersEvent, GraphEvent, GraphSummary

DOC = (Path(__file__).parents[2] / "docs" / "telemetry.md").read_text()


@pytest.mark.parametrize("model", [GraphEvent, CountersEvent, Components, GraphSummary])
def test_every_field_is_documented(model: type[BaseModel]) -> None:
    assert [name for name in model.model_fields if f"`{name}`" not in DOC] == []


def test_the_stamps_are_documented() -> None:
    assert [stamp for stamp in schema.STAMPS if f"`{stamp}`" not in DOC] == []


def test_every_event_metric_is_documented_and_exposed() -> None:
    exposed = Metrics(list).exposition().decode()
    for metric in (
        "neffcache_events_received_total",
        "neffcache_client_graphs_total",
        "neffcache_client_misses_total",
        "neffcache_client_fetch_seconds",
        "neffcache_client_compile_seconds",
        "neffcache_client_counters_total",
    ):
        assert f"`{metric}`" in DOC
        assert f"# HELP {metric} " in exposed


def test_the_bounds_are_the_documented_ones() -> None:
    assert schema.MAX_EVENTS == 1000
    assert "at most 1000\nevents" in DOC
    assert schema.BODY_MAX_BYTES == 4_194_304
    assert "4 MiB (4,194,304 bytes)" in DOC
    assert schema.COMPONENTS_MAX_BYTES == 65_536
    assert "at most 65,536 bytes as JSON" in DOC
    assert schema.MAX_SECONDS == 604_800
    assert "from 0 to 604,800 (7 days)" in DOC
    assert schema.MAX_SHAPES == 2048
    assert schema.MAX_COUNTERS == 64
    assert "at most 64 names `[a-z0-9_]{1,64}`" in DOC
    assert redis_module.EVENTS_PER_KEY == 100
    assert "newest 100 events" in DOC
    assert redis_module.TRIM_BATCH == 5000
    assert "At most 5,000 events are dropped per script call" in DOC


def test_the_stored_bytes_are_the_documented_ones() -> None:
    defaults = ServerSettings.model_fields
    keep, max_bytes = defaults["events_keep"].default, defaults["events_max_bytes"].default
    assert schema.EVENT_MAX_BYTES == 16_384
    assert "at most 16 KiB (16,384 bytes) as stored" in DOC
    assert "| one event | 16,384 |" in DOC
    assert max_bytes == 2**30
    assert "`events_max_bytes` (1 GiB, 1,073,741,824 bytes)" in DOC
    assert f"1 GiB ({max_bytes // schema.EVENT_MAX_BYTES:,} events of 16 KiB)" in DOC
    # The whole index: events_keep events of the largest size.
    assert keep == 2_000_000
    assert f"30.5 GiB ({keep * schema.EVENT_MAX_BYTES:,} bytes" in DOC
    assert f"{keep * schema.EVENT_MAX_BYTES / 2**30:.1f}" == "30.5"
