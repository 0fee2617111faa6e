"""The link to its page that each message carries when `server.public_url` is set: an incident's (its Slack card,
mails, PagerDuty alert and console line) and an alert's own. Stamped on the message as a receiver takes it, so
every sink renders it its own way (`IncidentView.page_url`, `Message.links`)."""

from __future__ import annotations

import urllib.parse

from bot.config import ServerConfig
from bot.incident.model import INCIDENT_KEY_PREFIX
from bot.message import Link, Message
from bot.models import short_id

PAGES_PREFIX = "/pages"
INCIDENT_LINK_TEXT = "Incident page"
ALERT_LINK_TEXT = "Alert page"


class PageLinks:
    def __init__(self, public_url: str) -> None:
        self._base = public_url.rstrip("/") + PAGES_PREFIX

    def incident(self, incident_id: str) -> str:
        return f"{self._base}/incidents/{urllib.parse.quote(incident_id, safe='')}"

    def alert(self, alert_key: str) -> str:
        return f"{self._base}/alerts/{short_id(alert_key)}"

    def stamp(self, message: Message) -> Message:
        """The message with its page's link: first among its links, so a sink that shows only some shows it."""
        view = message.incident
        if view is not None:
            url = self.incident(view.id)
            return message.model_copy(
                update={
                    "incident": view.model_copy(update={"page_url": url}),
                    "links": [Link(text=INCIDENT_LINK_TEXT, url=url), *message.links],
                }
            )
        if message.alert_key.startswith(INCIDENT_KEY_PREFIX):  # a note about an incident (a fleet action's)
            link = Link(text=INCIDENT_LINK_TEXT, url=self.incident(message.alert_key[len(INCIDENT_KEY_PREFIX) :]))
        else:
            link = Link(text=ALERT_LINK_TEXT, url=self.alert(message.alert_key))
        return message.model_copy(update={"links": [link, *message.links]})


def page_links(server: ServerConfig) -> PageLinks | None:
    """The links to make, or None when no public address is configured."""
    return PageLinks(server.public_url) if server.public_url and server.pages.enabled else None
