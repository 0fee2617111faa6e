"""A receiver whose deliveries carry the link to their page (`server.public_url`, bot/pages/links.py): the message is
stamped as the sink takes it, so every sink renders the link its own way and none of them needs to know of it."""

from __future__ import annotations

from bot.models import Delivery
from bot.pages.links import PageLinks
from bot.sinks.base import DeliveryResult, Preview, Previewer, Sink


class LinkedPreviewer:
    def __init__(self, previewer: Previewer, links: PageLinks) -> None:
        self.name = previewer.name
        self._previewer = previewer
        self._links = links

    def stamped(self, delivery: Delivery) -> Delivery:
        return delivery.model_copy(update={"message": self._links.stamp(delivery.message)})

    def preview(self, delivery: Delivery) -> Preview:
        return self._previewer.preview(self.stamped(delivery))


class LinkedSink(LinkedPreviewer):
    def __init__(self, sink: Sink, links: PageLinks) -> None:
        super().__init__(sink, links)
        self._sink = sink

    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        return await self._sink.deliver(self.stamped(delivery))

    async def close(self) -> None:
        await self._sink.close()
