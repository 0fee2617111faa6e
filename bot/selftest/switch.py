"""The self-test's last step: the bot's dead man's switch is armed, that is, Alertmanager's Watchdog reaches the bot.

The self-test's own alert does not arm the switch: the switch times the Watchdog, which Prometheus fires all the
time and Alertmanager sends on. A switch never armed pages nobody, so a self-test that passes leaves it armed;
when it is not, the step says what keeps the Watchdog away: nothing fires it, Alertmanager sends it elsewhere or
silences it, or it has not come yet (waited for within `--timeout`).
"""

from __future__ import annotations

from bot.alertmanager import AlertmanagerClient, AlertmanagerError
from bot.selftest.steps import StepFailed
from bot.selftest.watch import BotWatch, Wait


async def switch_armed(
    watch: BotWatch, client: AlertmanagerClient, wait: Wait, watchdog: str, bot_receivers: set[str]
) -> str:
    """`bot_receivers`: the Alertmanager receivers that post to this bot."""
    if await watch.armed():
        return f"armed: the {watchdog} reaches the bot"
    query = f"amtool alert query alertname={watchdog}"
    try:
        alerts = await client.alerts([f'alertname="{watchdog}"'])
    except AlertmanagerError as exc:
        raise StepFailed(exc.detail, "Alertmanager stopped answering during the self-test", query) from None
    if not alerts:
        raise StepFailed(
            f"Alertmanager has no {watchdog} alert: the bot's dead man's switch is never armed and pages nobody",
            "Prometheus does not load config/rules/monitoring-alerts.yml, or does not send its alerts to this "
            "Alertmanager (alerting.alertmanagers in prometheus.yml)",
            query,
        )
    routed = {receiver.name for alert in alerts for receiver in alert.receivers}
    if not routed & bot_receivers:
        raise StepFailed(
            f"Alertmanager sends {watchdog} to {', '.join(sorted(routed)) or 'nobody'}, not to the bot: its dead "
            "man's switch is never armed and pages nobody",
            f"the {watchdog}'s route names another receiver (config/alertmanager.example.yml routes it to the bot)",
            f"amtool config routes test alertname={watchdog}",
        )
    told = [alert for alert in alerts if alert.status.state != "suppressed"]
    if not told:
        silences = sorted({silence for alert in alerts for silence in alert.status.silenced_by})
        why = f"silenced ({', '.join(silences)})" if silences else "inhibited by another alert"
        raise StepFailed(
            f"the {watchdog} is {why} in Alertmanager: it never reaches the bot, whose dead man's switch is never "
            "armed and pages nobody",
            f"a silence or an inhibit rule matches the {watchdog}, which must never be silenced",
            f"amtool silence query alertname={watchdog}; amtool config show | grep -n -A8 inhibit_rules",
        )

    async def armed() -> bool | None:
        return True if await watch.armed() else None

    await wait.until(
        armed,
        f"the {watchdog} to reach the bot",
        f"Alertmanager has not sent it yet: the group_wait or repeat_interval of the {watchdog}'s route is longer "
        "than --timeout",
        f"{query}; amtool config show | grep -n -A6 {watchdog}",
    )
    return f"armed: the {watchdog} reaches the bot"
