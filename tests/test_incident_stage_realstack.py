"""The incident stage with the bot's analyser against a real Prometheus (the fleet of 48 hosts of
tests/test_incident_realstack.py, a cooling failure in row C): the incident the pipeline keeps names the row, the
inlet temperature and facility cooling, and `gpu-alert-bot report` tells it (docs/incidents.md shows this output)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.commands.cli import main
from bot.incident.model import incident_key
from bot.render.incident_text import analysed_text
from bot.storage.interface import ActionRun
from tests.support.bot import write_config
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, webhook
from tests.test_incident_realstack import GPUS, HOSTS, HOT_ROW, Stack, stack
from tests.test_incident_stage import stage

__all__ = ["stack"]  # the real Prometheus and its fleet, used by name
pytestmark = pytest.mark.realstack


def hot(name: str, stack: Stack, status: str = "firing") -> dict[str, Any]:
    alerts = [
        am_alert(
            "GPUTempCritical",
            status=status,
            starts_at=stack.incident,
            instance=f"{name}:9400",
            gpu=str(gpu),
            annotations={"summary": f"GPU {gpu} thermal critical ({93 + gpu} °C)"},
        )
        for gpu in range(GPUS)
    ]
    return webhook(alerts, group_key=f'{{}}:{{alertname="GPUTempCritical", instance="{name}:9400"}}')


async def test_a_cooling_failure_is_kept_with_its_row_its_inlet_and_its_cause_and_reported(
    stack: Stack, tmp_path: Path
) -> None:
    settings = {
        "enrichment": {"prometheus": {"url": stack.prometheus.url, "timeout": "10s"}},
        "playbooks": {"vars": {"runbook_base_url": "https://runbooks.example"}},
    }
    row = [h.name for h in HOSTS if h.row == HOT_ROW]
    clock = FakeClock(stack.incident + timedelta(seconds=1))
    async with stage(tmp_path, settings, clock) as s:
        await s.run(*(hot(name, stack) for name in row))
        view = await s.incident()
        # What the on-call engineer did: an ack, the fleet action the cause offers (approved), then the recovery.
        await clock.advance(40)
        await s.store.ack(view.alerts[0].alert_key, "slack:U024BE7LH alice", clock.now())
        await clock.advance(15)
        asked = ActionRun(0, "lower-power-limit", incident_key(view.id), f"incident {view.id} (12 hosts)", None,
                          "slack:U024BE7LH alice", False, False, "requested", clock.now(), clock.now())  # fmt: skip
        run = await s.store.add_action_run(asked)
        await clock.advance(30)
        await s.store.transition_action_run(
            run.id, "requested", "done", clock.now(), "24 GPUs at 450 W", ["slack:U0G9QF9C6 bob"]
        )
        await clock.advance(23 * 60)
        await s.run(*(hot(name, stack, "resolved") for name in row))
    assert (
        view.analysed
        and view.status == "open"
        and (view.scope.hosts, view.scope.fleet_hosts, view.scope.fleet_gpus) == (12, 48, 96)
    )
    assert [(t.label, t.value, t.affected, t.fleet) for t in view.traits] == [("row", "C", 12, 12)]
    assert [s.name for s in view.signals if s.moved] == ["inlet"]
    assert view.cause is not None and view.cause.key == "facility-cooling"

    out = tmp_path / "incident.md"
    command = ["report", view.id, "--config", str(write_config(tmp_path, {})), "--out", str(out)]
    assert await asyncio.to_thread(main, command) == 0
    text = out.read_text()
    assert '12 of 12 affected hosts have row="C"; row="C" has 12 of 48 hosts in the fleet' in text
    assert "inlet temperature moved +9" in text and "on 12 of 12 affected hosts" in text
    assert "**Facility cooling**" in text and "https://runbooks.example/facility-cooling" in text
    assert "approved by slack:U0G9QF9C6 bob: done (24 GPUs at 450 W)" in text and "All 24 alerts resolved" in text
    print(text)


async def test_the_card_reads_every_host_once_the_incident_stops_growing_and_its_figures_agree(
    stack: Stack, tmp_path: Path
) -> None:
    """Analysed when it opens on 4 hosts; 8 more join 2 s later (tripled, but analysed too recently to ask
    Prometheus again): the card says which part it read. Once no host joined for `incidents.settle` (10 s), the
    worker analyses it again: every figure of the card is of its 12 hosts, and it is not analysed a third time."""
    settings = {"enrichment": {"prometheus": {"url": stack.prometheus.url, "timeout": "10s"}}}
    row = [h.name for h in HOSTS if h.row == HOT_ROW]
    clock = FakeClock(stack.incident + timedelta(seconds=1))
    async with stage(tmp_path, settings, clock) as s:
        await s.run(*(hot(name, stack) for name in row[:4]))
        first = await s.incident()
        await clock.advance(2)
        await s.run(*(hot(name, stack) for name in row[4:]))
        growing = await s.incident()
        assert await s.settle() == 0  # a host joined just now
        await clock.advance(10)
        assert await s.settle() == 1
        settled = await s.incident()
        assert await s.settle() == 0
    assert (first.analysed_hosts, first.scope.hosts) == (4, 4) and first.traits[0].affected == 4
    assert (growing.analysed_hosts, growing.scope.hosts) == (4, 12) and growing.traits[0].affected == 4
    assert analysed_text(growing).startswith("Found among the 4 hosts it had at ")
    assert (settled.analysed_hosts, settled.scope.hosts, settled.scope.fleet_hosts) == (12, 12, 48)
    [row_c] = settled.traits
    assert (row_c.label, row_c.value, row_c.affected, row_c.affected_total, row_c.outside) == ("row", "C", 12, 12, [])
    [inlet] = settled.signals
    assert (inlet.moved, inlet.affected_total) == (12, 12)
    assert settled.cause is not None and settled.cause.reason.startswith("Inlet air rose 9 °C on 12 of 12 affected")
    assert analysed_text(settled) == ""
