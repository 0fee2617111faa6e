"""Durations in the configuration: a number of seconds or a Prometheus-style duration."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Prometheus-style duration such as `90s`, `15m`, `1h30m`, `30d`."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 15m or 2h")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        parts = list(_DURATION_PART.finditer(text))
        if not parts or "".join(p.group(0) for p in parts) != text:
            raise ValueError(f"{value!r} is not a duration such as 30s, 15m or 2h")
        seconds = sum(float(p.group(1)) * _DURATION_UNITS[p.group(2)] for p in parts)
    else:
        raise ValueError("expected a duration such as 30s, 15m or 2h")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]
