"""The dead man's switch: Alertmanager's always-firing Watchdog proves the alert path works; its silence means
the path is broken, and nothing in that path can say so. The bot says it, through its own sinks.

Every webhook carrying the Watchdog (accepted or a copy) restarts the timer of the Alertmanager replica that sent
it (its `externalURL`) and of `any` replica. A check every `deadman.check_interval` compares each timer with
`deadman.timeout`: silence from every replica raises one WatchdogMissing alert; silence from one replica of an HA
pair while another still talks raises it for that replica, unless the replica is a member of an Alertmanager
cluster whose Watchdog arrives (one member notifies for the cluster, bot/amcluster.py). A member that is down or
has left its cluster raises AlertmanagerClusterMemberMissing instead. When the Watchdog returns, the alert resolves
(the all-clear). A Watchdog carrying a site's external labels (`deadman.site_labels`) restarts that site's timer
too: a silent site raises one WatchdogMissing naming it and the Alertmanagers that brought its Watchdog, instead of
one per Alertmanager (bot/deadman_sites.py). The alert is a notification the bot writes into its own store, so it
takes the normal path (worker, routing, outbox) and is told once, resolved once, and survives restarts; the timers
live in the store too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from bot import deadman_sites as sites
from bot.amcluster import ClusterView, Member, Membership
from bot.clock import Clock
from bot.config import AlertmanagerConfig, DeadmanConfig
from bot.message import format_duration
from bot.metrics import Metrics
from bot.models import WebhookPayload
from bot.storage.interface import IncomingNotification, Store, StoreUnavailable, WatchdogRecord

log = logging.getLogger(__name__)

ALERTNAME = "WatchdogMissing"
# The timer of the Watchdog from whichever replica: its silence means no alert gets through at all.
ANY_REPLICA = "any"
# A payload without externalURL (a script, an old Alertmanager) still proves the path works.
UNKNOWN_REPLICA = "unknown"
# Not a replica: when the bot last checked, so that the time it was down is not blamed on Alertmanager.
BOT_CHECKED = "bot"
RECEIVER = "gpu-alert-bot-deadman"
# A member of an Alertmanager cluster that is down or has left it (bot/amcluster.py).
MEMBER_ALERTNAME = "AlertmanagerClusterMemberMissing"
# The store keeps that alert's state beside the timers, under this prefix and the member's externalURL.
MEMBER = "member "
NEVER_ARMED = (
    "never armed: no Watchdog received yet, so it cannot page (Prometheus must fire the Watchdog and Alertmanager "
    "send it to this bot: `gpu-alert-bot selftest` says which does not)"
)


class Deadman:
    def __init__(
        self,
        store: Store,
        config: DeadmanConfig,
        metrics: Metrics,
        clock: Clock,
        on_notification: Callable[[], None],
        alertmanager: AlertmanagerConfig | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._on_notification = on_notification
        self._task: asyncio.Task[None] | None = None
        self._timer_started = False
        self._clusters = ClusterView(alertmanager)
        # Looked at with the replicas heard from: a member that never sent anything yet (a clustered standby).
        self._configured = [url.rstrip("/") for url in alertmanager.urls] if alertmanager is not None else []
        self.armed: bool | None = None  # None until the first check
        self._told: dict[str, Membership] = {}  # how each member out of its cluster was told (down or left)
        self._paths: dict[str, set[str]] = {}  # each site's timer -> the Alertmanagers that brought its Watchdog

    # --- heartbeats ----------------------------------------------------------------------------------
    def carries_watchdog(self, payload: WebhookPayload) -> bool:
        return bool(self._watchdogs(payload))

    def _watchdogs(self, payload: WebhookPayload) -> list[dict[str, str]]:
        """The labels of each firing Watchdog in the payload (a global Alertmanager may group several sites')."""
        name = self._config.alertname
        return [a.labels for a in payload.alerts if a.status == "firing" and a.labels.get("alertname") == name]

    async def observe(self, payload: WebhookPayload) -> None:
        """Called for every webhook the bot took (accepted or a copy): a Watchdog in it restarts the timers of
        any replica, of the Alertmanager that sent it, and of each site whose Watchdog it carries."""
        watchdogs = self._watchdogs(payload)
        if not watchdogs:
            return
        replica = payload.external_url or UNKNOWN_REPLICA
        keys = [ANY_REPLICA, replica]
        for labels in watchdogs:
            site = sites.site_key(labels, self._config.site_labels)
            if site is not None and site not in keys:
                keys += [site, sites.path_key(replica, site)]
        try:
            await self._store.watchdog_seen(keys, self._clock.now())
        except StoreUnavailable as exc:
            # The webhook itself is stored; the next Watchdog, a minute later, will restart the timer.
            log.warning("cannot record the Watchdog", extra={"reason": str(exc)})

    # --- the check -----------------------------------------------------------------------------------
    async def check(self) -> None:
        """Raise or clear WatchdogMissing per replica, and the alerts about cluster members; a second check with
        nothing new does nothing."""
        now = self._clock.now()
        if not self._timer_started:
            await self._resume(now)
            self._timer_started = True
        records = [r for r in await self._store.watchdog_records() if r.replica != BOT_CHECKED]
        self._paths = sites.paths(r.replica for r in records)
        timers = [r for r in records if not r.replica.startswith(MEMBER) and not sites.is_path(r.replica)]
        self._arm(is_armed(records))
        # A switch that never heard a Watchdog proves nothing by its silence: it does not page (the self-test says
        # what keeps the Watchdog away), and says so in /readyz, /gpu status and its metric.
        quiet = {r.replica for r in timers if self.armed and self._age(r, now) > self._config.effective_timeout}
        members = await self._look(timers)
        # A member whose cluster's Watchdog arrives is not silent, and one that is down or out of its cluster is
        # told as such (below), not as a missing Watchdog.
        talking = {r.replica for r in timers} - quiet
        excused = {replica for replica in quiet if _excused(members.get(replica), talking)}
        missing = quiet - excused
        # When no replica talks, one alert says so, not one per replica; when a site is silent, one alert names
        # it, not one per Alertmanager that brought only its Watchdog.
        raise_for = {ANY_REPLICA} if ANY_REPLICA in quiet else missing - sites.explained(missing, self._paths)
        for record in timers:
            if record.alerted_since is None and record.replica in raise_for:
                await self._raise(record, now)
            elif record.alerted_since is not None and record.replica not in missing:
                await self._clear(record, now, covered=record.replica in excused)
            alerting = record.replica in raise_for or (record.alerted_since is not None and record.replica in missing)
            self._metrics.watchdog_age.labels(record.replica).set(self._age(record, now))
            self._metrics.deadman_alerting.labels(record.replica).set(1 if alerting else 0)
        await self._tell_members(members, {r.replica: r for r in records}, now)
        await self._store.watchdog_seen([BOT_CHECKED], now)

    def _arm(self, armed: bool) -> None:
        if not armed and self.armed is not False:
            log.warning(
                "the dead man's switch is not armed: no Watchdog has arrived yet, so its silence pages nobody; "
                "route the Watchdog to this bot; `gpu-alert-bot selftest` says what keeps it away"
            )
        self.armed = armed
        self._metrics.deadman_armed.set(1 if armed else 0)

    @property
    def readiness(self) -> str:
        """What /readyz says of the switch (it never makes the bot unready: restarting it would not help)."""
        if self.armed is None:
            return "not checked yet"
        return "armed" if self.armed else NEVER_ARMED

    async def _look(self, timers: list[WatchdogRecord]) -> dict[str, Member]:
        """Each Alertmanager's place in its cluster, when there are several to tell apart: those heard from and
        those `alertmanager.urls` names."""
        replicas = [
            r.replica
            for r in timers
            if r.replica not in (ANY_REPLICA, UNKNOWN_REPLICA) and not sites.is_site(r.replica)
        ]
        configured = [url for url in self._configured if url not in {r.rstrip("/") for r in replicas}]
        if len(replicas) + len(configured) < 2 or not replicas:
            return {}
        return await self._clusters.look(replicas, configured)

    async def _tell_members(
        self, members: dict[str, Member], records: dict[str, WatchdogRecord], now: datetime
    ) -> None:
        for replica, member in members.items():
            if member.membership is Membership.ALONE:
                continue
            record = records.get(MEMBER + replica)
            alerting = record is not None and record.alerted_since is not None
            out = member.membership in (Membership.DOWN, Membership.LEFT)
            self._metrics.cluster_member.labels(replica).set(0 if out else 1)
            told = self._told.get(replica)
            if alerting and (not out or (told is not None and told is not member.membership)):
                # Back in its cluster, or out of it another way (down, then up alone): that episode is over.
                assert record is not None and record.alerted_since is not None
                log.info("an Alertmanager is back, or out of its cluster another way", extra={"replica": replica})
                if out:
                    summary = f"Alertmanager {replica} is no longer {told}; now: {_out_of_cluster(member)}"
                else:
                    summary = f"Alertmanager {replica} is back in its cluster: {member.detail}"
                await self._write(MEMBER_ALERTNAME, replica, record.alerted_since, now, summary)
                await self._store.watchdog_alerting(MEMBER + replica, None)
                self._told.pop(replica, None)
                alerting = False
            if out and not alerting:
                log.error("an Alertmanager is out of its cluster", extra={"replica": replica, "why": member.detail})
                await self._store.watchdog_start(MEMBER + replica, now)
                await self._write(MEMBER_ALERTNAME, replica, now, None, _out_of_cluster(member))
                await self._store.watchdog_alerting(MEMBER + replica, now)
                self._told[replica] = member.membership

    async def _resume(self, now: datetime) -> None:
        """The timers go on from where a previous process left them, less the time the bot itself was down:
        Alertmanager could not deliver the Watchdog to a stopped bot, and will again within a repeat interval.
        A bot that never got any Watchdog counts from its first check: an Alertmanager never wired to the bot
        is the failure this is for."""
        records = await self._store.watchdog_records()
        checked = next((r.last_seen for r in records if r.replica == BOT_CHECKED), None)
        if checked is not None and now > checked:
            await self._store.watchdog_shift((now - checked).total_seconds())
        await self._store.watchdog_start(ANY_REPLICA, now)

    def _age(self, record: WatchdogRecord, now: datetime) -> float:
        return max(0.0, (now - record.last_seen).total_seconds())

    async def _raise(self, record: WatchdogRecord, now: datetime) -> None:
        silence = format_duration(self._age(record, now))
        log.error(
            "the Watchdog stopped arriving: alerting through the bot's own receivers",
            extra={"replica": record.replica, "silent_for": silence},
        )
        # The notification first, the mark second: a crash in between raises it again after the restart rather
        # than losing it (a copy within the dedup window when the timer did not move, else a second message).
        await self._write(ALERTNAME, record.replica, record.last_seen, None, self._summary(record.replica, silence))
        await self._store.watchdog_alerting(record.replica, record.last_seen)

    async def _clear(self, record: WatchdogRecord, now: datetime, covered: bool) -> None:
        assert record.alerted_since is not None
        log.info("the Watchdog is back: all clear", extra={"replica": record.replica})
        if covered:
            summary = f"{self._who(record.replica)} is in a cluster whose Watchdog arrives: the alert path works"
        else:
            summary = f"the Watchdog from {self._who(record.replica)} arrives again: the alert path works"
        await self._write(ALERTNAME, record.replica, record.alerted_since, now, summary)
        await self._store.watchdog_alerting(record.replica, None)

    def _summary(self, replica: str, silence: str) -> str:
        return (
            f"no Watchdog from {self._who(replica)} for {silence}: the alert path is broken; check that Prometheus "
            "evaluates the Watchdog rule and reaches Alertmanager, that Alertmanager is up and routes the Watchdog "
            "to this bot, and that the webhook reaches the bot (Alertmanager's log: 401 = token, refused = bot "
            "unreachable)"
        )

    def _who(self, replica: str) -> str:
        if sites.is_site(replica):
            brought = sorted(self._paths.get(replica, ()))
            return f"{sites.display(replica)} (Alertmanager{'s' if len(brought) > 1 else ''} {', '.join(brought)})"
        return "any Alertmanager" if replica == ANY_REPLICA else f"Alertmanager {replica}"

    async def _write(
        self, alertname: str, replica: str, starts_at: datetime, ends_at: datetime | None, summary: str
    ) -> None:
        payload = _notification(alertname, replica, starts_at, ends_at, summary)
        await self._store.ingest(
            IncomingNotification(
                idempotency_key=payload.idempotency_key(),
                group_key=payload.group_key,
                receiver=RECEIVER,
                body=payload.model_dump_json(by_alias=True).encode(),
                alert_count=1,
            )
        )
        self._on_notification()

    # --- the loop ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="deadman")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except StoreUnavailable as exc:
                self._metrics.error("store_unavailable")
                log.warning("the dead man's switch cannot use the store", extra={"reason": str(exc)})
            except Exception:  # a bug must not stop the switch for good
                log.exception("dead man's switch check failed")
            await self._clock.sleep(self._config.check_interval)


def is_armed(records: Sequence[WatchdogRecord]) -> bool:
    """Whether a Watchdog ever arrived: a timer of some Alertmanager beside `any` and the bot's own."""
    return any(
        r.replica not in (ANY_REPLICA, BOT_CHECKED)
        and not r.replica.startswith(MEMBER)
        and not sites.is_path(r.replica)
        for r in records
    )


def status_line(records: Sequence[WatchdogRecord]) -> str:
    """The switch in `/gpu status`."""
    if not is_armed(records):
        return f"Dead man's switch: {NEVER_ARMED}"
    alerting = sorted(
        sites.display(r.replica) for r in records if r.alerted_since is not None and not r.replica.startswith(MEMBER)
    )
    return f"Dead man's switch: armed, alerting for {', '.join(alerting)}" if alerting else "Dead man's switch: armed"


def _excused(member: Member | None, talking: set[str]) -> bool:
    if member is None:
        return False
    if member.membership is Membership.IN_CLUSTER:
        return any(peer in talking for peer in member.peers)
    return member.membership in (Membership.DOWN, Membership.LEFT)


def _out_of_cluster(member: Member) -> str:
    peers = ", ".join(sorted(member.peers))
    if member.membership is Membership.DOWN:
        return (
            f"Alertmanager {member.replica} is down or unreachable: {member.detail}; its cluster peer(s) {peers} "
            "still notify, without a spare"
        )
    return (
        f"Alertmanager {member.replica} has left its cluster with {peers}: {member.detail}; they no longer share "
        "their notification log (alerts can be told twice); check the --cluster.peer flags and that the cluster "
        "port is reachable"
    )


def _notification(
    alertname: str, replica: str, starts_at: datetime, ends_at: datetime | None, summary: str
) -> WebhookPayload:
    severity = "critical" if alertname == ALERTNAME else "warning"
    # A site's alert carries the site's labels (routed like the site's other alerts), an Alertmanager's its URL.
    where = sites.site_labels(replica) if sites.is_site(replica) else {"replica": replica}
    labels = {"alertname": alertname, "severity": severity, **where}
    group_labels = {"alertname": alertname, "replica": replica}
    status = "firing" if ends_at is None else "resolved"
    alert = {
        "status": status,
        "labels": labels,
        "annotations": {"summary": summary},
        "startsAt": starts_at,
        "endsAt": ends_at,
        "fingerprint": hashlib.sha256(f"{alertname}\x00{replica}".encode()).hexdigest()[:16],
    }
    return WebhookPayload.model_validate(
        {
            "version": "4",
            "groupKey": f"deadman:{json.dumps(group_labels, sort_keys=True)}",
            "status": status,
            "receiver": RECEIVER,
            "groupLabels": group_labels,
            "commonLabels": labels,
            "alerts": [alert],
        }
    )
