"""The approval message of a remediation run in the alert's Slack thread, end to end: signed clicks into the
running bot, the Slack fake and a real sshd. A responder's click requests restart-dcgm-exporter; the thread gets
a message with Approve and Refuse buttons; a responder's Approve click is refused and nothing runs; an admin's
click approves, the host runs the verb and the message is updated in place, naming the admin, without buttons.
A Refuse click refuses; a click after expiry answers so."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bot.models import AlertState
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.slack_requests import RESPONDER, click_payload, post_click, post_command
from tests.support.sshd import SSHD, Sshd
from tests.test_remediation_slack_e2e import ADMIN, RESTART, buttons, post_alert, remediating_config

SECOND_ADMIN = ("U0ADMIN002", "grace")

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)"),
]


async def click(bot: RunningBot, slack: FakeSlack, action_id: str, value: str, ts: str, user: tuple[str, str]) -> str:
    """Click a button as `user`; the bot's answer (sent to the response URL)."""
    answered = len(slack.responses)
    assert await post_click(bot.url, click_payload(action_id, value, ts, user, slack.response_url())) == 200
    responses = await eventually(lambda: slack.responses[answered:], timeout=10)
    return str(responses[0]["text"])


async def request_restart(bot: RunningBot, slack: FakeSlack) -> tuple[AlertState, SlackMessage, int, SlackMessage]:
    """A responder's click asks for the restart; the run number and the approval message in the thread."""
    alert, root = await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-01")
    requested = await click(bot, slack, RESTART, alert.key, root.ts, RESPONDER)
    run_id = int(requested.split("(run #", 1)[1].split(")", 1)[0])

    def approval() -> SlackMessage | None:
        return next((m for m in slack.replies(root) if "approve-run" in buttons(m)), None)

    message: SlackMessage = await eventually(approval, timeout=10)
    return alert, root, run_id, message


def approval_config(tmp_path: Path, slack: FakeSlack, sshd: Sshd, **remediation: Any) -> dict[str, Any]:
    config = remediating_config(tmp_path, slack, sshd)
    config["remediation"].update(remediation)
    return config


async def test_an_admin_approves_with_the_button_and_the_message_says_so_in_place(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd
) -> None:
    async with running_bot(tmp_path, approval_config(tmp_path, slack, sshd)) as bot:
        _, _, run_id, message = await request_restart(bot, slack)
        assert buttons(message) == ["approve-run", "refuse-run"]
        values = [e["value"] for b in message.all_blocks if b["type"] == "actions" for e in b["elements"]]
        assert values == [str(run_id), str(run_id)]

        refused = await click(bot, slack, "approve-run", str(run_id), message.ts, RESPONDER)
        assert refused == "Sorry, `approve-run` needs the admin role."
        run = await bot.runtime.store.get_action_run(run_id)
        assert run is not None and run.state == "requested"
        assert buttons(message) == ["approve-run", "refuse-run"] and message.versions == []

        approved = await click(bot, slack, "approve-run", str(run_id), message.ts, ADMIN)
        assert approved.startswith(f"Approved run #{run_id}")
        await eventually(lambda: sshd.verbs() == [RESTART], timeout=30)
        assert len(message.versions) == 1  # updated in place: the same ts
        assert f"approved by <@{ADMIN[0]}>" in message.rendered_text()
        assert buttons(message) == []
        audit = [(e.actor, e.action, e.outcome) for e in await bot.runtime.store.audit_log(run.requested_at)]
        assert ("slack:U0RESPOND1 alice", "approve-run", "refused") in audit


async def test_a_refuse_click_refuses_the_run(tmp_path: Path, slack: FakeSlack, sshd: Sshd) -> None:
    async with running_bot(tmp_path, approval_config(tmp_path, slack, sshd)) as bot:
        _, _, run_id, message = await request_restart(bot, slack)
        answer = await click(bot, slack, "refuse-run", str(run_id), message.ts, ADMIN)
        assert answer.startswith(f"Refused run #{run_id}")
        run = await bot.runtime.store.get_action_run(run_id)
        assert run is not None and run.state == "refused"
        assert f"refused by <@{ADMIN[0]}>" in message.rendered_text() and buttons(message) == []

        again = await click(bot, slack, "approve-run", str(run_id), message.ts, ADMIN)
        assert f"run #{run_id} is refused, not waiting for approval" in again
        assert len(message.versions) == 1 and sshd.verbs() == []


async def test_a_click_after_expiry_answers_expired(tmp_path: Path, slack: FakeSlack, sshd: Sshd) -> None:
    # The periodic sweep would expire the run too; an hour apart, it leaves that to the click.
    config = approval_config(tmp_path, slack, sshd, approval_ttl="1ms", poll_interval="1h")
    async with running_bot(tmp_path, config) as bot:
        _, _, run_id, message = await request_restart(bot, slack)
        answer = await click(bot, slack, "approve-run", str(run_id), message.ts, ADMIN)
        assert f"run #{run_id} expired" in answer
        run = await bot.runtime.store.get_action_run(run_id)
        assert run is not None and run.state == "expired"
        assert "expired at" in message.rendered_text() and buttons(message) == []
        assert sshd.verbs() == []


async def test_when_the_approval_message_cannot_be_posted_the_run_waits_and_the_command_approves(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd
) -> None:
    async with running_bot(tmp_path, approval_config(tmp_path, slack, sshd)) as bot:
        alert, root = await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-01")
        await slack.go_down()
        requested = await post_command(bot.url, f"run {RESTART} {alert.fingerprint}", user=RESPONDER)
        assert "waits for approval" in requested
        run_id = int(requested.split("(run #", 1)[1].split(")", 1)[0])
        await slack.come_back()

        approved = await post_command(bot.url, f"approve {run_id}", user=ADMIN)
        assert approved.startswith(f"Approved run #{run_id}")
        await eventually(lambda: sshd.verbs() == [RESTART], timeout=30)
        assert not any("approve-run" in buttons(reply) for reply in slack.replies(root))


async def test_a_dangerous_run_keeps_its_buttons_until_the_second_approver(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd
) -> None:
    config = approval_config(tmp_path, slack, sshd, second_approver=True, actions={"reset-gpu": {"enabled": True}})
    config["interactivity"]["roles"][-1]["users"].append(SECOND_ADMIN[0])
    async with running_bot(tmp_path, config) as bot:
        alert, root = await post_alert(bot, slack, "GPUFallenOffBus", host="k-ai-01", gpu="0")
        requested = await post_command(bot.url, f"run reset-gpu {alert.fingerprint}", user=ADMIN)
        run_id = int(requested.split("(run #", 1)[1].split(")", 1)[0])
        message = await eventually(
            lambda: next((m for m in slack.replies(root) if "approve-run" in buttons(m)), None), timeout=10
        )

        first = await click(bot, slack, "approve-run", str(run_id), message.ts, ADMIN)
        assert "A second approver is needed." in first
        assert "a second approver is needed" in message.rendered_text()
        assert buttons(message) == ["approve-run", "refuse-run"]

        second = await click(bot, slack, "approve-run", str(run_id), message.ts, SECOND_ADMIN)
        assert second.startswith(f"Approved run #{run_id}")
        await eventually(lambda: sshd.verbs() == ["reset-gpu 0"], timeout=30)
        assert f"approved by <@{ADMIN[0]}>, <@{SECOND_ADMIN[0]}>" in message.rendered_text()
        assert buttons(message) == [] and len(message.versions) == 2
