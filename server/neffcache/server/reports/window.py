"""Report windows and groupings as the API takes them: ``7d``, epoch seconds or an
ISO date or time; ``by=namespace,day``. A bad value is a ValueError whose message is
the one line the API answers with."""

from __future__ import annotations

import functools
import math
import re
from datetime import datetime, timezone

GROUPINGS = ("namespace", "model", "day", "job")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*")
_NUMBER = re.compile(r"\s*[0-9]+(?:\.[0-9]+)?\s*")
DAY = 86400.0
# The instants a window may name: no event is older than the epoch, and dates past
# the year 9999 cannot be shown. Times outside are taken as these bounds, so that
# ``since=100000w`` means "from the start" instead of a time no date can render.
EARLIEST = 0.0
LATEST = datetime(9999, 12, 31, tzinfo=timezone.utc).timestamp()


def parse_time(text: str, now: float, what: str) -> float:
    """Epoch seconds: ``now`` minus a duration (``90m``, ``7d``: a unit is required),
    ``now``, epoch seconds (``1764547200``), or an ISO date or time (``2026-11-01``,
    ``2026-11-01T12:00Z``; UTC unless it says otherwise). An instant before the
    epoch is the epoch, one after ``LATEST`` is ``LATEST``."""
    return min(max(_instant(text, now, what), EARLIEST), LATEST)


def _instant(text: str, now: float, what: str) -> float:
    lowered = text.strip().lower()
    if lowered == "now":
        return now
    duration = _DURATION.fullmatch(lowered)
    if duration:
        # A duration of hundreds of digits is infinite: -inf, bounded by the caller.
        return now - float(duration[1]) * _UNITS[duration[2]]
    if _NUMBER.fullmatch(lowered):
        value = float(lowered)
        if math.isfinite(value):
            return value
    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{what} {text[:40]!r} is neither a duration (7d, 12h), epoch seconds, "
            "nor a date (2026-11-01)"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def parse_by(text: str) -> tuple[str, ...]:
    """The groupings of ``by=namespace,model``: known names, in the order given, each once."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError(f"by: give one or more of {','.join(GROUPINGS)}")
    unknown = [name for name in names if name not in GROUPINGS]
    if unknown:
        raise ValueError(f"by: {unknown[0][:40]!r} is not one of {','.join(GROUPINGS)}")
    return tuple(dict.fromkeys(names))


def day_of(at: float) -> str:
    """The UTC date of an instant, ``2026-11-30``."""
    return datetime.fromtimestamp(at, timezone.utc).date().isoformat()


def day_index(at: float) -> int:
    """Days since the epoch, UTC: equal for instants of one UTC date."""
    return math.floor(at / DAY)


@functools.lru_cache(maxsize=4096)
def day_name(index: int) -> str:
    return day_of(index * DAY)
