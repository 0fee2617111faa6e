"""An incident by email, against a real SMTP server (aiosmtpd): one mail, then at most one digest per
`digest_interval` however many versions come, then the recovery, all in one thread; the interval survives a
restart of the sink. Time is a fake clock."""

from __future__ import annotations

import csv
import dataclasses
import io
from email.message import EmailMessage
from typing import Any

from bot.config import EmailReceiver
from bot.incident.model import IncidentView
from bot.render.email_incident import alerts_csv, render_incident_email
from bot.sinks.base import DeliveryResult
from bot.sinks.email import EmailRendering, EmailSink
from bot.store import Store
from tests.support.clock import FakeClock
from tests.support.incidents import incident_delivery, incident_view, resolved_view
from tests.test_email import HOSTILE, receiver, smtp_server

INTERVAL = 300.0


def config(port: int, **options: Any) -> EmailReceiver:
    return receiver(port, security="none", allow_plaintext=True, digest_interval="5m", **options)


async def deliver(sink: EmailSink, view: IncidentView) -> DeliveryResult:
    return await sink.deliver(incident_delivery(view, "mail"))


def body(mail: EmailMessage) -> str:
    part = mail.get_body(("plain",))
    assert part is not None
    return str(part.get_content())


def attached_list(mail: EmailMessage) -> list[dict[str, str]]:
    [attachment] = list(mail.iter_attachments())
    assert attachment.get_filename() == "alerts.csv"
    return list(csv.DictReader(io.StringIO(str(attachment.get_content()))))


async def test_an_incident_is_one_mail_then_one_digest_per_interval_then_the_recovery(store: Store) -> None:
    clock = FakeClock()
    with smtp_server("plain") as (port, handler):
        sink = EmailSink(config(port), store, clock=clock)
        try:
            assert (await deliver(sink, incident_view(hosts=3, version=1))).delivered
            # Versions pour in while the incident grows and its cause is found: each is held, none is mailed.
            holds = []
            for version in range(2, 30):
                await clock.advance(10)
                result = await deliver(sink, incident_view(hosts=3 + version, version=version, analysed=version > 5))
                assert result.held and not result.delivered
                holds.append(result.delay)
            assert len(handler.received()) == 1
            assert holds[0] == INTERVAL - 10 and holds[-1] == INTERVAL - 280
            await clock.advance(20)
            newest = incident_view(hosts=31, version=29, analysed=True)
            assert (await deliver(sink, newest)).delivered
            # An older version offered after the newest was mailed says nothing new.
            assert (await deliver(sink, incident_view(hosts=20, version=18))).delivered
            await clock.advance(30)
            grown = incident_view(hosts=40, version=30, analysed=True)
            assert (await deliver(sink, grown)).held
            # The recovery goes at once, whatever the interval.
            assert (await deliver(sink, resolved_view(grown, version=31))).delivered
        finally:
            await sink.close()
    opening, digest, recovery = (received.mail for received in handler.received())
    root = opening["Message-ID"]
    assert opening["Subject"] == "[INCIDENT] GPUTempCritical on 3 hosts" and opening["In-Reply-To"] is None
    assert digest["Subject"] == "Re: [INCIDENT UPDATE] GPUTempCritical on 3 hosts"
    assert recovery["Subject"] == "Re: [RESOLVED] GPUTempCritical on 3 hosts after 23 min"
    for reply in (digest, recovery):
        assert reply["In-Reply-To"] == root and reply["References"] == root
        assert reply["Message-ID"] != root
    text = body(digest)
    assert "WHAT CHANGED SINCE 12:00 UTC" in text
    assert "+224 alerts: 248 on 31 hosts now" in text
    assert "Likely cause: Facility cooling" in text
    assert 'Now shared: 48 of 50 affected hosts have row="C"' in text
    assert "inlet temperature moved +9.0 °C on 47 of 50 affected hosts in the 10 min before" in text
    assert "FIRST ACTION\r\nCall the facility team for row C's cooling\r\n\r\nTHEN\r\n1. Lower the GPU" in text
    assert "lower-power-limit" in text
    assert "all 320 alerts resolved at 2026-11-29 13:54 UTC after 23 min; peak 95 °C" in body(recovery)


async def test_the_first_mail_tells_the_scope_the_hosts_worst_first_and_attaches_every_alert(store: Store) -> None:
    view = incident_view(hosts=60, version=1)
    with smtp_server("plain") as (port, handler):
        sink = EmailSink(config(port), store, clock=FakeClock())
        try:
            assert (await deliver(sink, view)).delivered
        finally:
            await sink.close()
    [received] = handler.received()
    text = body(received.mail)
    # The id a person passes to `report`, in the first lines.
    assert text.splitlines()[2] == f"Incident {view.id} · gpu-alert-bot report {view.id}"
    assert "480 alerts on 60 of 1,000 hosts, 480 of 8,000 GPUs, 93 to 95 °C; since 2026-11-29 13:31 UTC" in text
    assert "Still being gathered" in text
    assert "HOSTS, WORST FIRST (THE FIRST 50; 10 MORE IN ALERTS.CSV)" in text
    assert "k-ai-000  0-7   93 to 95 °C  8" in text and "k-ai-050" not in text
    rows = attached_list(received.mail)
    assert [row["id"] for row in rows] == [alert.short_id for alert in view.alerts]
    assert rows[0] == {"id": "a000000", "alertname": "GPUTempCritical", "host": "k-ai-000", "gpu": "0", "value": "93",
                       "status": "firing"}  # fmt: skip


