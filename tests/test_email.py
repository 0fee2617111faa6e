"""Email: rendering (subject, threading, same content in text and HTML, escaping) and the SMTP transport against a
real aiosmtpd server (STARTTLS, implicit TLS, plaintext only when allowed, AUTH, certificate checks, replies).

`SmtpServer` and `message` are used by tests/test_email_e2e.py too.
"""

from __future__ import annotations

import email.policy
import html.parser
import re
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any, Literal

import aiosmtplib
import pytest
import trustme
import yaml
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from bot.config import ConfigError, EmailReceiver, StoreConfig, load_config
from bot.message import Link, Message, Section
from bot.models import Delivery
from bot.render.email import render_email, thread_message_id
from bot.sinks.base import DeliveryResult
from bot.sinks.email import EmailSink, classify_smtp_error
from bot.store import Store, open_store
from tests.support.messages import delivery_of, sample_message
from tests.support.processes import free_port

HOSTILE = '<script>alert("x")</script>&<b>'


# --- a real SMTP server -----------------------------------------------------------------------------------
@dataclass
class ReceivedMail:
    mail_from: str
    rcpt_tos: list[str]
    mail: EmailMessage
    tls: bool
    authenticated: bool


@dataclass
class RecordingHandler:
    """aiosmtpd handler that keeps every accepted mail; `replies` answers RCPT for some addresses."""

    replies: dict[str, str] = field(default_factory=dict)
    mails: list[ReceivedMail] = field(default_factory=list)
    journal: list[tuple[str, Any]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        with self.lock:
            reply = self.replies.get(address)
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        mail = BytesParser(policy=email.policy.default).parsebytes(envelope.original_content)
        assert isinstance(mail, EmailMessage)
        received = ReceivedMail(
            envelope.mail_from,
            list(envelope.rcpt_tos),
            mail,
            tls=server.transport.get_extra_info("ssl_object") is not None,
            authenticated=bool(session.authenticated),
        )
        with self.lock:
            self.mails.append(received)
            if self.journal is not None:
                self.journal.append(("email", received))
        return "250 Message accepted for delivery"

    def received(self) -> list[ReceivedMail]:
        with self.lock:
            return list(self.mails)


@dataclass
class Pki:
    """A CA the bot trusts (its PEM in `ca_file`), another it does not, and server certificates."""

    ca_file: Path
    trusted: ssl.SSLContext  # server context, certificate for 127.0.0.1 signed by the trusted CA
    untrusted: ssl.SSLContext  # certificate for 127.0.0.1 signed by an unknown CA
    wrong_name: ssl.SSLContext  # trusted CA, but issued for mail.example.com


def _server_context(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    return context


def make_pki(directory: Path) -> Pki:
    ca, stranger = trustme.CA(), trustme.CA()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return Pki(
        ca_file,
        _server_context(ca, "127.0.0.1"),
        _server_context(stranger, "127.0.0.1"),
        _server_context(ca, "mail.example.com"),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


USERS = {"gpu-alert-bot": "s3cret-smtp"}


def _authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and USERS.get(auth_data.login.decode()) == auth_data.password.decode()
    # handled=False: aiosmtpd answers 235 / 535 itself.
    return AuthResult(success=ok, handled=False)


Mode = Literal["starttls", "tls", "plain"]


@contextmanager
def smtp_server(
    mode: Mode, context: ssl.SSLContext | None = None, *, auth: bool = False, handler: RecordingHandler | None = None
) -> Iterator[tuple[int, RecordingHandler]]:
    """A real aiosmtpd server on a free loopback port: STARTTLS offered (and required), implicit TLS, or none."""
    handler = handler or RecordingHandler()
    options: dict[str, Any] = {"authenticator": _authenticator} if auth else {}
    if mode == "starttls":
        options.update(tls_context=context, require_starttls=True)
    elif mode == "tls":
        options.update(ssl_context=context)
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port, **options)
    controller.start()
    try:
        yield port, handler
    finally:
        controller.stop()


# --- messages and sinks -------------------------------------------------------------------------------------
def message(event: str = "firing", **changes: Any) -> Message:
    return sample_message(event, **changes)


def delivery(msg: Message, delivery_id: int = 1) -> Delivery:
    return delivery_of(msg, "mail", delivery_id)


def receiver(port: int, **options: Any) -> EmailReceiver:
    data: dict[str, Any] = {
        "type": "email",
        "name": "mail",
        "to": ["oncall@example.com"],
        "from": "GPU alerts <gpu-alert-bot@example.com>",
        "smarthost": f"127.0.0.1:{port}",
        "timeout": 5,
    }
    data.update(options)
    return EmailReceiver.model_validate(data)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await open_store(StoreConfig(path=tmp_path / "bot.db"))
    yield opened
    await opened.close()


async def send(config: EmailReceiver, store: Store, msg: Message | None = None, delivery_id: int = 1) -> DeliveryResult:
    sink = EmailSink(config, store)
    try:
        return await sink.deliver(delivery(msg or message(), delivery_id))
    finally:
        await sink.close()


# --- rendering ----------------------------------------------------------------------------------------------
def test_subjects_say_the_status_and_the_resolve_is_a_reply_in_the_firing_thread() -> None:
    firing = render_email(message(), "example.com")
    resolved = render_email(message("resolved"), "example.com")
    acked = render_email(message("ack", acked_by="alice"), "example.com")
    assert firing.subject == "[FIRING] GPUXidError on k-ai-01 GPU 3"
    assert firing.in_reply_to is None and firing.references == ()
    assert resolved.subject == "Re: [RESOLVED] GPUXidError on k-ai-01 GPU 3 after 12 min"
    assert resolved.in_reply_to == firing.message_id and resolved.references == (firing.message_id,)
    assert acked.subject == "Re: [ACKNOWLEDGED] GPUXidError on k-ai-01 GPU 3 by alice"
    assert acked.in_reply_to == firing.message_id
    assert len({firing.message_id, resolved.message_id, acked.message_id}) == 3
    assert firing.thread_topic == resolved.thread_topic == "GPUXidError on k-ai-01 GPU 3"


def test_firing_again_is_a_reply_and_every_later_mail_has_its_own_message_id() -> None:
    firing = render_email(message(), "example.com")
    resolved = render_email(message("resolved", times_seen=2), "example.com")
    again = render_email(message("refiring", times_seen=3), "example.com")
    resolved_again = render_email(message("resolved", times_seen=4), "example.com")
    assert again.subject == "Re: [FIRING AGAIN] GPUXidError on k-ai-01 GPU 3"
    assert again.in_reply_to == resolved_again.in_reply_to == firing.message_id
    assert len({m.message_id for m in (firing, resolved, again, resolved_again)}) == 4


def test_message_ids_are_derived_from_the_alert_key() -> None:
    first = render_email(message(), "example.com").message_id
    assert render_email(message(), "example.com").message_id == first
    assert first == thread_message_id(message().alert_key, "example.com")
    assert re.fullmatch(r"<gpu-alert-bot\.[0-9a-f]{32}\.firing@example\.com>", first)
    other = message(alert_key="fedcba9876543210@2026-11-29T13:31:59+00:00")
    assert render_email(other, "example.com").message_id != first


def test_a_related_alert_is_threaded_under_its_root() -> None:
    root_key = "aaaaaaaaaaaaaaaa@2026-11-29T13:30:00+00:00"
    related = render_email(message(related_to=root_key), "example.com")
    root_id = thread_message_id(root_key, "example.com")
    assert related.in_reply_to == root_id and related.references == (root_id,)
    resolved = render_email(message("resolved", related_to=root_key), "example.com")
    assert resolved.references == (root_id, thread_message_id(message().alert_key, "example.com"))


def test_subject_is_one_line_whatever_the_labels_hold() -> None:
    rendered = render_email(message(title="GPUXidError on k-ai-01\r\nBcc: victim@example.com" + "x" * 500), "e.com")
    assert "\n" not in rendered.subject and "\r" not in rendered.subject
    assert len(rendered.subject) < 200 and rendered.subject.endswith("…")


class _VisibleText(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def _words(text: str) -> list[str]:
    return re.findall(r"[^\s]+", text.lower())


def test_text_and_html_parts_carry_the_same_content() -> None:
    rendered = render_email(message(), "example.com")
    visible = _VisibleText()
    visible.feed(rendered.html)
    # The text part numbers the runbook steps itself; in HTML the <ol> does.
    text_without_numbers = re.sub(r"(?m)^\d+\. ", "", rendered.text)
    assert _words(text_without_numbers) == _words(" ".join(visible.parts))
    for expected in ("Xid 79 on GPU 3", "NVRM: Xid (PCI:0000:3b:00): 79", "kubectl drain k-ai-01", "more words"):
        assert expected in rendered.text and expected in " ".join(visible.parts)


def test_hostile_label_and_annotation_values_are_escaped_in_html() -> None:
    hostile = message(
        labels={"alertname": "GPUXidError", "team": HOSTILE},
        summary=HOSTILE,
        sections=[Section(title=HOSTILE, kind="code", lines=[HOSTILE])],
        links=[Link(text=HOSTILE, url='https://x.example/"><script>')],
        details={"annotations": {"description": HOSTILE}},
    )
    rendered = render_email(hostile, "example.com")
    assert "<script>" not in rendered.html and "<b>" not in rendered.html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&lt;b&gt;" in rendered.html
    assert 'href="https://x.example/&quot;&gt;&lt;script&gt;"' in rendered.html
    assert HOSTILE in rendered.text


def test_only_web_and_mail_links_are_clickable() -> None:
    rendered = render_email(message(), "example.com")
    assert '<a href="https://runbooks.example/xid">' in rendered.html
    assert 'href="javascript:x"' not in rendered.html and "javascript:x" in rendered.html


# --- transport ------------------------------------------------------------------------------------------
def _parts(mail: EmailMessage) -> list[str]:
    return [part.get_content_type() for part in mail.iter_parts()]


async def test_starttls_with_the_ca_file_delivers_over_tls(pki: Pki, store: Store) -> None:
    with smtp_server("starttls", pki.trusted) as (port, handler):
        result = await send(receiver(port, ca_file=str(pki.ca_file)), store)
    assert result == DeliveryResult.ok()
    [received] = handler.received()
    assert received.tls and received.rcpt_tos == ["oncall@example.com"]
    assert received.mail_from == "gpu-alert-bot@example.com"
    assert received.mail.get_content_type() == "multipart/alternative"
    assert _parts(received.mail) == ["text/plain", "text/html"]
    assert received.mail["Subject"] == "[FIRING] GPUXidError on k-ai-01 GPU 3"
    assert received.mail["Auto-Submitted"] == "auto-generated"


async def test_implicit_tls_delivers(pki: Pki, store: Store) -> None:
    with smtp_server("tls", pki.trusted) as (port, handler):
        result = await send(receiver(port, security="tls", ca_file=str(pki.ca_file)), store)
    assert result.delivered
    assert handler.received()[0].tls


async def test_a_server_without_starttls_is_refused_rather_than_used_in_clear_text(store: Store) -> None:
    with smtp_server("plain") as (port, handler):
        result = await send(receiver(port), store)
    assert not result.delivered and not result.retry
    assert result.reason == "starttls_unsupported"
    assert handler.received() == []


class _FailingGoodbye(RecordingHandler):
    async def handle_QUIT(self, server: Any, session: Any, envelope: Any) -> str:
        return "421 4.3.2 Shutting down"


async def test_a_failed_goodbye_after_the_mail_was_accepted_is_a_delivery(store: Store) -> None:
    with smtp_server("plain", handler=_FailingGoodbye()) as (port, handler):
        result = await send(receiver(port, security="none", allow_plaintext=True), store)
    assert result.delivered and len(handler.received()) == 1


async def test_plaintext_relay_works_when_explicitly_allowed(store: Store) -> None:
    with smtp_server("plain") as (port, handler):
        result = await send(receiver(port, security="none", allow_plaintext=True), store)
    assert result.delivered
    assert not handler.received()[0].tls


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"security": "none"}, "allow_plaintext: true"),
        ({"allow_plaintext": True}, "allow_plaintext only applies to security: none"),
        ({"security": "none", "allow_plaintext": True, "username": "u", "password_file": "pw"}, "clear text"),
        ({"ca_file": "missing-ca.pem"}, "CA file"),
        ({"to": ["not an address"]}, "not an email address"),
    ],
)
def test_unsafe_or_broken_email_settings_are_configuration_errors(
    tmp_path: Path, options: dict[str, Any], problem: str
) -> None:
    (tmp_path / "pw").write_text("secret\n")
    settings = {"type": "email", "name": "mail", "to": ["a@example.com"], "from": "b@example.com"}
    settings.update(smarthost="127.0.0.1:25", **options)
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"receivers": [settings], "routing": {"default": ["mail"]}}))
    with pytest.raises(ConfigError) as error:
        load_config(config)
    assert problem in str(error.value)


