"""A clean SIGTERM in the middle of a backlog sends nothing twice: `python -m bot serve` stopped, then restarted.

Unlike a SIGKILL (test_crash_recovery.py), a graceful stop lets the delivery under way end and be recorded, so
the restart has no delivery in doubt to send again. PagerDuty answers late here, so that the stop surely comes
while an event is in and its answer is not.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import yaml

from tests.fakes.pagerduty import FakePagerDuty
from tests.support.bot import eventually
from tests.support.payloads import body, distinct_webhooks
from tests.support.processes import BotProcess
from tests.test_crash_recovery import _PENDING, _console_lines, _post_all, _read

WEBHOOKS = 10
ALERTS_EACH = 20
ROUTING_KEY = "R0123456789ABCDEF0123456789ABCDE"


async def _stop(bot: BotProcess) -> int:
    """SIGTERM, waited for without blocking this loop: the fake PagerDuty must go on answering meanwhile."""
    bot.process.send_signal(signal.SIGTERM)
    returncode = await asyncio.to_thread(bot.process.wait, 30)
    bot.stdout.join()
    bot.stderr.join()
    return returncode


async def test_sigterm_with_a_backlog_sends_nothing_twice_after_the_restart(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    key_file = tmp_path / "pd_routing_key"
    key_file.write_text(ROUTING_KEY + "\n")
    payloads = [body(p) for p in distinct_webhooks(WEBHOOKS, ALERTS_EACH, prefix="sigterm")]
    # The stop is what is tested, not PagerDuty's pace: its 120 events a minute would hold the backlog a minute.
    async with FakePagerDuty(rate_limit=WEBHOOKS * ALERTS_EACH) as pagerduty:
        receivers = [
            {"name": "console", "type": "console"},
            {"name": "pd", "type": "pagerduty", "routing_key_file": str(key_file), "url": pagerduty.url},
        ]
        config = tmp_path / "bot.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "store": {"path": str(db)},
                    "worker": {"poll_interval": "100ms"},
                    "receivers": receivers,
                    "routing": {"default": ["console", "pd"]},
                    "incidents": {"enabled": False},  # a backlog of pages, each alert its own
                }
            )
        )
        pagerduty.answer_after(0.3)
        first = BotProcess(config)
        try:
            responses = await _post_all(f"{first.url}/alertmanager", payloads)
            assert [r.status_code for r in responses] == [200] * WEBHOOKS
            await eventually(lambda: len(pagerduty.events) >= 3, timeout=60, interval=0.01)
        finally:
            assert await _stop(first) == 0
        before = _console_lines(first, killed=False)
        [(left,)] = _read(db, _PENDING)
        assert left > 0, "the stop should interrupt the backlog, or this proves nothing"
        # Everything sent before the stop was recorded as delivered before the process ended.
        [(recorded,)] = _read(db, "SELECT COUNT(*) FROM deliveries WHERE receiver = 'pd' AND state = 'delivered'")
        assert recorded == len(pagerduty.events)

        pagerduty.answer_after(0)
        second = BotProcess(config)
        try:
            await eventually(lambda: _read(db, _PENDING) == [(0,)], timeout=60, interval=0.2)
        finally:
            assert await _stop(second) == 0
        after = _console_lines(second, killed=False)

    printed = Counter(line["delivery_id"] for line in before + after)
    assert len(printed) == WEBHOOKS * ALERTS_EACH
    assert [delivery for delivery, n in printed.items() if n > 1] == []
    triggers = Counter(event["dedup_key"] for event in pagerduty.accepted("trigger"))
    assert len(triggers) == WEBHOOKS * ALERTS_EACH
    assert [key for key, n in triggers.items() if n > 1] == []
