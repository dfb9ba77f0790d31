"""Lease arithmetic: TTL parsing, expiry stamps, time left."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuyard.jobs.duration import DurationError, parse_duration
from gpuyard.jobs.ephemeral.ttl import MAX_TTL, describe_remaining, format_expiry, parse_ttl

NOW = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)


@pytest.mark.parametrize("text, expected", [
    ("30m", timedelta(minutes=30)),
    ("8h", timedelta(hours=8)),
    ("2d", timedelta(days=2)),
    ("1w", timedelta(weeks=1)),
    ("1h30m", timedelta(hours=1, minutes=30)),
    (" 8h ", timedelta(hours=8)),
    ("30d", MAX_TTL),
    ("90s", timedelta(seconds=90)),
    ("3600", timedelta(hours=1)),
])
def test_parse_ttl_accepts_compact_durations(text, expected):
    assert parse_ttl(text) == expected


@pytest.mark.parametrize("text", ["", "h", "8x", "-1h", "1.5h", "8 h", "h8", "1h 30m", "1e3", "1h1h", "30m1h", "8H",
                                  "1M", "１h", "1_0h", "+8h", "0x10", "1d2w", "1hh", "m30"])
def test_parse_ttl_rejects_malformed_durations_naming_the_accepted_forms(text):
    with pytest.raises(DurationError, match=r"^bad duration .*: expected 90s, 30m, 8h, 2d, 1w, 1h30m \(units largest "
                                            r"first, each once\) or plain seconds"):
        parse_ttl(text)


@pytest.mark.parametrize("text", ["8", "0h", "0h0m", "59s", "31d", "5w", "999999999999", "999999999999w"])
def test_parse_ttl_rejects_leases_outside_a_minute_to_30_days(text):
    with pytest.raises(DurationError, match=r"out of range: from 1m to 30d"):
        parse_ttl(text)


@pytest.mark.parametrize("text, seconds", [("0", 0), ("90s", 90), ("1m30s", 90), ("2d", 172800), ("1w", 604800),
                                           ("1w2d3h4m5s", 788645)])
def test_one_duration_form_for_every_command(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


@given(st.integers(min_value=1, max_value=30 * 24 * 60))
def test_any_whole_minute_count_up_to_the_limit_round_trips(minutes):
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    text = "".join(f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (mins, "m")) if n)
    assert parse_ttl(text) == timedelta(minutes=minutes)


def test_expiry_is_iso_8601_utc_whatever_the_input_zone():
    assert format_expiry(NOW + parse_ttl("8h")) == "2026-12-02T23:00:00Z"
    assert format_expiry(datetime(2026, 12, 3, 1, 0, tzinfo=timezone(timedelta(hours=2)))) == "2026-12-02T23:00:00Z"


@pytest.mark.parametrize("expires_at, text", [
    (NOW + timedelta(hours=5, minutes=12, seconds=40), "5h12m left"),
    (NOW + timedelta(days=1, hours=2), "1d2h left"),
    (NOW + timedelta(seconds=20), "0m left"),
    (NOW, "expired 0m ago"),
    (NOW - timedelta(hours=2), "expired 2h ago"),
    (NOW - timedelta(days=3, minutes=1), "expired 3d1m ago"),
])
def test_describe_remaining(expires_at, text):
    assert describe_remaining(expires_at, NOW) == text