async def test_auth_over_tls_with_the_password_from_its_file(pki: Pki, store: Store, tmp_path: Path) -> None:
    password = tmp_path / "smtp_password"
    password.write_text("s3cret-smtp\n")
    with smtp_server("starttls", pki.trusted, auth=True) as (port, handler):
        config = receiver(port, ca_file=str(pki.ca_file), username="gpu-alert-bot", password_file=str(password))
        result = await send(config, store)
    assert result.delivered
    assert handler.received()[0].authenticated and handler.received()[0].tls


async def test_wrong_credentials_fail_without_retry(pki: Pki, store: Store, tmp_path: Path) -> None:
    password = tmp_path / "smtp_password"
    password.write_text("wrong\n")
    with smtp_server("starttls", pki.trusted, auth=True) as (port, handler):
        config = receiver(port, ca_file=str(pki.ca_file), username="gpu-alert-bot", password_file=str(password))
        result = await send(config, store)
    assert (result.delivered, result.retry, result.reason) == (False, False, "auth_failed")
    assert "535" in result.detail and "wrong" not in result.detail
    assert handler.received() == []


@pytest.mark.parametrize("certificate", ["untrusted", "wrong_name"])
@pytest.mark.parametrize("security", ["starttls", "tls"])
async def test_a_certificate_that_does_not_verify_is_refused(
    pki: Pki, store: Store, certificate: str, security: str
) -> None:
    mode: Mode = "starttls" if security == "starttls" else "tls"
    with smtp_server(mode, getattr(pki, certificate)) as (port, handler):
        result = await send(receiver(port, security=security, ca_file=str(pki.ca_file)), store)
    assert (result.delivered, result.retry, result.reason) == (False, False, "tls_certificate")
    assert "ca_file" in result.detail
    assert handler.received() == []


