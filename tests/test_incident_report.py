"""`gpu-alert-bot report INCIDENT` on an incident the pipeline kept in a real SQLite store: the timeline (first
alert, peak, the fleet action with who approved it, the ack, the silence, the resolution) as Markdown, and the
heat map as a PNG beside it."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.commands.cli import main
from bot.incident.model import incident_key
from bot.storage.interface import ActionRun
from tests.support.bot import write_config
from tests.test_incident_stage import hot, stage


async def test_a_report_tells_the_incident_from_its_first_alert_to_its_resolution(tmp_path: Path) -> None:
    async with stage(tmp_path) as s:
        await s.run(hot("k-ai-001.lan", range(8)), hot("k-ai-002.lan", range(4)))
        view = await s.incident()
        now = datetime.now(UTC)
        await s.store.ack(view.alerts[2].alert_key, "slack:U024BE7LH alice", now)
        await s.store.set_silence(view.alerts[3].alert_key, "silence-1", "slack:U1 bob", now + timedelta(hours=2), "")
        run = ActionRun(
            0, "lower-power-limit", incident_key(view.id), "incident (2 hosts)", None, "slack:U1 bob", False, False,
            "requested", now, now,
        )  # fmt: skip
        added = await s.store.add_action_run(run)
        await s.store.transition_action_run(added.id, "requested", "done", now, "12 GPUs", ["slack:U024BE7LH alice"])
        await s.run(hot("k-ai-001.lan", range(8), "resolved"), hot("k-ai-002.lan", range(4), "resolved"))
    out = tmp_path / "report" / "incident.md"  # a directory the report makes
    command = ["report", view.id, "--config", str(write_config(tmp_path, {})), "--out", str(out)]
    assert await asyncio.to_thread(main, command) == 0

    text = out.read_text()
    assert text.startswith(f"# Incident {view.id}: GPUTempCritical on 2 hosts\n")
    assert f"- **Key:** `incident:{view.id}`; playbook `GPUTempCritical`" in text
    # No Prometheus here: the fleet was never read, so nothing is said of what the hosts share.
    assert "- Not known: no Prometheus is configured (enrichment.prometheus)" in text
    assert "12 alerts on 2 hosts, 12 GPUs" in text and "all 12 alerts resolved at" in text and "peak 95 °C" in text
    assert "First alert: GPUTempCritical on `k-ai-00" in text  # all started together
    assert "Peak 95 °C: GPUTempCritical on `k-ai-001.lan` GPU 5" in text
    assert f"Acknowledged by slack:U024BE7LH alice: `{view.alerts[2].short_id}`" in text
    assert "Silenced by slack:U1 bob until " in text and view.alerts[3].short_id in text
    assert "Action `lower-power-limit` on incident (2 hosts) asked by slack:U1 bob, approved by slack:U024BE7LH " \
        "alice: done (12 GPUs)" in text  # fmt: skip
    assert re.search(r"\| All 12 alerts resolved, [\w ]+ after the first \|", text)
    assert "- k-ai-001.lan · GPUs 0-7 · 90 to 95 °C · 8 resolved" in text
    # The timeline is in order, and the heat map is beside the report.
    times = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| 20")]
    assert times == sorted(times) and len(times) >= 6
    assert "![alerts by host and start time](incident.png)" in text
    assert (out.parent / "incident.png").read_bytes().startswith(b"\x89PNG")
