"""Durations follow Prometheus's model.ParseDuration: units y w d h m s ms, each once, largest first; `0` alone."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from bot.config import ConfigError, load_config, parse_duration

# Largest first, in milliseconds, as Prometheus's model.Duration.String prints them.
UNITS_MS = {"y": 365 * 86_400_000, "w": 604_800_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
UNITS = list(UNITS_MS)


def prometheus_text(milliseconds: int) -> str:
    """What Prometheus prints for a duration (model.Duration.String): `0s`, or each non-zero unit, largest first."""
    parts = []
    for unit, size in UNITS_MS.items():
        count, milliseconds = divmod(milliseconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0),
        ("0s", 0),
        ("1y", 31_536_000),
        ("1y2w3d4h5m6s7ms", 31_536_000 + 1_209_600 + 259_200 + 14_400 + 300 + 6 + 0.007),
        ("90m", 5400),
        ("1.5h", 5400),
        (" 15m ", 900),
    ],
)
def test_prometheus_durations(text: str, seconds: float) -> None:
    assert math.isclose(parse_duration(text), seconds)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("30s1h", "units go from the largest to the smallest (y w d h m s ms)"),
        ("1ms1s", "units go from the largest to the smallest"),
        ("1h1d", "units go from the largest to the smallest"),
        ("1m1m", "the unit m is used twice"),
        ("1h30m1h", "the unit h is used twice"),
        ("00", "is not a duration such as 30s, 15m or 2h"),
    ],
)
def test_refused_durations_say_why(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=rf"^'{text}'.*{re.escape(problem)}"):
        parse_duration(text)


def test_a_refused_duration_is_reported_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"store": {"dedup_window": "30s1h"}}))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert error.value.problems == [
        "store.dedup_window: '30s1h': units go from the largest to the smallest (y w d h m s ms), as in 1h30m"
    ]


@given(st.integers(min_value=0, max_value=10 * UNITS_MS["y"]))
def test_every_duration_prometheus_prints_parses_back(milliseconds: int) -> None:
    assert math.isclose(parse_duration(prometheus_text(milliseconds)), milliseconds / 1000, abs_tol=1e-9)


def _each_once_largest_first(units: list[str]) -> bool:
    ranks = [UNITS.index(unit) for unit in units]
    return all(a < b for a, b in itertools.pairwise(ranks))


@given(
    st.lists(st.sampled_from(UNITS), min_size=2, max_size=7).filter(lambda units: not _each_once_largest_first(units)),
    st.data(),
)
def test_units_out_of_order_or_repeated_are_refused(units: list[str], data: st.DataObject) -> None:
    text = "".join(f"{data.draw(st.integers(min_value=0, max_value=999))}{unit}" for unit in units)
    with pytest.raises(ValueError, match=r"is used twice|units go from the largest to the smallest"):
        parse_duration(text)
