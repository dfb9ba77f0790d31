"""Lease arithmetic: ``8h``-style TTLs, ISO-8601 UTC expiry stamps, time left."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

MAX_TTL = timedelta(days=30)
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+)([mhdw])")
_TTL = re.compile(r"(?:\d+[mhdw])+")
ACCEPTED = "a positive duration like 30m, 8h, 2d, 1w or 1h30m (units m, h, d, w; at most 30d)"


class TTLError(ValueError):
    """A TTL that cannot be used, phrased as one line."""


def parse_ttl(text: str) -> timedelta:
    """``"1h30m"`` -> 90 minutes; anything else names the accepted forms."""
    compact = text.strip().lower()
    if not _TTL.fullmatch(compact):
        raise TTLError(f"bad TTL {text!r}: expected {ACCEPTED}")
    ttl = timedelta(seconds=sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(compact)))
    if not timedelta(0) < ttl <= MAX_TTL:
        raise TTLError(f"bad TTL {text!r}: expected {ACCEPTED}")
    return ttl


def format_expiry(moment: datetime) -> str:
    """An aware datetime as ``2026-12-02T22:49:10Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _compact(delta: timedelta) -> str:
    minutes = int(delta.total_seconds()) // 60
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    minutes_part = f"{minutes}m" if minutes or not (days or hours) else ""
    return (f"{days}d" if days else "") + (f"{hours}h" if hours else "") + minutes_part


def describe_remaining(expires_at: datetime, now: datetime) -> str:
    """``"5h12m left"`` or ``"expired 2h ago"``."""
    if expires_at > now:
        return f"{_compact(expires_at - now)} left"
    return f"expired {_compact(now - expires_at)} ago"
