"""Durations in the configuration: a number of seconds or a Prometheus-style duration.

The text form follows Prometheus's model.ParseDuration: units y w d h m s ms, each at most once and from the
largest to the smallest (`1h30m`, never `30m1h` or `1m1m`), and `0` alone. Unlike Prometheus, a unit's number may
have decimals (`1.5h`), as the bot always accepted.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

# Largest first: the order the units must appear in. `ms` is tried before `m` so `5ms` is not `5m` then `s`.
_DURATION_UNITS = {"y": 365 * 86400, "w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_UNIT_ORDER = list(_DURATION_UNITS)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)")
_EXAMPLES = "such as 30s, 15m or 2h"


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Prometheus-style duration such as `90s`, `15m`, `1h30m`, `30d`."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration {_EXAMPLES}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        seconds = _duration_text(value)
    else:
        raise ValueError(f"expected a duration {_EXAMPLES}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def _duration_text(value: str) -> float:
    text = value.strip()
    if text == "0":
        return 0.0
    parts = list(_DURATION_PART.finditer(text))
    if not parts or "".join(part.group(0) for part in parts) != text:
        raise ValueError(f"{value!r} is not a duration {_EXAMPLES}")
    units = [part.group(2) for part in parts]
    repeated = next((unit for unit in units if units.count(unit) > 1), None)
    if repeated is not None:
        raise ValueError(f"{value!r}: the unit {repeated} is used twice; write each unit once, as in 1h30m")
    ranks = [_UNIT_ORDER.index(unit) for unit in units]
    if ranks != sorted(ranks):
        raise ValueError(f"{value!r}: units go from the largest to the smallest ({' '.join(_UNIT_ORDER)}), as in 1h30m")
    return sum(float(part.group(1)) * _DURATION_UNITS[part.group(2)] for part in parts)


Duration = Annotated[float, BeforeValidator(parse_duration)]
