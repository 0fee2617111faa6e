"""The bot's PagerDuty receiver pointed at the PagerDuty fake (tests/fakes/pagerduty.py), for bot configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakes.pagerduty import FakePagerDuty

ROUTING_KEY = "0123456789abcdef0123456789abcdef"


def pagerduty_receiver(directory: Path, pagerduty: FakePagerDuty, **options: Any) -> dict[str, Any]:
    """A `receivers` entry named "pd" sending to the fake, its routing key written to `directory`/pd_key;
    `options` add keys or change them."""
    key_file = directory / "pd_key"
    key_file.write_text(ROUTING_KEY + "\n")
    return {"type": "pagerduty", "name": "pd", "routing_key_file": str(key_file), "url": pagerduty.url, **options}
