"""Sizes and durations for people: one spelling across the admin commands, the
reports and the explanations."""

from __future__ import annotations


def human_bytes(value: int | None) -> str:
    """``512 B``, ``29.2 KiB``, ``1.5 GiB`` (powers of 1024); ``none`` for no limit."""
    if value is None:
        return "none"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def human_seconds(value: float | None) -> str:
    """``45s``, ``12.5m``, ``3h``, ``1.2d``; ``none`` for no limit."""
    if value is None:
        return "none"
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= seconds:
            return f"{value / seconds:.1f}{unit}".replace(".0" + unit, unit)
    return f"{value:.0f}s"
