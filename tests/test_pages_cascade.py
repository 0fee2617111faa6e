"""The incident page of a cascade: alerts of several names on the same hosts are one incident, and its page counts
each alertname and names each host's, as the card does."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx

from tests.support.bot import running_bot
from tests.support.pages import GPUS, basic_header, host_alerts, pages_config, post, the_incident
from tests.support.payloads import am_alert, webhook


def inlet(host: int, started: datetime) -> dict[str, object]:
    alert = am_alert(
        "InletTemperatureHigh",
        starts_at=started,
        instance=f"k-ai-{host:03d}:9400",
        name="Inlet Temp",
        severity="warning",
        annotations={"summary": "Inlet air at 36 °C"},
    )
    return webhook([alert], group_key=f'{{}}:{{alertname="InletTemperatureHigh", instance="k-ai-{host:03d}:9400"}}')


async def test_the_page_of_a_cascade_counts_each_alertname_and_names_each_hosts(tmp_path: Path) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    async with running_bot(tmp_path, pages_config(tmp_path)) as bot:
        for host in range(6):
            await post(bot, inlet(host, started))
        for host in range(6):
            await post(bot, host_alerts(host, started))
        incident_id = await the_incident(bot.runtime.store, 6 + 6 * GPUS)
        async with httpx.AsyncClient(base_url=bot.url, headers=basic_header()) as client:
            page = (await client.get(f"/pages/incidents/{incident_id}")).text
    assert "GPUTempCritical 48 · InletTemperatureHigh 6" in page
    assert "k-ai-000 · GPUTempCritical, InletTemperatureHigh · GPUs 0-7" in page