async def test_system_cas_alone_do_not_trust_a_private_ca(pki: Pki, store: Store) -> None:
    with smtp_server("starttls", pki.trusted) as (port, handler):
        result = await send(receiver(port), store)
    assert result.reason == "tls_certificate"
    assert handler.received() == []


async def test_implicit_tls_against_a_starttls_port_is_a_tls_configuration_error(pki: Pki, store: Store) -> None:
    with smtp_server("starttls", pki.trusted) as (port, _handler):
        result = await send(receiver(port, security="tls", ca_file=str(pki.ca_file)), store)
    assert (result.retry, result.reason) == (False, "tls_error")


async def test_connection_refused_is_retried(store: Store) -> None:
    result = await send(receiver(free_port()), store)
    assert (result.retry, result.reason) == (True, "connection_error")


@pytest.mark.parametrize(
    ("reply", "retry", "reason"),
    [
        ("550 5.1.1 unknown user", False, "recipients_refused"),
        ("452 4.2.2 mailbox full", True, "recipients_deferred"),
    ],
)
async def test_recipient_replies_are_classified_by_code(
    pki: Pki, store: Store, reply: str, retry: bool, reason: str
) -> None:
    handler = RecordingHandler(replies={"oncall@example.com": reply})
    with smtp_server("starttls", pki.trusted, handler=handler) as (port, _handler):
        result = await send(receiver(port, ca_file=str(pki.ca_file)), store)
    assert (result.delivered, result.retry, result.reason) == (False, retry, reason)
    assert reply.split(" ", 1)[0] in result.detail


