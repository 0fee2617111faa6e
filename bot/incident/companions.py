"""Other alerts firing on an incident's hosts at the same time: evidence named on the card, not more lines. Pure."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from bot.incident.model import Companion


def companions(
    alertnames: Collection[str], affected: Collection[str], firing: Iterable[tuple[str, str]]
) -> list[Companion]:
    """From the (alertname, host) pairs firing on the bot's side: each other alert name firing on affected hosts,
    with how many of them, most hosts first. The incident's own alert names are not companions."""
    hosts = set(affected)
    seen: dict[str, set[str]] = {}
    for alertname, host in firing:
        if host in hosts and alertname not in alertnames:
            seen.setdefault(alertname, set()).add(host)
    found = [Companion(alertname=name, hosts=len(on)) for name, on in seen.items()]
    return sorted(found, key=lambda c: (-c.hosts, c.alertname))
