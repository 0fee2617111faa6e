"""With `server.public_url`, every receiver's message carries the link to its page: an incident's (Slack card, mail,
PagerDuty alert's `links`, console line) and an alert's own; without it, none does. Rendered by each sink's own code
(its preview is what it sends); the links followed in a browser are in tests/test_pages_browser.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.config import ConsoleReceiver, PagerDutyReceiver, Receiver, SlackReceiver, load_config
from bot.pages.links import PageLinks, page_links
from bot.render.email_incident import render_incident_email
from bot.sinks import build_previews
from tests.support.bot import write_config
from tests.support.incidents import INCIDENT_ID, incident_delivery, incident_view
from tests.support.messages import delivery_of, sample_message
from tests.test_email import receiver as email_receiver

PUBLIC = "https://gpu-alerts.example.com/"
INCIDENT_PAGE = f"https://gpu-alerts.example.com/pages/incidents/{INCIDENT_ID}"


def receivers(tmp_path: Path) -> list[Receiver]:
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    return [
        ConsoleReceiver(type="console", name="console"),
        SlackReceiver.model_validate(
            {"type": "slack", "name": "slack", "channel": "#gpu", "token_file": str(tmp_path / "secret")}
        ),
        email_receiver(2525, security="none", allow_plaintext=True),
        PagerDutyReceiver.model_validate(
            {"type": "pagerduty", "name": "pd", "routing_key_file": str(tmp_path / "secret")}
        ),
    ]


def shown(previews: dict[str, Any], delivery: Any) -> dict[str, str]:
    return {name: json.dumps(previewer.preview(delivery)) for name, previewer in previews.items()}


def test_an_incidents_card_mail_pagerduty_alert_and_console_line_link_to_its_page(tmp_path: Path) -> None:
    delivery = incident_delivery(incident_view(analysed=True), "any")
    linked = shown(build_previews(receivers(tmp_path), PageLinks(PUBLIC)), delivery)
    assert {name: INCIDENT_PAGE in text for name, text in linked.items()} == dict.fromkeys(linked, True)
    pagerduty = build_previews(receivers(tmp_path), PageLinks(PUBLIC))["pd"].preview(delivery)
    assert pagerduty["event"]["links"][0] == {"href": INCIDENT_PAGE, "text": "Incident page"}
    bare = shown(build_previews(receivers(tmp_path)), delivery)
    assert [name for name, text in bare.items() if "/pages/" in text] == []


def test_an_alerts_own_message_links_to_its_alert_page(tmp_path: Path) -> None:
    message = sample_message()
    page = PageLinks(PUBLIC).alert(message.alert_key)
    assert page.startswith("https://gpu-alerts.example.com/pages/alerts/")
    linked = shown(build_previews(receivers(tmp_path), PageLinks(PUBLIC)), delivery_of(message, "any"))
    assert {name: page in text for name, text in linked.items()} == dict.fromkeys(linked, True)


def test_links_are_made_only_with_a_public_url_and_the_pages_on(tmp_path: Path) -> None:
    off = load_config(write_config(tmp_path, {}))
    assert page_links(off.server) is None
    on = load_config(write_config(tmp_path, {"server": {"public_url": PUBLIC, "pages": {"enabled": True}}}))
    assert page_links(on.server) is not None


@pytest.mark.parametrize(
    ("server", "words"),
    [
        ({"listen": "0.0.0.0:9095", "pages": {"enabled": True}}, "open to anyone who reaches 0.0.0.0:9095"),
        ({"public_url": PUBLIC}, "lead to the pages, which are off"),
        ({"public_url": "gpu-alerts.example.com", "pages": {"enabled": True}}, "not an http:// or https:// URL"),
    ],
)
def test_a_configuration_that_would_expose_the_pages_or_link_nowhere_is_refused(
    tmp_path: Path, server: dict[str, Any], words: str
) -> None:
    with pytest.raises(Exception, match=words):
        load_config(write_config(tmp_path, {"server": server}))


def test_every_mail_of_an_incident_links_to_its_page_its_digests_and_recovery_too() -> None:
    view = incident_view(analysed=True).model_copy(update={"page_url": INCIDENT_PAGE})
    since = view.opened_at
    for kind, extra in (("opening", {}), ("digest", {"changed": ["+8 alerts"], "since": since}), ("resolved", {})):
        mail = render_incident_email(view, "example.com", kind, opening_title=view.title, **extra)  # type: ignore[arg-type]
        assert INCIDENT_PAGE in mail.rendered.text and f'href="{INCIDENT_PAGE}"' in mail.rendered.html, kind
