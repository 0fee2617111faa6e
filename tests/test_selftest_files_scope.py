"""`selftest` checks the Slack token's files:write scope when the receiver shows graphs (the fake Slack sends
the token's scopes in x-oauth-scopes, as Slack does)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.config import SlackReceiver
from bot.selftest import checks
from bot.selftest.steps import StepFailed
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as slack:
        yield slack


def receiver(tmp_path: Path, fake: FakeSlack, **options: object) -> SlackReceiver:
    (tmp_path / "token").write_text(DEFAULT_TOKEN)
    config = {"type": "slack", "name": "s", "channel": "#gpu-alerts", "token_file": "token", "api_url": fake.api_url}
    return SlackReceiver.model_validate({**config, **options}, context={"base_dir": tmp_path})


async def test_graphs_need_files_write(tmp_path: Path, fake: FakeSlack) -> None:
    assert "member of #gpu-alerts" in await checks.slack_receiver(receiver(tmp_path, fake))
    fake.scopes = [s for s in fake.scopes if s != "files:write"]
    with pytest.raises(StepFailed, match="files:write"):
        await checks.slack_receiver(receiver(tmp_path, fake))
    # Without graphs the scope is not needed.
    assert "member of" in await checks.slack_receiver(receiver(tmp_path, fake, graphs=False))
