"""An incident in one Slack channel: its card posted once and updated in place, its thread (one line per host in
a few replies, the list of alerts as one attached file, the heat map, one recovery line).

Each delivery carries the whole incident as it stands (bot/incident/model.py); an older version than the one
shown changes nothing, and a part whose rendering did not change is not sent again, so many versions cost few
Slack calls. Every post is made once: its nonce is recorded before it (the card's `posting`), and an attempt
after one without a clear answer looks for it in Slack first (bot/sinks/slack/channel.py). A file's share is
recorded as `sharing` before it is made and looked for in the thread when in doubt, as an alert's picture is.

The alerts of the incident get a record pointing at it (`mode="incident"`), so the notes of `/gpu ack` and
`/gpu silence` about one of them reach the incident's thread, and an alert that had a message of its own keeps it;
so does the incident's own key (`incident:<id>`), for the notes and the approval message of a fleet action.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from datetime import datetime

from bot.clock import Clock
from bot.incident.lines import with_alerts
from bot.incident.model import IncidentView, incident_key
from bot.message import Message
from bot.metrics import Metrics
from bot.render.graph import Theme
from bot.render.graph_worker import GraphRenderer
from bot.render.incident_graph import incident_heat, render_incident_heat
from bot.render.slack import Controls, Payload
from bot.render.slack.incident import incident_card
from bot.render.slack.incident_thread import HOSTS_PER_REPLY, alert_list, hosts_reply, recovery_reply
from bot.sinks.slack.channel import SlackChannel, SlackFailure
from bot.sinks.slack.pictures import SlackFiles
from bot.sinks.slack.state import AlertRecord, Attachment, HostReply, IncidentCard, Posting, SinkState, Upload
from bot.storage.interface import Store

log = logging.getLogger(__package__)

# The attached list and the heat map are renewed when alerts joined since, at most this often (and once more
# when the incident is over, for the list).
_RENEW_AFTER = 300.0
_SHARE_ATTEMPTS = 3
# An incident's card and lines are edited at most this often for figures alone (Slack's chat.update is about
# 50 a minute per workspace); the put-off edit comes with the next version, or with this one shown again.
_EDIT_INTERVAL = 5.0
_MIN_WAIT = 0.1


def digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _named(view: IncidentView, hosts: list[str]) -> str:
    """What the lines of these hosts name (the host, its alertnames and GPUs), figures left out."""
    mine = set(hosts)
    return digest(sorted([h.host, h.alertnames, h.gpus] for h in view.hosts if h.host in mine))


def _stage(view: IncidentView) -> str:
    """What makes an edit urgent when it changes: the evidence found, the cause, open or over."""
    return f"{view.analysed}:{view.cause.key if view.cause else ''}:{view.status}"


class IncidentCards:
    """The incidents of one receiver's channel."""

    def __init__(
        self,
        channel: SlackChannel,
        store: Store,
        state: SinkState,
        controls: Controls,
        metrics: Metrics,
        clock: Clock,
        renderer: GraphRenderer | None,
        theme: Theme,
    ) -> None:
        self.name = channel.name
        self._channel = channel
        self._files = SlackFiles(channel)
        self._store = store
        self._state = state
        self._controls = controls
        self._metrics = metrics
        self._clock = clock
        self._renderer = renderer
        self._theme = theme

    async def show(self, message: Message) -> float | None:
        """Bring the incident's card and thread to this version (or leave them: an older version). Returns in how
        many seconds to show the incident again when an edit was put off (see `_paced`), else None."""
        view = message.incident
        assert view is not None, "an incident's message carries its view"
        card = await self._state.card(view.id) or IncidentCard()
        if view.version < card.version:
            return None
        view = await with_alerts(view, self._store)
        paced = self._paced(card, view)
        if card.ts:  # the host lines first: they are where a person finds each new alert
            put_off = await self._hosts(view, card, paced)
            put_off = await self._card(view, card, paced) or put_off
        else:  # the thread needs its card
            put_off = await self._card(view, card, paced)
            put_off = await self._hosts(view, card, paced) or put_off
        await self._members(view, card)
        await self._alert_list(view, card)
        await self._heat_map(view, card)
        await self._recovery(view, card)
        if not put_off:
            return None
        return max(_MIN_WAIT, card.edited_at + _EDIT_INTERVAL - self._clock.now().timestamp())

    def _paced(self, card: IncidentCard, view: IncidentView) -> bool:
        """Whether an edit that changes nothing but figures waits: the incident was edited less than
        `_EDIT_INTERVAL` ago (its first evidence, its cause, its recovery and new hosts are shown at once)."""
        recent = self._clock.now().timestamp() - card.edited_at < _EDIT_INTERVAL
        return recent and card.stage == _stage(view)

    # --- the card -----------------------------------------------------------------------------------------
    async def _card(self, view: IncidentView, card: IncidentCard, paced: bool) -> bool:
        """Post the card, or edit it when it changed; True when the edit is put off."""
        payload = incident_card(view, self._controls)
        shown = digest(payload)
        card.version = view.version
        if not card.ts:
            card.channel, card.ts = await self._post_once(view.id, card, payload, "", incident_key(view.id))
            await self._state.save_record(incident_key(view.id), _in_thread(view.id, card))
        elif shown == card.shown:
            return False
        elif paced:
            return True
        else:
            await self._channel.update(card.channel, card.ts, payload)
        card.shown, card.status, card.stage = shown, view.status, _stage(view)
        card.edited_at = self._clock.now().timestamp()
        await self._save(view.id, card)
        return False

    async def _members(self, view: IncidentView, card: IncidentCard) -> None:
        """A record for each alert new to the incident that has none in this channel yet (one write)."""
        members = await self._state.members(view.id)
        known = set(members.keys)
        new = [a.alert_key for a in view.alerts or () if a.alert_key not in known]
        if not new:
            return
        records: dict[str, tuple[AlertRecord, None]] = {}
        for key in new:
            if await self._state.record(key) is None:
                records[key] = (_in_thread(view.id, card), None)
        members.keys = [*members.keys, *new]
        await self._state.save(records=records, members=(view.id, members))

    # --- the thread: hosts, files, recovery -----------------------------------------------------------------
    async def _hosts(self, view: IncidentView, card: IncidentCard, paced: bool) -> bool:
        """One line per host; a host keeps the reply it was first listed in, new hosts go to the last reply
        while it has room, then to a new one. True when an edit of lines already shown is put off."""
        placed = {host for reply in card.replies for host in reply.hosts}
        for host in (h.host for h in view.hosts if h.host not in placed):
            if not card.replies or len(card.replies[-1].hosts) >= HOSTS_PER_REPLY:
                card.replies.append(HostReply())
            card.replies[-1].hosts.append(host)
        first, put_off = 1, False
        for index, reply in enumerate(card.replies):
            payload = hosts_reply(view, reply.hosts, first)
            first += len(reply.hosts)
            shown, named = digest(payload), _named(view, reply.hosts)
            if not reply.ts:
                nonce = f"incident:{view.id}:hosts:{index}"
                _, reply.ts = await self._post_once(view.id, card, payload, card.ts, nonce)
            elif shown == reply.shown:
                continue
            elif reply.named == named and paced:
                put_off = True
                continue
            else:
                await self._channel.update(card.channel, reply.ts, payload)
            reply.shown, reply.named = shown, named
            card.edited_at = self._clock.now().timestamp()
            await self._save(view.id, card)
        return put_off

    async def _alert_list(self, view: IncidentView, card: IncidentCard) -> None:
        """Every alert with its id, as one text file in the thread: shared with the first hosts, renewed when
        alerts joined since, at most every five minutes, and once when the incident is over."""
        wanted = digest(sorted(a.alert_key for a in view.alerts or ()))
        over = view.status == "resolved"
        if not self._due(card.alert_list, wanted, renew=over) or not view.alerts:
            return
        at = f"{self._clock.now():%Y-%m-%d %H:%M:%S} UTC"
        data = alert_list(view, at).encode()
        title = f"All {view.scope.alerts:,} alerts of this incident, with their ids"
        await self._share(view.id, card, card.alert_list, wanted, (data, f"incident-{view.id}-alerts.txt", title))

    async def _heat_map(self, view: IncidentView, card: IncidentCard) -> None:
        """The alerts by host and start time, with the card's first complete version; renewed like the list."""
        if self._renderer is None or not view.analysed:
            return
        wanted = digest(sorted(a.alert_key for a in view.alerts or ()))
        if not self._due(card.heat, wanted, renew=False):
            return
        starts: dict[str, list[datetime]] = {h.host: [] for h in view.hosts}  # worst first
        for alert in view.alerts or ():
            starts.setdefault(alert.host, []).append(alert.starts_at or view.scope.since)
        heat = incident_heat(view.title, starts, self._clock.now())
        render = functools.partial(render_incident_heat, theme=self._theme)
        png = await self._renderer.render(render, heat) if heat is not None else None
        if png is None:
            card.heat.shown, card.heat.at = wanted, self._clock.now().timestamp()  # left out; tried again later
            await self._save(view.id, card)
            return
        title = f"{view.title}: alerts by host and start time"
        await self._share(view.id, card, card.heat, wanted, (png, f"incident-{view.id}-heat.png", title))

    def _due(self, attachment: Attachment, wanted: str, *, renew: bool) -> bool:
        if attachment.upload is not None:
            return True  # a share under way (or in doubt) is finished first
        if not attachment.shown:
            return True
        if attachment.shown == wanted:
            return False
        return renew or self._clock.now().timestamp() - attachment.at >= _RENEW_AFTER

    async def _share(
        self, incident_id: str, card: IncidentCard, attachment: Attachment, wanted: str, file: tuple[bytes, str, str]
    ) -> None:
        """Upload and share a file in the thread once; a share in doubt is looked for first. A file Slack refuses
        for good, or that failed a few times, is left out until the next renewal: the card and lines are there."""
        upload = attachment.upload
        if (
            upload is not None
            and upload.stage == "sharing"
            and await self._files.shared(upload.file_id, card.channel, card.ts, upload.at)
        ):
            await self._shared(incident_id, card, attachment)
            return
        data, filename, title = file
        attempts = upload.attempts if upload is not None else 0
        try:
            kind = "image/png" if filename.endswith(".png") else "text/plain"
            file_id = await self._files.upload(data, filename, title, kind)
            attachment.upload = Upload(
                stage="sharing", file_id=file_id, at=self._clock.now().timestamp(), attempts=attempts
            )
            attachment.pending = wanted
            await self._save(incident_id, card)
            await self._files.share(file_id, title, card.channel, card.ts)
        except SlackFailure as failure:
            await self._share_failed(incident_id, card, attachment, wanted, failure, attempts + 1, filename)
            return
        await self._shared(incident_id, card, attachment)

    async def _share_failed(
        self,
        incident_id: str,
        card: IncidentCard,
        attachment: Attachment,
        wanted: str,
        failure: SlackFailure,
        attempts: int,
        filename: str,
    ) -> None:
        if failure.result.retry and attempts < _SHARE_ATTEMPTS:
            current = attachment.upload or Upload()
            stage = current.stage if failure.sent is not False else "wanted"
            attachment.upload = current.model_copy(update={"attempts": attempts, "stage": stage})
            await self._save(incident_id, card)
            raise failure
        if filename.endswith(".png"):
            self._metrics.graph("upload_failed")
        log.warning(
            "a file of an incident's thread cannot be shared in Slack; left out until it is renewed",
            extra={"receiver": self.name, "file": filename, "reason": failure.result.reason},
        )
        attachment.upload, attachment.pending = None, ""
        attachment.shown, attachment.at = wanted, self._clock.now().timestamp()
        await self._save(incident_id, card)

    async def _shared(self, incident_id: str, card: IncidentCard, attachment: Attachment) -> None:
        attachment.shown, attachment.at = attachment.pending, self._clock.now().timestamp()
        attachment.upload, attachment.pending = None, ""
        await self._save(incident_id, card)

    async def _recovery(self, view: IncidentView, card: IncidentCard) -> None:
        """One thread line when every alert resolved (again after the incident reopens and resolves again)."""
        if view.status != "resolved" or view.resolved_at is None:
            return
        told = view.resolved_at.isoformat()
        if card.told_recovery == told:
            return
        nonce = f"incident:{view.id}:recovered:{int(view.resolved_at.timestamp())}"
        await self._post_once(view.id, card, recovery_reply(view), card.ts, nonce)
        card.told_recovery = told
        await self._save(view.id, card)

    # --- exactly once ---------------------------------------------------------------------------------------
    async def _post_once(
        self, incident_id: str, card: IncidentCard, payload: Payload, thread_ts: str, nonce: str
    ) -> tuple[str, str]:
        """Post unless an earlier attempt with this nonce already did (found in Slack); (channel, ts)."""
        if card.posting is not None and card.posting.nonce == nonce:
            found = await self._channel.find_posted(card.posting)
            if found is not None:
                card.posting = None
                return found
        card.posting = Posting(nonce=nonce, at=self._clock.now().timestamp(), thread_ts=thread_ts)
        await self._save(incident_id, card)
        try:
            posted = await self._channel.post(payload, thread_ts=thread_ts, nonce=nonce, key=incident_key(incident_id))
        except SlackFailure as failure:
            if failure.sent is False:
                card.posting = None
                await self._save(incident_id, card)
            raise
        card.posting = None
        return posted

    async def _save(self, incident_id: str, card: IncidentCard) -> None:
        await self._state.save(card=(incident_id, card))


def _in_thread(incident_id: str, card: IncidentCard) -> AlertRecord:
    """The record of an alert of the incident, or of the incident itself (its key `incident:<id>`: a fleet run's
    notes and approval message): its conversation is the card's thread."""
    return AlertRecord(mode="incident", incident=incident_id, channel=card.channel, ts=card.ts, thread_ts=card.ts)
