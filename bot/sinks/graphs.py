"""The picture of an alert for a sink that can show one (Slack, email): drawn from the enrichment stored with the
alert (the history the Prometheus enricher already fetched, no second query), in the graph worker process."""

from __future__ import annotations

import functools
import logging

from pydantic import ValidationError

from bot.config.receivers import GraphTheme
from bot.evidence import Enrichment
from bot.message import Message
from bot.render.graph import AlertGraph, message_graph, render_alert_graph
from bot.render.graph_worker import GraphRenderer
from bot.storage.interface import Store

log = logging.getLogger(__name__)


class AlertPictures:
    """One receiver's pictures: on or off (`graphs`, on by default where matplotlib is installed), its theme."""

    def __init__(self, store: Store, renderer: GraphRenderer, enabled: bool | None, theme: GraphTheme) -> None:
        self._store = store
        self.renderer = renderer
        self.enabled = renderer.available if enabled is None else enabled and renderer.available
        self._theme = theme
        if enabled and not renderer.available:
            log.warning("graphs: true, but matplotlib is not installed (the graphs extra): messages go without them")

    async def graph(self, message: Message) -> AlertGraph | None:
        """What the alert's picture would show; None when this receiver shows none or there is nothing to draw."""
        if not self.enabled:
            return None
        alert = await self._store.get_alert(message.alert_key)
        if alert is None or alert.enrichment is None:
            return None
        try:
            enrichment = Enrichment.model_validate(alert.enrichment)
        except ValidationError as exc:
            log.warning(
                "stored enrichment unreadable: no picture", extra={"alert_key": message.alert_key, "reason": str(exc)}
            )
            return None
        return message_graph(enrichment, message)

    async def png(self, graph: AlertGraph) -> bytes | None:
        """The PNG of the picture, or None when drawing it failed or took too long (counted by the renderer)."""
        return await self.renderer.render(functools.partial(render_alert_graph, theme=self._theme), graph)

    async def close(self) -> None:
        await self.renderer.close()
