"""One form for durations on every command: ``90s``, ``30m``, ``8h``, ``2d``, ``1w``, ``1h30m`` or plain seconds."""

from __future__ import annotations

import re
from datetime import timedelta

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+)([smhdw])")
_DURATION = re.compile(r"\d+|(?:\d+[smhdw])+")
FORMS = "90s, 30m, 8h, 2d, 1w, 1h30m or plain seconds"


class DurationError(ValueError):
    """A duration that cannot be used, phrased as one line."""


def parse_duration(text: str, minimum: timedelta = timedelta(0), maximum: timedelta | None = None) -> timedelta:
    """``"1h30m"`` -> 90 minutes, ``"600"`` -> 10 minutes; outside [minimum, maximum] or malformed names the forms."""
    compact = text.strip().lower()
    bounds = f"from {_short(minimum)}" + (f" to {_short(maximum)}" if maximum is not None else "")
    if not _DURATION.fullmatch(compact):
        raise DurationError(f"bad duration {text!r}: expected {FORMS}, {bounds}")
    if compact.isdigit():
        seconds = int(compact)
    else:
        seconds = sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(compact))
    if seconds < minimum.total_seconds() or (maximum is not None and seconds > maximum.total_seconds()):
        raise DurationError(f"duration {text!r} out of range: {bounds}")
    return timedelta(seconds=seconds)


def _short(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in sorted(_UNIT_SECONDS.items(), key=lambda item: -item[1]):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
