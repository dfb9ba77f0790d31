"""Lease arithmetic: TTLs (``gpuyard.jobs.duration`` forms), ISO-8601 UTC expiry stamps, time left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuyard.jobs.duration import parse_duration

MIN_TTL = timedelta(minutes=1)
MAX_TTL = timedelta(days=30)


def parse_ttl(text: str) -> timedelta:
    """A lease's lifetime: ``"1h30m"`` -> 90 minutes, between a minute and 30 days."""
    return parse_duration(text, MIN_TTL, MAX_TTL)


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
