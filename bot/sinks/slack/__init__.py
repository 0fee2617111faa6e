"""Slack sink: one conversation per alert, or per incident, on slack_sdk's AsyncWebClient, paced per channel.

- `sink`: SlackSink, the per-alert conversation (first post, repeats in the thread, resolve/ack in place,
  related alerts threaded under their root), and SlackRendering, what a new alert's post looks like;
- `incident`: an incident's card, updated in place, and its compact thread (a line per host, the list of its
  alerts as one file, its heat map, its recovery);
- `pictures`: an alert's graph in its thread after the message (Slack's three-step upload, exactly once);
- `channel`: the Slack Web API calls, their failures classified for the outbox, and the exactly-once lookup of
  a post in doubt by its nonce;
- `pacing`: a token bucket per channel and slack_sdk's 429 handler, bounded;
- `state`: what the sink remembers in the store's sink state (JSON), so it all survives restarts.
"""

from bot.sinks.slack.pacing import SlackRateLimits
from bot.sinks.slack.sink import SlackRendering, SlackSink

__all__ = ["SlackRateLimits", "SlackRendering", "SlackSink"]
