"""ISO-8601 UTC timestamps, as ``datetime.isoformat`` writes them, made cheaply.

A cast transition stamps its events, manifest entries and state document; with ``datetime``
each stamp builds a timezone-aware datetime and formats all of it. Here the date-and-time part
is formatted once per whole second (by ``datetime`` itself) and kept, so a stamp in a second
already seen is one f-string. Guarantee: the text is exactly what the ``datetime`` expression in
each function's docstring returns for the same ``t`` (``tests/domain/test_timestamps.py``).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

_last_second: tuple[int, str] = (0, "1970-01-01T00:00:00")  # replaced whole: safe across threads


def _parts(t: float) -> tuple[str, int]:
    """``t``'s date-and-time text to the second, and its microseconds, rounded as
    ``datetime.fromtimestamp`` rounds them (half to even)."""
    global _last_second
    frac, whole = math.modf(t)
    micro = round(frac * 1e6)
    second = int(whole)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    elif micro < 0:
        second, micro = second - 1, micro + 1_000_000
    cached_second, text = _last_second
    if cached_second != second:
        text = datetime.fromtimestamp(second, tz=UTC).isoformat()[:19]
        _last_second = (second, text)
    return text, micro


def iso_utc(t: float) -> str:
    """``datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")`` (microseconds,
    left out when zero)."""
    text, micro = _parts(t)
    return f"{text}.{micro:06d}Z" if micro else f"{text}Z"


def iso_utc_ms(t: float) -> str:
    """``datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")``."""
    text, micro = _parts(t)
    return f"{text}.{micro // 1000:03d}Z"


def iso_now_ms() -> str:
    """The current time as :func:`iso_utc_ms` writes it."""
    return iso_utc_ms(time.time())
