"""The storm's one picture: its alerts per minute by host (bot/render/storm_graph.py), shared in the storm
summary's thread, renewed at most every `_INTERVAL` while the storm changes. Alerts in a storm get no picture
of their own: a hundred graphs would bury the thread.

Shared once per version like an alert's picture (bot/sinks/slack/pictures.py): before the share the storm says
`sharing` with the file's ID, and a flusher step that finds it so looks in the thread first. A failed upload is
not retried (it would hold the storm's lines back): counted, and the storm's next version tries again.
"""

from __future__ import annotations

import functools
import logging

from bot.clock import Clock
from bot.metrics import Metrics
from bot.render.graph import Theme
from bot.render.graph_worker import GraphRenderer
from bot.render.storm_graph import render_storm_heat, storm_heat
from bot.sinks.slack.channel import SlackFailure
from bot.sinks.slack.pictures import SlackFiles
from bot.sinks.slack.state import SinkState, Storm, Upload

log = logging.getLogger(__package__)

# The first picture once the storm has a minute of shape; then one at most every five minutes.
_FIRST_AFTER = 60.0
_INTERVAL = 300.0


class StormPicture:
    def __init__(
        self, files: SlackFiles, state: SinkState, renderer: GraphRenderer, theme: Theme, metrics: Metrics, clock: Clock
    ) -> None:
        self._files = files
        self._state = state
        self._renderer = renderer
        self._theme = theme
        self._metrics = metrics
        self._clock = clock

    def due(self, storm: Storm, now: float) -> bool:
        if not storm.summary_ts or storm.failed:
            return False
        if storm.picture is not None and storm.picture.stage == "sharing":
            return True
        since = storm.picture_at or storm.started_at + _FIRST_AFTER - _INTERVAL
        return storm.version > storm.picture_version and now - since >= _INTERVAL

    async def post(self, storm: Storm) -> None:
        """Share the storm's picture as it is now (or finish the share in doubt), once."""
        shown = storm.version
        doubt = storm.picture
        if (
            doubt is None
            or doubt.stage != "sharing"
            or not await self._files.shared(doubt.file_id, storm.summary_channel, storm.summary_ts, doubt.at)
        ):
            try:
                await self._share(storm)
            except SlackFailure as failure:
                # Never retried here: the flusher would hold the storm's lines behind a picture. The next
                # version of the storm gets the next try.
                self._metrics.graph("upload_failed")
                log.warning(
                    "the storm's picture cannot be shared in Slack",
                    extra={"storm": storm.id, "reason": failure.result.reason, "detail": failure.result.detail},
                )

        def posted(s: Storm) -> None:
            s.picture, s.picture_version, s.picture_at = (
                None,
                max(s.picture_version, shown),
                self._clock.now().timestamp(),
            )

        await self._state.update_storm(storm.id, posted)

    async def _share(self, storm: Storm) -> None:
        hosts = len(storm.by_host)
        title = f"Alert storm: {storm.firing + storm.resolved} alerts on {hosts} host{'s' if hosts != 1 else ''}"
        heat = storm_heat(title, storm.by_minute)
        png = (
            await self._renderer.render(functools.partial(render_storm_heat, theme=self._theme), heat) if heat else None
        )
        if png is None:
            return
        alt = f"{title}: alerts per minute by host, as a heat map"
        file_id = await self._files.upload(png, f"storm-{storm.id}.png", alt)
        upload = Upload(stage="sharing", file_id=file_id, at=self._clock.now().timestamp())
        await self._state.update_storm(storm.id, lambda s: setattr(s, "picture", upload))
        await self._files.share(file_id, title, storm.summary_channel, storm.summary_ts)
