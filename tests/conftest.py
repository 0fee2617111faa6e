"""Shared fixtures. Real Prometheus/Alertmanager come from tests/support/processes.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import Alertmanager, webhook_alertmanager_config


@pytest.fixture
def alertmanager_factory(tmp_path: Path) -> Iterator[object]:
    """Start real Alertmanagers that deliver to a given bot URL; all are stopped after the test."""
    started: list[Alertmanager] = []

    def start(bot_url: str, **options: object) -> Alertmanager:
        am = Alertmanager(tmp_path / f"am{len(started)}", webhook_alertmanager_config(bot_url, **options))  # type: ignore[arg-type]
        started.append(am)
        return am

    yield start
    for am in started:
        am.stop()
