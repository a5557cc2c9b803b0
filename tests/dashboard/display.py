"""The dashboard's display rules (``dashboard.js``, docs/dashboard.md), written again
in Python so the tests can say what the page must show for a report's numbers.

Decimals follow JavaScript's ``Number.prototype.toFixed``: the exact binary value of
the float, rounded to the nearest, a tie away from zero. ``Decimal(float)`` is exact,
so ``ROUND_HALF_UP`` on it is the same rule. Arithmetic (``x * 100``, ``n / 1024``) is
done in floats in the same order as the script, so both see the same binary values.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def fixed(value: float, digits: int) -> str:
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def grouped(text: str) -> str:
    whole, dot, fraction = text.partition(".")
    return f"{int(whole):,}{dot}{fraction}"


def count(n: int) -> str:
    return f"{n:,}"


def rate(r: float | None) -> str:
    return "n/a" if r is None else fixed(r * 100, 1) + "%"


def hours(h: float) -> str:
    return grouped(fixed(h, 2)) + " h"


def money(x: float | None, currency: str) -> str:
    if x is None:
        return "n/a"
    amount = grouped(fixed(x, 2))
    return "$" + amount if currency == "USD" else f"{amount} {currency}"


def size(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    value = n / 1024
    unit = 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{fixed(value, 1)} {_UNITS[unit]}"


def share(part: float, whole: float) -> str:
    return fixed(part / whole * 100, 1) + "%" if whole > 0 else "n/a"


def when(epoch: float) -> str:
    # A JavaScript Date holds whole milliseconds, the product truncated.
    millis = math.trunc(epoch * 1000)
    moment = datetime.fromtimestamp(millis // 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")
