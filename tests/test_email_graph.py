"""The alert's picture inline in the firing mail, through a real SMTP server (aiosmtpd): the MIME structure."""

from __future__ import annotations

from email.message import EmailMessage
from pathlib import Path

import pytest

from bot.metrics import Metrics
from bot.render.graph_worker import GraphRenderer
from bot.sinks.base import DeliveryResult
from bot.sinks.email import EmailSink
from bot.sinks.graphs import AlertPictures
from bot.store.sqlite import SqliteStore
from tests.support.graphs import stored_alert_delivery
from tests.support.store import sqlite_store
from tests.test_email import receiver, smtp_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def mailed(store: SqliteStore, graphs: bool | None) -> EmailMessage:
    delivery = await stored_alert_delivery(store, "mail")
    with smtp_server("plain") as (port, handler):
        config = receiver(port, security="none", allow_plaintext=True, graphs=graphs)
        sink = EmailSink(config, store, AlertPictures(store, GraphRenderer(Metrics()), config.graphs, "light"))
        try:
            assert await sink.deliver(delivery) == DeliveryResult.ok()
        finally:
            await sink.close()
        [received] = handler.received()
    return received.mail


async def test_the_firing_mail_shows_the_png_inline_in_its_html_part(store: SqliteStore) -> None:
    mail = await mailed(store, graphs=None)
    assert mail.get_content_type() == "multipart/alternative"
    text, related = mail.iter_parts()
    assert text.get_content_type() == "text/plain"
    assert related.get_content_type() == "multipart/related"
    html, image = related.iter_parts()
    assert html.get_content_type() == "text/html"
    assert image.get_content_type() == "image/png"
    cid = str(image["Content-ID"]).strip("<>")
    assert f'src="cid:{cid}"' in html.get_content()
    png = image.get_content()
    assert isinstance(png, bytes) and png.startswith(b"\x89PNG\r\n\x1a\n")
    assert image.get_content_disposition() == "inline"


async def test_the_text_part_is_the_same_with_or_without_the_picture(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path / "with") as with_store, sqlite_store(tmp_path / "without") as without_store:
        pictured = await mailed(with_store, graphs=True)
        plain = await mailed(without_store, graphs=False)
    assert plain.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in plain.iter_parts()] == ["text/plain", "text/html"]
    assert next(pictured.iter_parts()).get_content() == next(plain.iter_parts()).get_content()
