"""What a person sees in the Slack fake during a storm: which alerts are visible, and when a condition first held.

Visible are: an alert's own message; a line of an older storm thread; in an incident's thread, the GPUs of a
host line (when the card names the alert) and every line of the attached list of alerts; and an alert whose id is
shown (`shown_ids`)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

from tests.fakes.slack import FakeSlack

# A host's line in an incident's thread: its host, its alertnames (when the incident has several), the shared trait
# it lacks, its GPUs.
_HOST_LINE = re.compile(
    r"`([^`]+)`(?: · ([A-Za-z0-9_:, ]+?))?(?: · outside `[^`]*`)? · GPUs? ([\d, -]+?)(?: ·|$)", re.MULTILINE
)

_QUOTED = re.compile(r"`([^`\s]+)`")


def visible(slack: FakeSlack, alertname: str) -> set[tuple[str, str]]:
    """(host, gpu) of every `alertname` alert a person can see (see above)."""
    line = re.compile(rf"\*{re.escape(alertname)}\* · `([^`]+)` GPU (\d+)")
    top = re.compile(rf"{re.escape(alertname)} on (\S+) GPU (\d+)")
    seen: set[tuple[str, str]] = set()
    for message in slack.top_level():
        replies = slack.replies(message)
        texts = [message.rendered_text(), *(reply.rendered_text() for reply in replies)]
        for text in texts:
            seen.update((m.group(1), m.group(2)) for m in line.finditer(text))
        found = top.search(message.text)
        if found:
            seen.add((found.group(1), found.group(2)))
        if alertname in message.rendered_text():
            for text in texts[1:]:
                for m in _HOST_LINE.finditer(text):
                    names = m.group(2)
                    if (names and alertname in names.split(", ")) or (not names and alertname in message.text):
                        seen.update((m.group(1), gpu) for gpu in _gpus(m.group(3)))
        for shared in (f for reply in replies for f in reply.files if f["name"].endswith(".txt")):
            seen.update(_listed(slack.uploads[shared["id"]].data or b"", alertname))
    return seen


def shown_ids(slack: FakeSlack) -> set[str]:
    """Every alert id a person can search Slack for: the ids on messages and host lines, and the attached lists'."""
    shown: set[str] = set()
    for message in slack.top_level():
        replies = slack.replies(message)
        for text in [message.rendered_text(), *(reply.rendered_text() for reply in replies)]:
            shown.update(_QUOTED.findall(text))
        for shared in (f for reply in replies for f in reply.files if f["name"].endswith(".txt")):
            rows = (line.split() for line in (slack.uploads[shared["id"]].data or b"").decode().splitlines())
            shown.update(row[0] for row in rows if row)
    return shown


def _gpus(ranges: str) -> list[str]:
    gpus: list[str] = []
    for part in ranges.split(","):
        low, _, high = part.strip().partition("-")
        gpus.extend(str(n) for n in range(int(low), int(high or low) + 1))
    return gpus


def _listed(data: bytes, alertname: str) -> set[tuple[str, str]]:
    """(host, gpu) of the list's lines: id, status, alert, host, GPU, value."""
    rows = (line.split() for line in data.decode().splitlines())
    return {(row[3], row[4]) for row in rows if len(row) >= 5 and row[2] == alertname}


async def until(condition: Callable[[], bool]) -> float:
    """When (monotonic) the condition first held, polling every 100 ms."""
    while True:
        if condition():
            return time.monotonic()
        await asyncio.sleep(0.1)
