"""The bot's own alerts (the dead man's switch, the self-test) during a Slack storm: each keeps its own message,
on the Slack fake and a real SQLite store (the sink fixtures of tests/test_slack_sink.py)."""

from __future__ import annotations

from typing import Any

from bot.deadman import ALERTNAME, MEMBER_ALERTNAME
from bot.message import Message
from tests.fakes.slack import FakeSlack
from tests.support.bot import eventually
from tests.test_slack_sink import SinkFactory, alert, delivery, fake, make_sink, storm_summary

__all__ = ["fake", "make_sink"]  # the sink fixtures, used by name (`store` is conftest.py's)


def own(name: str, **changes: Any) -> Message:
    fields: dict[str, Any] = {
        "alertname": name,
        "title": name,
        "summary": f"{name}: the bot's own alert",
        "host": "",
        "gpu": "",
        "labels": {"alertname": name, "replica": "any"},
        "facts": [],
        "links": [],
        **changes,
    }
    return alert(900 + len(name), **fields)


async def test_the_bots_own_alerts_get_their_own_message_in_a_storm(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink(storm_threshold=3, storm_window=30)
    for n in range(1, 6):
        await sink.deliver(delivery(alert(n)))  # the storm starts at the 4th
    summary = await eventually(lambda: storm_summary(fake))
    watchdog = own(ALERTNAME)
    member = own(MEMBER_ALERTNAME)
    selftest = own("GPUSelfTest", labels={"alertname": "GPUSelfTest", "selftest": "c7f042eee8e1"})
    for message in (watchdog, member, selftest):
        await sink.deliver(delivery(message))
    titles = [m.rendered_text() for m in fake.top_level()]
    for name in (ALERTNAME, MEMBER_ALERTNAME, "GPUSelfTest"):
        assert sum(name in text for text in titles) == 1, name
    assert not any(
        name in reply.rendered_text()
        for top in fake.top_level()
        for reply in fake.replies(top)
        for name in (ALERTNAME, MEMBER_ALERTNAME)
    )
    # Every GPU alert resolved: the storm counts no firing alert, whatever the bot's own alerts do.
    for n in range(1, 6):
        await sink.deliver(delivery(alert(n, "resolved")))
    await eventually(lambda: "*Firing*\n0" in summary.rendered_text(), timeout=15)
    [told] = [m for m in fake.top_level() if ALERTNAME in m.rendered_text() and MEMBER_ALERTNAME not in m.text]
    assert not told.text.startswith("✅")  # still firing, in its own message
