"""Instance prices: the shipped table (``prices.toml``, beside this module) with the
``price_table`` setting's file over it.

>>> load_prices(None).hourly("trn1.32xlarge")
21.5
>>> load_prices(None).hourly("p5.48xlarge") is None  # unknown: unpriced, never guessed
True

A price file has the shipped table's form: ``[instances."TYPE"]`` tables, each with
``usd_per_hour`` (a number >= 0) or ``unpriced`` (why there is none), and optionally
``region``, ``listed``, ``source`` and ``note``. An override replaces the shipped entry
of its instance type whole and adds new types. Anything else in the file is a
ConfigError naming the file and the fix: a server must not start with money figures
it cannot compute as configured.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from neffcache.server.config_errors import ConfigError

CURRENCY = "USD"
_SHIPPED = "prices.toml"
_TYPE = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")
_TEXT_FIELDS = ("region", "listed", "source", "note", "unpriced")
_FIELDS = ("usd_per_hour", *_TEXT_FIELDS)
_TOP_LEVEL = ("instances", "checked", "currency")


@dataclass(frozen=True)
class Price:
    """One instance type's on-demand price, or why it has none."""

    instance_type: str
    usd_per_hour: float | None  # None: known type, no price (``unpriced`` says why)
    region: str = ""
    listed: str = ""  # the date the source listed the price
    source: str = ""  # where it was found
    note: str = ""
    unpriced: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "usd_per_hour": self.usd_per_hour,
            "region": self.region,
            "listed": self.listed,
            "source": self.source,
        }


@dataclass(frozen=True)
class PriceTable:
    prices: Mapping[str, Price]
    shipped_checked: str  # when the shipped prices were checked
    file: Path | None = None  # the override file, if any

    @property
    def label(self) -> str:
        """``shipped DATE`` or ``file PATH`` (the report's ``prices.table``)."""
        return f"file {self.file}" if self.file is not None else f"shipped {self.shipped_checked}"

    def price(self, instance_type: str | None) -> Price | None:
        if not instance_type:
            return None
        return self.prices.get(instance_type.strip().lower())

    def hourly(self, instance_type: str | None) -> float | None:
        """USD per hour, or None: no instance type, an unknown one, or one unpriced."""
        found = self.price(instance_type)
        return None if found is None else found.usd_per_hour


@functools.lru_cache(maxsize=8)
def load_prices(path: Path | None) -> PriceTable:
    """The shipped table, with the file at ``path`` over it (cached per path: the file
    is read at start-up; a change needs a restart, as every setting does)."""
    shipped_text = resources.files(__package__ or __name__).joinpath(_SHIPPED).read_text()
    shipped = _parse(shipped_text, f"the shipped {_SHIPPED}")
    checked = shipped.get("checked")
    prices = _entries(shipped, f"the shipped {_SHIPPED}")
    if path is None:
        return PriceTable(prices, str(checked or ""))
    what = f"price_table {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"{what}: cannot read it ({reason}); fix the setting or the file"
        ) from None
    prices = {**prices, **_entries(_parse(text, what), what)}
    return PriceTable(prices, str(checked or ""), Path(path))


def _parse(text: str, what: str) -> dict[str, Any]:
    toml = _toml_module()
    try:
        parsed: dict[str, Any] = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigError(f"{what} is not valid TOML: {exc}") from None
    unknown = sorted(set(parsed) - set(_TOP_LEVEL))
    if unknown:
        raise ConfigError(
            f'{what}: unknown key {unknown[0]!r}; a price file has [instances."TYPE"] '
            "tables (and optionally checked, currency)"
        )
    currency = parsed.get("currency", CURRENCY)
    if currency != CURRENCY:
        raise ConfigError(f"{what}: currency {currency!r}: prices are in {CURRENCY} only")
    return parsed


def _entries(parsed: Mapping[str, Any], what: str) -> dict[str, Price]:
    table = parsed.get("instances", {})
    if not isinstance(table, dict):
        raise ConfigError(f'{what}: instances must be tables: [instances."trn1.32xlarge"]')
    return {name: _entry(name, fields, what) for name, fields in table.items()}


def _entry(name: str, fields: Any, what: str) -> Price:
    where = f'{what}: instances."{name}"'
    if not _TYPE.fullmatch(name):
        raise ConfigError(f"{where}: not an instance type name (such as trn1.32xlarge)")
    if not isinstance(fields, dict):
        raise ConfigError(f"{where} must be a table with usd_per_hour")
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; use {', '.join(_FIELDS)}")
    for field in _TEXT_FIELDS:
        if not isinstance(fields.get(field, ""), str):
            raise ConfigError(f"{where}: {field} must be a string")
    price = fields.get("usd_per_hour")
    has_reason = bool(fields.get("unpriced"))
    if (price is None) == (not has_reason):
        raise ConfigError(f"{where}: give usd_per_hour, or unpriced (why there is no price)")
    if price is not None and (
        isinstance(price, bool)
        or not isinstance(price, (int, float))
        or not math.isfinite(price)
        or price < 0
    ):
        raise ConfigError(f"{where}: usd_per_hour {price!r} must be a number >= 0")
    return Price(
        name,
        None if price is None else float(price),
        **{field: fields.get(field, "") for field in _TEXT_FIELDS},
    )


def _toml_module() -> Any:
    # tomllib is in the standard library from Python 3.11; tomli is its backport.
    for name in ("tomllib", "tomli"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ConfigError("reading price tables needs Python 3.11 or later, or: pip install tomli")
