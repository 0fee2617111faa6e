"""Email sink (aiosmtplib): one mail per firing alert, its resolve and acknowledgement as replies in the thread; an
incident is one mail, then digests of what changed at most every `digest_interval`, then its recovery
(bot/sinks/email_incident.py).

Transport security is never silently downgraded: `security: starttls` requires the server to offer STARTTLS
(aiosmtplib's default `start_tls=None` would quietly send in clear text when it is missing), `tls` connects with
implicit TLS, and clear text needs `security: none` plus `allow_plaintext: true` (a relay on the same host).
Certificates are always verified, against the system CAs plus an optional `ca_file`. AUTH happens only over TLS.

Repeats are not mailed: the firing mail is already in the inbox and Alertmanager's repeat_interval would add
one more unread copy per interval; the resolve (or acknowledgement) closes the thread.

How an attempt ends (the outbox retries):
- 4xx replies, dropped connections and timeouts: retry later (the server or network says "not now");
- 5xx replies (550 unknown user, 535 bad credentials, 554 rejected): failed, a retry would get the same answer;
- TLS failures (certificate refused, TLS spoken to a plaintext port), a server without STARTTLS or without AUTH:
  failed with the reason: these are configuration errors that retrying cannot fix, and retrying would hold up
  every later mail of this receiver behind the first one. `gpu_alert_bot_delivery_failures_total` counts them.
If only some recipients are refused with a 4xx, the others keep their copy and the retry goes to the rest only.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import parseaddr
from typing import Any

import aiosmtplib
from aiosmtplib import SMTPResponse

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import EmailReceiver
from bot.failure import what_failed
from bot.message import Message
from bot.models import Delivery
from bot.render.email import InlineImage, RenderedEmail, build_email, graph_image, render_email, sender_domain
from bot.render.graph import graph_description, graph_filename
from bot.sinks.base import DeliveryResult, Preview
from bot.sinks.email_incident import IncidentMails, incident_mail
from bot.sinks.graphs import AlertPictures
from bot.storage.interface import Store

log = logging.getLogger(__name__)

_CAUSE_DEPTH = 8
_PREVIEW_HEADERS = ("From", "To", "Subject", "Message-ID", "In-Reply-To")


class _Refused(Exception):
    """The server cannot be used as configured (no STARTTLS, no AUTH): fail without retrying."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class EmailRendering:
    """The mail an email receiver sends for a message; its preview needs neither the SMTP server nor the store."""

    def __init__(self, config: EmailReceiver) -> None:
        self.name = config.name
        self._config = config
        self._domain = sender_domain(config.sender)

    def mail(self, message: Message, date: datetime, picture: bytes | None = None, alt: str = "") -> EmailMessage:
        """The mail for a message; `picture`, the PNG of its alert's history, goes inline in the HTML part."""
        image = None
        if picture is not None:
            image = graph_image(message, self._domain, picture, alt, graph_filename(message))
        return self._render(message, date, image)[1]

    def preview(self, delivery: Delivery) -> Preview:
        view = delivery.message.incident
        if view is not None:  # as the incident's first mail
            incident = incident_mail(view, self._domain, None)
            assert incident is not None  # a first mail always says something
            rendered = incident.rendered
            mail = build_email(
                rendered, self._config.sender, self._config.to, delivery.created_at, attachments=incident.attachments
            )
        else:
            rendered, mail = self._render(delivery.message, delivery.created_at)
        headers = {name: str(mail[name]) for name in _PREVIEW_HEADERS if mail[name]}
        return {"email": {"headers": headers, "text": rendered.text, "html": rendered.html}}

    def _render(
        self, message: Message, date: datetime, image: InlineImage | None = None
    ) -> tuple[RenderedEmail, EmailMessage]:
        rendered = render_email(message, self._domain, image)
        return rendered, build_email(rendered, self._config.sender, self._config.to, date, image)


