"""Retry-After values as services send them: delta-seconds or an HTTP date."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.retry_after import retry_after_seconds


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("7", 7.0), (" 1.5 ", 1.5), ("-3", 0.0), ("", None), (None, None), ("soon", None), ("inf", None), ("nan", None)],
)
def test_seconds_and_unreadable_values(value: str | None, seconds: float | None) -> None:
    assert retry_after_seconds(value) == seconds


def test_an_http_date_counts_from_now() -> None:
    later = (datetime.now(UTC) + timedelta(seconds=120)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert 100 < (retry_after_seconds(later) or 0) <= 120
    earlier = (datetime.now(UTC) - timedelta(seconds=120)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert retry_after_seconds(earlier) == 0.0
