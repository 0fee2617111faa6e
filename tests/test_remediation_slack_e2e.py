"""Remediation from Slack end to end: signed clicks and commands into the running bot, the Slack fake, and a
real sshd whose forced command is scripts/gpu-node-actions.sh. A responder's click requests a restart of
dcgm-exporter, a responder may not approve it, an admin does, the host gets the fixed verb and the alert's
thread shows the outcome; only actions an executor is configured for show a button."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.models import AlertState
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.payloads import am_alert, webhook
from tests.support.slack_requests import RESPONDER, click_payload, interactive_config, post_click, post_command
from tests.support.sshd import SSHD, Sshd

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)"),
]

RESTART = "restart-dcgm-exporter"
ADMIN = ("U0ADMIN001", "ada")


def remediating_config(tmp_path: Path, slack: FakeSlack, sshd: Sshd | None) -> dict[str, Any]:
    config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"], permissions={"approve": "admin"})
    config["interactivity"]["roles"].append({"name": "admin", "users": [ADMIN[0]]})
    if sshd is not None:
        ssh = {
            "address": "127.0.0.1",
            "port": sshd.port,
            "user": sshd.user,
            "key_file": str(sshd.key_file),
            "known_hosts": str(sshd.known_hosts),
        }
        config["remediation"] = {
            "hosts": {"k-ai-01": {"ssh": ssh}},
            "actions": {RESTART: {"approval": True}},
            "poll_interval": "200ms",
        }
    return config


def buttons(message: SlackMessage) -> list[str]:
    return [e["action_id"] for b in message.all_blocks if b["type"] == "actions" for e in b["elements"]]


async def post_alert(
    bot: RunningBot, slack: FakeSlack, alertname: str, **labels: str
) -> tuple[AlertState, SlackMessage]:
    alert = am_alert(alertname, **labels)
    async with aiohttp.ClientSession() as http:
        await http.post(bot.webhook_url, json=webhook([alert], group_key=f'{{}}:{{alertname="{alertname}"}}'))

    async def posted() -> tuple[AlertState, SlackMessage] | None:
        stored = [a for a in await bot.runtime.store.list_alerts("firing") if a.alertname == alertname]
        roots = [m for m in slack.top_level() if stored and stored[0].key in str(m.all_blocks)]
        return (stored[0], roots[0]) if roots else None

    found: tuple[AlertState, SlackMessage] = await eventually(posted, timeout=20)
    return found


async def test_a_click_requests_a_restart_an_admin_approves_in_slack_and_the_host_runs_it(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd
) -> None:
    async with running_bot(tmp_path, remediating_config(tmp_path, slack, sshd)) as bot:
        alert, root = await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-01")
        assert RESTART in buttons(root)

        click = click_payload(RESTART, alert.key, root.ts, RESPONDER, slack.response_url())
        assert await post_click(bot.url, click) == 200
        [requested] = await eventually(lambda: slack.responses, timeout=10)
        assert "waits for approval" in requested["text"]
        run_id = int(requested["text"].split("(run #", 1)[1].split(")", 1)[0])

        refused = await post_command(bot.url, f"approve {run_id}", user=RESPONDER)
        assert refused == "Sorry, `approve` needs the admin role."
        run = await bot.runtime.store.get_action_run(run_id)
        assert run is not None and run.state == "requested"

        approved = await post_command(bot.url, f"approve {run_id}", user=ADMIN)
        assert approved.startswith(f"Approved run #{run_id}")
        await eventually(lambda: sshd.verbs() == [RESTART], timeout=30)
        replies = lambda: [reply.text for reply in slack.replies(root)]  # noqa: E731
        await eventually(lambda: any(f"{RESTART} on k-ai-01 done" in text for text in replies()), timeout=20)
        assert any("slack:U0ADMIN001 ada approved" in text for text in replies())
        audit = [(e.actor, e.action, e.outcome) for e in await bot.runtime.store.audit_log(alert.starts_at)]
        assert ("slack:U0RESPOND1 alice", "approve", "refused") in audit
        assert ("slack:U0RESPOND1 alice", f"run {RESTART}", "done") in audit


async def test_a_crafted_host_label_cannot_pick_another_host(tmp_path: Path, slack: FakeSlack, sshd: Sshd) -> None:
    async with running_bot(tmp_path, remediating_config(tmp_path, slack, sshd)) as bot:
        alert, _ = await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-02", instance="k-ai-01:9400")
        answer = await post_command(bot.url, f"run {RESTART} {alert.fingerprint}", user=ADMIN)
        assert answer.startswith("Refused: host 'k-ai-02' is not a configured remediation target")
        assert await bot.runtime.store.action_runs(alert.starts_at) == []
        assert sshd.verbs() == []


async def test_only_actions_with_an_executor_show_a_button(tmp_path: Path, slack: FakeSlack, sshd: Sshd) -> None:
    async with running_bot(tmp_path, remediating_config(tmp_path, slack, sshd)) as bot:
        _, root = await post_alert(bot, slack, "GPUMissing", host="k-ai-01")
        shown = buttons(root)
        assert "collect-diagnostics" in shown  # an SSH verb
        assert "drain-node" not in shown  # no executor runs it here (and it is dangerous, off by default)


async def test_without_remediation_no_action_button_is_shown(tmp_path: Path, slack: FakeSlack) -> None:
    async with running_bot(tmp_path, remediating_config(tmp_path, slack, None)) as bot:
        _, root = await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-01")
        assert buttons(root)[0] == "ack"
        assert RESTART not in buttons(root)
