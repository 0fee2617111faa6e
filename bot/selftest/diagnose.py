"""Why the self-test's alert does not reach the bot, told as soon as the figures say it rather than at the timeout.

While the self-test waits, it reads Alertmanager's `/metrics` (its failed webhook requests) and the bot's (the
webhooks it refused, by reason) and compares them with what they were when the alert was fired. A refusal by the
bot names its reason (a wrong token: 401; a wrong path: 404, and the path the bot serves); Alertmanager failing
while the bot refused nothing means nothing reaches the bot. Another webhook receiver of Alertmanager failing at
the same moment can be taken for the bot's; on day one there is none.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bot.ingest import WEBHOOK_PATH
from bot.metrics import WEBHOOK_REFUSALS
from bot.selftest.steps import StepFailed

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Per attempt (it retries a refused connection) and per notification given up.
AM_FAILURES = ("alertmanager_notification_requests_failed_total", "alertmanager_notifications_failed_total")
BOT_REFUSALS = "gpu_alert_bot_errors_total"


async def read_samples(http: httpx.AsyncClient, url: str) -> Samples | None:
    """Every sample of a Prometheus exposition, or None when it cannot be read."""
    try:
        response = await http.get(url)
        response.raise_for_status()
        families = list(text_string_to_metric_families(response.text))
    except (httpx.HTTPError, ValueError):
        return None
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }


def total(samples: Samples | None, name: str, **labels: str) -> float:
    """The sum of a counter's samples that carry these labels (others, such as 0.27's `reason`, summed over)."""
    if samples is None:
        return 0.0
    wanted = set(labels.items())
    return sum(value for (sample, pairs), value in samples.items() if sample == name and wanted <= set(pairs))


class PathFigures:
    """Alertmanager's and the bot's figures since `mark`."""

    def __init__(self, http: httpx.AsyncClient, am_url: str, bot_url: str | None) -> None:
        self._http = http
        self._am_metrics = f"{am_url.rstrip('/')}/metrics"
        self._bot_metrics = f"{bot_url.rstrip('/')}/metrics" if bot_url else None
        self._am_before: Samples | None = None
        self._bot_before: Samples | None = None

    async def mark(self) -> None:
        self._am_before, self._bot_before = await self._read()

    async def cause(self) -> StepFailed | None:
        """What stops the alert, once the figures tell it; None while they do not."""
        am, bot = await self._read()
        refused = {
            kind: total(bot, BOT_REFUSALS, kind=kind) - total(self._bot_before, BOT_REFUSALS, kind=kind)
            for kind in WEBHOOK_REFUSALS
        }
        if refused["unauthorized"] > 0:
            return StepFailed(
                f"Alertmanager's token is refused by the bot (401): {refused['unauthorized']:g} webhook(s) refused",
                "the credentials of the receiver's webhook_configs http_config differ from the bot's server.auth "
                "(its bearer_token_file)",
                f"curl -s {self._bot_metrics} | grep 'errors_total{{kind=\"unauthorized\"'; the bot's log",
            )
        if refused["not_found"] > 0:
            return StepFailed(
                f"Alertmanager posts to a path the bot does not serve: the bot's webhook is at {WEBHOOK_PATH}",
                f"the receiver's webhook_configs url does not end in {WEBHOOK_PATH}",
                "amtool config show | grep -n 'url:'; the bot's log says which path was posted to",
            )
        other = {kind: count for kind, count in refused.items() if count > 0}
        if other:
            kinds = ", ".join(f"{kind} ({count:g})" for kind, count in sorted(other.items()))
            return StepFailed(
                f"the bot refuses Alertmanager's webhooks: {kinds}",
                "see the bot's log for each refusal's detail",
                f"curl -s {self._bot_metrics} | grep errors_total",
            )
        failed = sum(
            total(am, name, integration="webhook") - total(self._am_before, name, integration="webhook")
            for name in AM_FAILURES
        )
        if failed > 0 and bot is not None:
            return StepFailed(
                f"nothing reaches the bot: check the webhook URL (Alertmanager counted {failed:g} failed webhook "
                "request(s), the bot refused none)",
                "the receiver's webhook_configs url names another host or port than the bot's, or a firewall or "
                "proxy is in the way",
                f"amtool config show | grep -n 'url:'; curl -s {self._am_metrics} | grep 'webhook'",
            )
        return None

    async def _read(self) -> tuple[Samples | None, Samples | None]:
        am = await read_samples(self._http, self._am_metrics)
        # Read after Alertmanager's: a refusal the bot counts comes before the failure Alertmanager counts.
        bot = await read_samples(self._http, self._bot_metrics) if self._bot_metrics else None
        return am, bot