async def test_a_deferred_recipient_gets_the_retry_and_the_others_no_second_copy(pki: Pki, store: Store) -> None:
    to = ["a@example.com", "full@example.com", "gone@example.com"]
    handler = RecordingHandler(replies={"full@example.com": "452 4.2.2 mailbox full", "gone@example.com": "550 no"})
    with smtp_server("starttls", pki.trusted, handler=handler) as (port, _handler):
        config = receiver(port, ca_file=str(pki.ca_file), to=to)
        first = await send(config, store, delivery_id=7)
        assert (first.retry, first.reason) == (True, "recipients_deferred")
        with handler.lock:
            handler.replies.pop("full@example.com")
        second = await send(config, store, delivery_id=7)
    assert second.delivered
    assert [mail.rcpt_tos for mail in handler.received()] == [["a@example.com"], ["full@example.com"]]
    assert handler.received()[0].mail["Message-ID"] == handler.received()[1].mail["Message-ID"]


async def test_repeats_are_not_mailed(pki: Pki, store: Store) -> None:
    with smtp_server("starttls", pki.trusted) as (port, handler):
        result = await send(receiver(port, ca_file=str(pki.ca_file)), store, message("repeat", times_seen=3))
    assert result.delivered
    assert handler.received() == []


async def test_resolve_mail_is_a_reply_to_the_firing_mail(pki: Pki, store: Store) -> None:
    with smtp_server("starttls", pki.trusted) as (port, handler):
        config = receiver(port, ca_file=str(pki.ca_file))
        assert (await send(config, store, message("firing"), 1)).delivered
        assert (await send(config, store, message("resolved"), 2)).delivered
    firing, resolved = (mail.mail for mail in handler.received())
    assert resolved["In-Reply-To"] == firing["Message-ID"]
    assert resolved["References"] == firing["Message-ID"]
    assert resolved["Subject"] == "Re: [RESOLVED] GPUXidError on k-ai-01 GPU 3 after 12 min"


@pytest.mark.parametrize(
    ("error", "retry", "reason"),
    [
        (aiosmtplib.SMTPResponseException(421, "4.3.2 shutting down"), True, "smtp_421"),
        (aiosmtplib.SMTPDataError(451, "4.3.0 try later"), True, "smtp_451"),
        (aiosmtplib.SMTPSenderRefused(553, "5.7.1 sender rejected", "a@b"), False, "smtp_553"),
        (aiosmtplib.SMTPDataError(554, "5.6.0 message refused"), False, "smtp_554"),
        (aiosmtplib.SMTPAuthenticationError(454, "4.7.0 try later"), True, "auth_unavailable"),
        (aiosmtplib.SMTPReadTimeoutError("timed out"), True, "timeout"),
        (aiosmtplib.SMTPServerDisconnected("gone"), True, "connection_error"),
        (aiosmtplib.SMTPNotSupported("SMTPUTF8 is not supported"), False, "smtp_error"),
    ],
)
def test_smtp_errors_are_classified(error: Exception, retry: bool, reason: str) -> None:
    result = classify_smtp_error(error)
    assert (result.delivered, result.retry, result.reason) == (False, retry, reason)
