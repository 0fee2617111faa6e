"""The bot's Slack receiver pointed at the Slack fake (tests/fakes/slack.py), for bot configs and sink tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack


def slack_receiver(directory: Path, slack: FakeSlack, **options: Any) -> dict[str, Any]:
    """A `receivers` entry named "slack" posting to #gpu-alerts on the fake with a 2 s timeout, the fake's token
    written to `directory`/slack_token; `options` add keys or change them."""
    token_file = directory / "slack_token"
    token_file.write_text(DEFAULT_TOKEN + "\n")
    return {
        "type": "slack",
        "name": "slack",
        "channel": "#gpu-alerts",
        "token_file": str(token_file),
        "api_url": slack.api_url,
        "timeout": "2s",
        **options,
    }
