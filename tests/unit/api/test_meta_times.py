"""fleet.api.meta time helpers: the one metav1.Time format and parser every role uses."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.api import meta

UTC = dt.UTC


@pytest.mark.parametrize(("t", "text"), [
    (dt.datetime(2026, 1, 2, 3, 4, 5, 999999, tzinfo=UTC), "2026-01-02T03:04:05Z"),
    (dt.datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05Z"),  # naive: taken as UTC
    (dt.datetime(2026, 1, 2, 5, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))), "2026-01-02T03:04:05Z"),
    (0, "1970-01-01T00:00:00Z"),
    (1.9, "1970-01-01T00:00:01Z"),
])
def test_format_time(t, text: str) -> None:
    assert meta.format_time(t) == text


@pytest.mark.parametrize(("value", "epoch"), [
    ("1970-01-01T00:00:10Z", 10.0),
    ("1970-01-01T02:00:10+02:00", 10.0),
    ("1970-01-01T00:00:10.5Z", 10.5),
    ("1970-01-01T00:00:10", 10.0),  # no zone: UTC
    ("", None), (None, None), (5, None), ("yesterday", None),
])
def test_parse_time_and_epoch(value, epoch) -> None:
    assert meta.parse_epoch(value) == epoch
    t = meta.parse_time(value)
    assert (t is None) == (epoch is None) and (t is None or t.tzinfo is not None)


def test_now_round_trips() -> None:
    assert meta.parse_time(meta.now_rfc3339()) is not None
