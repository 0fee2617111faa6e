"""Retry-After (RFC 9110): how long a service asked us to wait, shared by every HTTP client of the bot."""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or an HTTP date); None when absent or unreadable."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
