"""Which Alertmanagers form one cluster, from their own API v2 status (`GET /api/v2/status`: the cluster's status,
this member's peer name and the peers it sees).

A clustered pair shares its notification log: only one member sends each repeat of the Watchdog, so the dead man's
switch (bot/deadman.py) expects the Watchdog from the cluster, not from each member. Each replica is asked at the
URL its webhooks name (their `externalURL`), and each of `alertmanager.urls` too: a standby that never sent the
bot anything is still seen in its cluster before a failover. What a look found is remembered, so that a member
that stops answering, or answers from outside the cluster it was in, is told apart from one that was never
clustered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from bot.config import AlertmanagerConfig

if TYPE_CHECKING:
    from bot.alertmanager import AmStatus

DISABLED = "disabled"  # Alertmanager's cluster status without --cluster.listen-address


class Membership(StrEnum):
    ALONE = "alone"  # not clustered, and never seen clustered: its own Watchdog is expected
    IN_CLUSTER = "in cluster"
    DOWN = "down"  # seen clustered before, does not answer now
    LEFT = "left"  # seen clustered before, answers without its former peers


@dataclass(frozen=True)
class Member:
    replica: str
    membership: Membership
    # The other replicas (externalURLs) in its cluster, as the last look found them.
    peers: frozenset[str] = frozenset()
    detail: str = ""


class ClusterView:
    """Looks at every replica's status on each `look`; remembers the peer names and clusters it saw."""

    def __init__(self, config: AlertmanagerConfig | None) -> None:
        self._config = config
        self._names: dict[str, str] = {}  # replica -> its peer name, once seen clustered
        self._clustered_with: dict[str, frozenset[str]] = {}  # replica -> the replicas it was last clustered with

    async def look(self, replicas: Sequence[str], configured: Sequence[str] = ()) -> dict[str, Member]:
        """Each of `replicas` (the externalURLs the Watchdog came from) and of the `configured` URLs
        (`alertmanager.urls`, which name a member the bot may never have heard from: a standby that sends
        nothing while its peer does). A configured URL that is one of `replicas` under another name (the same
        peer name) is left out."""
        looked = list(dict.fromkeys([*replicas, *configured]))
        answers = await asyncio.gather(*(self._status(replica) for replica in looked))
        statuses = dict(zip(looked, answers, strict=True))
        for replica, status in statuses.items():
            if not isinstance(status, str) and status.cluster.status != DISABLED and status.cluster.name:
                self._names[replica] = status.cluster.name
        heard = {self._names[replica] for replica in replicas if replica in self._names}
        for url in set(configured) - set(replicas):
            if self._names.get(url) in heard:
                del statuses[url]
        return {replica: self._member(replica, status, statuses) for replica, status in statuses.items()}

    def _member(self, replica: str, status: AmStatus | str, statuses: dict[str, AmStatus | str]) -> Member:
        if isinstance(status, str):
            if replica in self._clustered_with:
                detail = f"its API does not answer the bot ({status})"
                return Member(replica, Membership.DOWN, self._clustered_with[replica], detail)
            return Member(replica, Membership.ALONE, detail=status)
        peers = frozenset(
            other
            for other, other_status in statuses.items()
            if other != replica and _together(status, other, other_status, self._names)
        )
        if peers:
            self._clustered_with[replica] = peers
            return Member(replica, Membership.IN_CLUSTER, peers, f"cluster {status.cluster.status}")
        former = self._clustered_with.get(replica, frozenset())
        if former and all(isinstance(statuses.get(peer, ""), str) for peer in former):
            # Its peers are down, not it: it is what is left of the cluster.
            return Member(replica, Membership.IN_CLUSTER, former, "its cluster peers do not answer")
        if former:
            seen = len(status.cluster.peers)
            detail = (
                f"it answers with cluster status {status.cluster.status} and {seen} peer(s), none of its former ones"
            )
            return Member(replica, Membership.LEFT, former, detail)
        return Member(replica, Membership.ALONE, detail=f"cluster {status.cluster.status}")

    async def _status(self, replica: str) -> AmStatus | str:
        """Its status, or why there is none."""
        # Imported here: an ingest process, which runs the switch too, loads Alertmanager's client (and the
        # enrichers' HTTP helpers it shares) only once there is a cluster to look at.
        from bot.alertmanager import AlertmanagerClient, AlertmanagerError
        from bot.enrich.queryapi import bearer_auth

        config = self._config
        timeout = config.timeout if config is not None else 5.0
        auth = bearer_auth(config.bearer_token_file) if config is not None else None
        client = AlertmanagerClient([replica], timeout=timeout, auth=auth)
        try:
            return await client.status()
        except AlertmanagerError as exc:
            return exc.detail
        finally:
            await client.close()


def _together(status: AmStatus, other: str, other_status: AmStatus | str, names: dict[str, str]) -> bool:
    """Whether either of the two sees the other among its peers now."""
    if status.cluster.status == DISABLED:
        return False
    own_peers = {peer.name for peer in status.cluster.peers}
    if other in names and names[other] in own_peers:
        return True
    if not isinstance(other_status, str) and other_status.cluster.status != DISABLED:
        return status.cluster.name in {peer.name for peer in other_status.cluster.peers}
    return False
