"""`/gpu list` and `/gpu ack ID` on the alerts of an incident, through the running bot (signed Slack commands, a
real SQLite store, the Slack fake): every alert of the incident is listed with its id and can be acknowledged."""

from __future__ import annotations

import aiohttp

from bot.models import short_id
from tests.support.bot import RunningBot, eventually
from tests.support.payloads import gpu_alerts, webhook
from tests.support.slack_requests import post_command
from tests.test_slack_interact import bot

__all__ = ["bot"]  # the running bot fixture, used by name


async def test_each_alert_of_an_incident_is_listed_and_acknowledged_by_its_id(bot: RunningBot) -> None:
    async with aiohttp.ClientSession() as http:
        await http.post(bot.webhook_url, json=webhook(gpu_alerts(8, host="k-ai-07")))
    store = bot.runtime.store
    alerts = await eventually(lambda: store.list_alerts("firing"))
    await eventually(lambda: len(alerts) == 8)
    incident = await eventually(lambda: store.alert_incident(alerts[0].key))
    assert {await store.alert_incident(a.key) for a in alerts} == {incident}
    listed = await post_command(bot.url, "list")
    assert all(f"`{short_id(a.key)}`" in listed for a in alerts)
    one = alerts[5]
    answer = await post_command(bot.url, f"ack {short_id(one.key)}")
    assert short_id(one.key) in answer
    stored = await store.get_alert(one.key)
    assert stored is not None and stored.acked_by is not None  # the ack is written before it is answered
