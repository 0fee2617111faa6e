"""Two real Alertmanagers gossiping in one cluster, as the recommended HA pair (`--cluster.peer`): for the tests of
bot replicas, of silences and of the dead man's switch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from tests.support.processes import Alertmanager, free_port


class StartPair(Protocol):
    """The `clustered_pair` fixture (tests/conftest.py): starts a pair, stopped after the test."""

    def __call__(self, config: dict[str, Any], *, peer_timeout: str | None = None) -> list[Alertmanager]: ...


def start_clustered_pair(
    workdir: Path, config: dict[str, Any], *, peer_timeout: str | None = None
) -> list[Alertmanager]:
    """Two Alertmanagers with this configuration, each told the other's cluster address (the first one started is
    the first in the cluster's order: it notifies, the second waits `peer_timeout` for it)."""
    ports = [free_port(), free_port()]
    started: list[Alertmanager] = []
    try:
        for n, port in enumerate(ports):
            peers = [f"127.0.0.1:{other}" for other in ports if other != port]
            member = Alertmanager(
                workdir / f"am{n}", config, cluster_port=port, cluster_peers=peers, peer_timeout=peer_timeout
            )
            started.append(member)
    except BaseException:
        for member in started:
            member.stop()
        raise
    return started


def clustered(members: Sequence[Alertmanager]) -> bool:
    """Every member sees all of them as its cluster's peers."""
    return all(len(httpx.get(f"{am.url}/api/v2/status").json()["cluster"]["peers"]) == len(members) for am in members)


def to_every_bot(bot_urls: Sequence[str]) -> dict[str, Any]:
    """An Alertmanager configuration that sends every notification, and its resolve, to each of these bots."""
    return {
        "route": {
            "receiver": "bots",
            "group_by": ["alertname", "host"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "bots",
                "webhook_configs": [{"url": f"{url}/alertmanager", "send_resolved": True} for url in bot_urls],
            }
        ],
    }
