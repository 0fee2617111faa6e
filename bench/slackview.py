"""What a person sees in the Slack fake during a storm: which alerts are visible, and when a condition first held."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

from tests.fakes.slack import FakeSlack


def visible(slack: FakeSlack, alertname: str) -> set[tuple[str, str]]:
    """(host, gpu) of every `alertname` alert a person can see: a top-level message or a line in a storm thread."""
    line = re.compile(rf"\*{re.escape(alertname)}\* · `([^`]+)` GPU (\d+)")
    top = re.compile(rf"{re.escape(alertname)} on (\S+) GPU (\d+)")
    seen: set[tuple[str, str]] = set()
    for message in slack.top_level():
        texts = [message.rendered_text(), *(reply.rendered_text() for reply in slack.replies(message))]
        for text in texts:
            seen.update((m.group(1), m.group(2)) for m in line.finditer(text))
        found = top.search(message.text)
        if found:
            seen.add((found.group(1), found.group(2)))
    return seen


async def until(condition: Callable[[], bool]) -> float:
    """When (monotonic) the condition first held, polling every 100 ms."""
    while True:
        if condition():
            return time.monotonic()
        await asyncio.sleep(0.1)
