"""An incident's fleet action from its card, end to end in the running bot: signed clicks, the Slack fake and a real
sshd. Six hosts lose their GPUs together; the incident's cause offers restarting dcgm-exporter on its hosts; a
responder clicks the card's button, an admin approves in the card's thread, the one configured host runs it and
the thread says so (an incident is no stored alert: its notes go to its thread directly)."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from bot.incident.model import incident_key
from bot.incident.record import IncidentAdvance
from bot.render.slack.incident import INCIDENT_ACTION
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import eventually, running_bot
from tests.support.payloads import am_alert, webhook
from tests.support.slack_requests import RESPONDER
from tests.support.sshd import SSHD, Sshd
from tests.test_remediation_approval_e2e import click
from tests.test_remediation_slack_e2e import ADMIN, RESTART, buttons, remediating_config

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)"),
]
HOSTS = [f"k-ai-{n:02d}" for n in range(1, 7)]
COOLING = {"key": "exporter", "title": "dcgm-exporter lost its GPUs", "reason": "on every host at once",
           "steps": ["Restart dcgm-exporter"], "actions": [RESTART]}  # fmt: skip


async def test_a_fleet_action_from_the_card_runs_once_approved_and_its_thread_says_so(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd
) -> None:
    async with running_bot(tmp_path, remediating_config(tmp_path, slack, sshd)) as bot:
        alerts = [am_alert("DCGMExporterNoGPUs", host=host) for host in HOSTS]
        async with aiohttp.ClientSession() as http:
            await http.post(bot.webhook_url, json=webhook(alerts, group_key='{}:{alertname="DCGMExporterNoGPUs"}'))

        def card() -> SlackMessage | None:
            return next((m for m in slack.top_level() if "DCGMExporterNoGPUs on 6 hosts" in m.rendered_text()), None)

        root: SlackMessage = await eventually(card, timeout=20)
        store = bot.runtime.store
        firing = await store.list_alerts("firing")
        [incident_id] = {await store.alert_incident(a.key) for a in firing}
        [host_alert] = [a.key for a in firing if a.labels["host"] == "k-ai-01"]
        assert incident_id is not None
        # What the analysis would have found:
        await store.advance_incidents({incident_id: IncidentAdvance({"cause": COOLING})})

        value = json.dumps({"incident": incident_id, "action": RESTART})
        requested = await click(bot, slack, INCIDENT_ACTION, value, root.ts, RESPONDER)
        assert "run #" in requested, requested
        run_id = int(re.search(r"run #(\d+)", requested).group(1))  # type: ignore[union-attr]

        def approval() -> SlackMessage | None:
            return next((m for m in slack.replies(root) if "approve-run" in buttons(m)), None)

        message: SlackMessage = await eventually(approval, timeout=10)
        await click(bot, slack, "approve-run", str(run_id), message.ts, ADMIN)

        def said(words: str) -> list[str]:
            return [m.rendered_text() for m in slack.replies(root) if words in m.rendered_text()]

        done = await eventually(lambda: said(f"(run #{run_id}) done"), timeout=30)
        assert done == [f"{RESTART} (run #{run_id}) done: done on 1 host"]
        started = said(f"(run #{run_id}), approved by slack:{ADMIN[0]} {ADMIN[1]}")
        assert started and started[0].startswith(f"{RESTART} on 1 host (5 alerts left out")
        assert said(f"incident {incident_id} (1 host) (run #{run_id}): approved by")  # the approval, updated
        runs = await store.action_runs(datetime(2000, 1, 1, tzinfo=UTC))
        # The incident's run, and the host's part of it on the alert of k-ai-01 (the one configured host).
        assert [(r.alert_key, r.state) for r in runs] == [(incident_key(incident_id), "done"), (host_alert, "done")]