class EmailSink:
    def __init__(
        self,
        config: EmailReceiver,
        store: Store,
        pictures: AlertPictures | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = config.name
        self._config = config
        self._store = store
        self._pictures = pictures
        self._envelope_sender = parseaddr(config.sender)[1]
        self._recipients = [parseaddr(address)[1] for address in config.to]
        self._rendering = EmailRendering(config)
        self._tls = tls_context(config)
        self._incidents = IncidentMails(config, store, clock, sender_domain(config.sender))

    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        message = delivery.message
        if message.event == "repeat":
            return DeliveryResult.ok()
        if message.incident is not None:
            return await self._incidents.deliver(delivery.id, message.incident, self._send_mail)
        picture, alt = await self._picture(message)
        return await self._send_mail(delivery.id, self._rendering.mail(message, datetime.now(UTC), picture, alt))

    async def _send_mail(self, delivery_id: int, mail: EmailMessage) -> DeliveryResult:
        """Send to the recipients that do not have this delivery's mail yet (a retry after some were deferred)."""
        state_key = f"delivery:{delivery_id}"
        state = await self._store.get_sink_state(self.name, state_key) or {}
        already = set(state.get("sent_to", []))
        recipients = [r for r in self._recipients if r not in already]
        try:
            refused = await self._send(mail, recipients)
        except _Refused as exc:
            return DeliveryResult.failed(exc.reason, exc.detail)
        except (aiosmtplib.SMTPException, OSError) as exc:
            return classify_smtp_error(exc)
        return await self._partial(state_key, already, recipients, refused)

    def preview(self, delivery: Delivery) -> Preview:
        return self._rendering.preview(delivery)

    async def close(self) -> None:
        if self._pictures is not None:
            await self._pictures.close()

    async def _picture(self, message: Message) -> tuple[bytes | None, str]:
        """The firing mail's picture of the alert's history (and its alt text); None to send the text alone."""
        if self._pictures is None or message.event not in ("firing", "refiring"):
            return None, ""
        graph = await self._pictures.graph(message)
        if graph is None:
            return None, ""
        return await self._pictures.png(graph), graph_description(graph)

    async def _send(self, mail: EmailMessage, recipients: list[str]) -> dict[str, SMTPResponse]:
        smtp = await smtp_session(self._config, self._tls)
        try:
            refused, _reply = await smtp.send_message(mail, sender=self._envelope_sender, recipients=recipients)
            # The server has the mail: a failed goodbye must not make the outbox send it again.
            with contextlib.suppress(aiosmtplib.SMTPException, OSError):
                await smtp.quit()
        finally:
            smtp.close()
        return refused

    async def _partial(
        self, state_key: str, already: set[str], recipients: list[str], refused: dict[str, SMTPResponse]
    ) -> DeliveryResult:
        """Some recipients were refused while others took the mail."""
        rejected = {r: f"{reply.code} {reply.message}" for r, reply in refused.items() if reply.code >= 500}
        if rejected:
            log.warning("recipients refused for good", extra={"receiver": self.name, "refused": rejected})
        deferred = {r: f"{reply.code} {reply.message}" for r, reply in refused.items() if reply.code < 500}
        if not deferred:
            return DeliveryResult.ok()
        sent = already | (set(recipients) - set(refused)) | set(rejected)
        await self._store.put_sink_state(self.name, state_key, {"sent_to": sorted(sent)})
        return DeliveryResult.retry_later("recipients_deferred", _describe_replies(deferred))


async def probe_smtp(config: EmailReceiver) -> DeliveryResult:
    """Connect, STARTTLS and AUTH as a delivery does, then quit without sending anything (the self-test)."""
    try:
        smtp = await smtp_session(config, tls_context(config))
        with contextlib.suppress(aiosmtplib.SMTPException, OSError):
            await smtp.quit()
        smtp.close()
    except _Refused as exc:
        return DeliveryResult.failed(exc.reason, exc.detail)
    except (aiosmtplib.SMTPException, OSError) as exc:
        return classify_smtp_error(exc)
    return DeliveryResult.ok()


async def smtp_session(config: EmailReceiver, tls: ssl.SSLContext) -> aiosmtplib.SMTP:
    """A connection ready to send: TLS as configured, logged in when credentials are."""
    host, _, port = config.smarthost.rpartition(":")
    smtp = aiosmtplib.SMTP(
        hostname=host.strip("[]"),
        port=int(port),
        use_tls=config.security == "tls",
        start_tls=False,  # upgraded below, only after checking that the server offers it
        tls_context=tls,
        timeout=config.timeout,
    )
    await smtp.connect()
    try:
        if config.security == "starttls":
            await _starttls(smtp, config)
        if config.username is not None and config.password_file is not None:
            await _login(smtp, config, config.username, config.password_file.get())
    except BaseException:
        smtp.close()
        raise
    return smtp


async def _starttls(smtp: aiosmtplib.SMTP, config: EmailReceiver) -> None:
    await smtp.ehlo()
    if not smtp.supports_extension("starttls"):
        raise _Refused(
            "starttls_unsupported",
            f"{config.smarthost} does not offer STARTTLS; the mail was not sent in clear text "
            "(use security: tls for implicit TLS, or security: none with allow_plaintext for a local relay)",
        )
    await smtp.starttls()
    await smtp.ehlo()


async def _login(smtp: aiosmtplib.SMTP, config: EmailReceiver, username: str, password: str) -> None:
    if smtp.last_ehlo_response is None:
        await smtp.ehlo()
    if not smtp.supports_extension("auth"):
        raise _Refused("auth_unsupported", f"{config.smarthost} does not offer AUTH over this connection")
    await smtp.login(username, password)


def tls_context(config: EmailReceiver) -> ssl.SSLContext:
    """System CAs plus the configured extra CA; hostname checking and verification always on."""
    context = ssl.create_default_context()
    if config.ca_file is not None:
        context.load_verify_locations(cafile=str(config.ca_file))
    return context


def classify_smtp_error(exc: BaseException) -> DeliveryResult:
    """Turn what aiosmtplib raised into delivered / retry later / failed (see the module docstring)."""
    tls_failure = _ssl_error_in(exc)
    if tls_failure is not None and not isinstance(tls_failure, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return _tls_failed(tls_failure)
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        replies = {r.recipient: f"{r.code} {r.message}" for r in exc.recipients}
        if any(r.code < 500 for r in exc.recipients):
            return DeliveryResult.retry_later("recipients_deferred", _describe_replies(replies))
        return DeliveryResult.failed("recipients_refused", _describe_replies(replies))
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return _by_reply_code(exc)
    if isinstance(exc, TimeoutError):  # aiosmtplib's timeouts are TimeoutErrors too
        return DeliveryResult.retry_later("timeout", str(exc))
    if isinstance(exc, OSError):  # refused, reset, disconnected (SMTPServerDisconnected is a ConnectionError)
        return DeliveryResult.retry_later("connection_error", str(exc))
    return DeliveryResult.failed("smtp_error", what_failed(exc))


def _by_reply_code(exc: aiosmtplib.SMTPResponseException) -> DeliveryResult:
    detail = f"{exc.code} {exc.message}"
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        if exc.code >= 500:
            return DeliveryResult.failed("auth_failed", f"the server refused the credentials: {detail}")
        return DeliveryResult.retry_later("auth_unavailable", detail)
    if 400 <= exc.code < 500:
        return DeliveryResult.retry_later(f"smtp_{exc.code}", detail)
    if exc.code >= 500:
        return DeliveryResult.failed(f"smtp_{exc.code}", detail)
    return DeliveryResult.retry_later("smtp_unexpected_reply", detail)


def _tls_failed(error: ssl.SSLError) -> DeliveryResult:
    if isinstance(error, ssl.SSLCertVerificationError):
        return DeliveryResult.failed(
            "tls_certificate",
            f"the server's certificate was refused ({error.verify_message}); certificates are always verified: "
            "fix the server's certificate or name the CA that signed it in ca_file",
        )
    return DeliveryResult.failed(
        "tls_error",
        f"TLS failed ({error.reason or error}); security: tls needs an implicit-TLS port (usually 465), "
        "security: starttls a submission port that offers STARTTLS (usually 587)",
    )


def _ssl_error_in(exc: BaseException) -> ssl.SSLError | None:
    """The ssl.SSLError behind an exception: aiosmtplib wraps the implicit-TLS ones in SMTPConnectError."""
    current: BaseException | None = exc
    for _ in range(_CAUSE_DEPTH):
        if current is None:
            return None
        if isinstance(current, ssl.SSLError):
            return current
        current = current.__cause__ or current.__context__
    return None


def _describe_replies(replies: dict[str, Any]) -> str:
    return "; ".join(f"{recipient}: {reply}" for recipient, reply in sorted(replies.items()))
