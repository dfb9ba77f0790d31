"""One form for durations on every command: ``90s``, ``30m``, ``8h``, ``2d``, ``1w``, ``1h30m`` or plain seconds.

Units are lower-case, each at most once and largest first, digits ASCII: ``1h1h``, ``30m1h``, ``1M`` (a month? a
minute?) and ``１h`` are typos to point out, not durations to guess.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile("|".join(["([0-9]{1,12})", "".join(rf"(?:([0-9]{{1,12}}){unit})?" for unit in _UNIT_SECONDS)]))
FORMS = "90s, 30m, 8h, 2d, 1w, 1h30m (units largest first, each once) or plain seconds"
_LONGEST = timedelta.max.total_seconds()


class DurationError(ValueError):
    """A duration that cannot be used, phrased as one line."""


def parse_duration(text: str, minimum: timedelta = timedelta(0), maximum: timedelta | None = None) -> timedelta:
    """``"1h30m"`` -> 90 minutes, ``"600"`` -> 10 minutes; outside [minimum, maximum] or malformed names the forms."""
    compact = text.strip()
    bounds = f"from {_short(minimum)}" + (f" to {_short(maximum)}" if maximum is not None else "")
    match = _DURATION.fullmatch(compact)
    shown = text if len(text) <= 40 else text[:40] + "..."
    if not compact or match is None:
        raise DurationError(f"bad duration {shown!r}: expected {FORMS}, {bounds}")
    plain, *parts = match.groups()
    if plain is not None:
        seconds = int(plain)
    else:
        seconds = sum(int(n) * size for n, size in zip(parts, _UNIT_SECONDS.values()) if n is not None)
    if seconds < minimum.total_seconds() or seconds > (maximum.total_seconds() if maximum is not None else _LONGEST):
        raise DurationError(f"duration {shown!r} out of range: {bounds}")
    return timedelta(seconds=seconds)


def _short(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in _UNIT_SECONDS.items():
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