async def test_a_version_that_changes_nothing_is_no_mail_and_the_interval_survives_a_restart(store: Store) -> None:
    clock = FakeClock()
    with smtp_server("plain") as (port, handler):
        first = EmailSink(config(port), store, clock=clock)
        try:
            assert (await deliver(first, incident_view(version=1))).delivered
        finally:
            await first.close()
        await clock.advance(60)
        restarted = EmailSink(config(port), store, clock=clock)
        try:
            held = await deliver(restarted, incident_view(version=2))
            assert held.held and held.delay == INTERVAL - 60
            await clock.advance(INTERVAL)
            # Only the version moved (evidence still gathered, same alerts): nothing to tell.
            assert (await deliver(restarted, incident_view(version=2))).delivered
        finally:
            await restarted.close()
    assert len(handler.received()) == 1
    state = await store.get_sink_state("mail", "incident:inc7q2")
    assert state is not None and state["version"] == 2 and state["mails"] == 1


async def test_an_incident_already_resolved_at_its_first_mail_is_one_mail(store: Store) -> None:
    with smtp_server("plain") as (port, handler):
        sink = EmailSink(config(port), store, clock=FakeClock())
        try:
            assert (await deliver(sink, resolved_view(incident_view(), version=2))).delivered
        finally:
            await sink.close()
    [received] = handler.received()
    assert received.mail["Subject"] == "[RESOLVED] GPUTempCritical on 3 hosts after 23 min"
    assert received.mail["In-Reply-To"] is None


def test_label_values_are_escaped_in_html_and_never_formulas_in_the_list() -> None:
    view = incident_view(hosts=1, gpus=1)
    line = view.hosts[0].model_copy(update={"host": HOSTILE})
    alert = dataclasses.replace(view.alerts[0], host='=HYPERLINK("http://x")', alertname=HOSTILE)
    hostile = view.model_copy(update={"hosts": [line], "alerts": [alert], "title": HOSTILE})
    rendered = render_incident_email(hostile, "example.com", "opening").rendered
    assert "<script>" not in rendered.html and "&lt;script&gt;" in rendered.html
    assert "\n" not in rendered.subject
    [row] = list(csv.DictReader(io.StringIO(alerts_csv(hostile))))
    assert row["host"] == '\'=HYPERLINK("http://x")'


def test_the_preview_of_an_incident_is_its_first_mail() -> None:
    preview = EmailRendering(config(25)).preview(incident_delivery(incident_view(analysed=True), "mail"))
    assert preview["email"]["headers"]["Subject"] == "[INCIDENT] GPUTempCritical on 3 hosts"
    assert "Facility cooling" in preview["email"]["text"]


async def test_evidence_that_finds_nothing_is_still_told_in_the_digest(store: Store) -> None:
    clock = FakeClock()
    with smtp_server("plain") as (port, handler):
        sink = EmailSink(config(port), store, clock=clock)
        try:
            assert (await deliver(sink, incident_view(version=1))).delivered
            await clock.advance(INTERVAL)
            assert (await deliver(sink, incident_view(version=2, analysed=True, traits=[], signals=[], companions=[],
                                                      cause=None))).delivered  # fmt: skip
        finally:
            await sink.close()
    _opening, digest = (received.mail for received in handler.received())
    text = body(digest)
    assert "Evidence gathered, no likely cause: Nothing stands out: the affected hosts look like any hosts" in text


async def test_an_incident_firing_again_after_its_recovery_is_mailed_at_once(store: Store) -> None:
    clock = FakeClock()
    view = incident_view(version=1)
    with smtp_server("plain") as (port, handler):
        sink = EmailSink(config(port), store, clock=clock)
        try:
            assert (await deliver(sink, view)).delivered
            assert (await deliver(sink, resolved_view(view, version=2))).delivered
            assert (await deliver(sink, resolved_view(view, version=3))).delivered  # still resolved: no mail
            await clock.advance(10)
            assert (await deliver(sink, incident_view(version=4))).delivered
        finally:
            await sink.close()
    subjects = [received.mail["Subject"] for received in handler.received()]
    assert subjects == [
        "[INCIDENT] GPUTempCritical on 3 hosts",
        "Re: [RESOLVED] GPUTempCritical on 3 hosts after 23 min",
        "Re: [INCIDENT UPDATE] GPUTempCritical on 3 hosts",
    ]
    assert "Firing again after its recovery: 24 alerts firing" in body(handler.received()[-1].mail)
