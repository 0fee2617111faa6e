"""Steps 2 and 3 of the self-test, Alertmanager's side: it routes the synthetic alert to this bot, which sees it
fired and resolved (bot/selftest/watch.py follows it in the bot). amtool does this when installed
(the tool operators know, so its command lines are the hints); Alertmanager's API when it is not."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import yaml

from bot.alertmanager import AlertmanagerClient, AlertmanagerError, PostableAlert
from bot.ingest import WEBHOOK_PATH
from bot.selftest.steps import StepFailed
from bot.selftest_label import ALERTNAME, LABEL, PAGE_LABEL, UNTIL_ANNOTATION
from bot.storage.interface import DeliveryRecord

_AMTOOL_TIMEOUT = 30.0


@dataclass(frozen=True)
class SyntheticAlert:
    run_id: str
    started: datetime
    page: bool
    # When the run is over: the bot tells nobody of this alert if it first hears of it later.
    until: datetime

    @property
    def labels(self) -> dict[str, str]:
        labels = {"alertname": ALERTNAME, LABEL: self.run_id, "severity": "info"}
        if self.page:
            labels[PAGE_LABEL] = "true"
        return labels

    @property
    def summary(self) -> str:
        return f"gpu-alert-bot self-test {self.run_id}: proves Alertmanager -> bot -> receivers; no action needed"

    @property
    def annotations(self) -> dict[str, str]:
        return {"summary": self.summary, UNTIL_ANNOTATION: self.until.isoformat()}

    def label_args(self) -> list[str]:
        return [f"{name}={value}" for name, value in self.labels.items()]


def bot_receivers(config_text: str, bot_url: str | None) -> set[str]:
    """Alertmanager receivers with a webhook to this bot (its path, and its address when --bot names it), from
    the configuration Alertmanager reports. A `url_file` cannot be seen: name the receiver with --receiver."""
    try:
        config = yaml.safe_load(config_text)
    except yaml.YAMLError:
        return set()
    found = set()
    for receiver in _dicts(config.get("receivers") if isinstance(config, dict) else None):
        for webhook in _dicts(receiver.get("webhook_configs")):
            url = str(webhook.get("url", ""))
            if _posts_to_bot(url, bot_url):
                found.add(str(receiver.get("name")))
    return found


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def misdirected(config_text: str, bot_url: str) -> dict[str, str]:
    """Receivers whose webhook posts to the bot's port on a path it does not serve (`http://host:9095/`), with
    that URL: why no receiver posts to this bot, when none does."""
    try:
        config = yaml.safe_load(config_text)
        port = urlsplit(bot_url).port
    except (yaml.YAMLError, ValueError):
        return {}
    found = {}
    for receiver in _dicts(config.get("receivers") if isinstance(config, dict) else None):
        for webhook in _dicts(receiver.get("webhook_configs")):
            url = str(webhook.get("url", ""))
            try:
                target = urlsplit(url)
                if target.port == port and target.path.rstrip("/") != WEBHOOK_PATH:
                    found[str(receiver.get("name"))] = url
            except ValueError:  # not a URL at all
                continue
    return found


def _posts_to_bot(url: str, bot_url: str | None) -> bool:
    try:
        target = urlsplit(url)
        return target.path.rstrip("/") == WEBHOOK_PATH and (
            bot_url is None or target.netloc == urlsplit(bot_url).netloc
        )
    except ValueError:  # not a URL at all
        return False


def routes_test_command(am_url: str, alert: SyntheticAlert) -> str:
    return f"amtool config routes test --alertmanager.url={am_url} {' '.join(alert.label_args())}"


def check_routes(
    routed: set[str], expected: set[str], am_url: str, alert: SyntheticAlert, wrong_path: dict[str, str]
) -> str:
    """`wrong_path`: the receivers posting to the bot's port on a path it does not serve (`misdirected`)."""
    if routed & expected:
        return f"alertname={ALERTNAME} goes to {', '.join(sorted(routed))}"
    if not expected and routed & set(wrong_path):
        name = sorted(routed & set(wrong_path))[0]
        url = wrong_path[name]
        right = urlsplit(url)._replace(path=WEBHOOK_PATH, query="", fragment="").geturl()
        raise StepFailed(
            f"alertname={ALERTNAME} goes to {name}, which posts to {url}: the bot serves no such path, its "
            f"webhook is at {WEBHOOK_PATH}",
            f"the url of {name}'s webhook_configs lacks the bot's path: Alertmanager's webhooks would be refused (404)",
            f"set url: {right} in Alertmanager's configuration; amtool config show | grep -n 'url:'",
        )
    wanted = (
        ", ".join(sorted(expected))
        or "the bot (no receiver's webhook url ends in /alertmanager: name it with --receiver)"
    )
    raise StepFailed(
        f"alertname={ALERTNAME} goes to {', '.join(sorted(routed)) or 'nothing'}, not to {wanted}",
        "Alertmanager's route sends it to a receiver that does not post to this bot (a route above catches it, "
        "or the bot's receiver is missing)",
        routes_test_command(am_url, alert),
    )


async def amtool_routes(amtool: str, am_url: str, alert: SyntheticAlert) -> set[str]:
    output = await run_amtool(amtool, am_url, ["config", "routes", "test", *alert.label_args()])
    return {name.strip() for name in output.replace(",", " ").split() if name.strip()}


async def api_routes(client: AlertmanagerClient, alert: SyntheticAlert) -> set[str]:
    """The receivers Alertmanager gave the (already posted) alert."""
    found = await client.alerts([f'{LABEL}="{alert.run_id}"'])
    return {r.name for a in found for r in a.receivers}


async def fire(
    amtool: str | None, client: AlertmanagerClient, am_url: str, alert: SyntheticAlert, end: datetime | None
) -> str:
    """Post the alert (firing, or resolved when `end` is given) to the replica at `am_url` with amtool, or with
    the API to the first replica that answers (the same one, tried in the same order). Replicas do not share
    alerts: the one that got it notifies."""
    if amtool is not None:
        args = ["alert", "add", *alert.label_args()]
        args += [f"--annotation={name}={value}" for name, value in alert.annotations.items()]
        args.append(f"--start={alert.started.isoformat()}")
        if end is not None:
            args.append(f"--end={end.isoformat()}")
        await run_amtool(amtool, am_url, args)
        return f"amtool alert add {' '.join(alert.label_args())}{' --end=now' if end else ''}"
    posted = PostableAlert(labels=alert.labels, annotations=alert.annotations, starts_at=alert.started, ends_at=end)
    try:
        await client.post_alerts([posted])
    except AlertmanagerError as exc:
        raise StepFailed(exc.detail, "Alertmanager refused the alert", f"curl -s {am_url}/api/v2/status") from None
    return f"POST /api/v2/alerts {' '.join(alert.label_args())}{' (ended)' if end else ''}"


def find_amtool() -> str | None:
    return shutil.which("amtool")


async def run_amtool(amtool: str, am_url: str, args: Sequence[str]) -> str:
    command = [amtool, f"--alertmanager.url={am_url}", *args]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(_AMTOOL_TIMEOUT):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise StepFailed(f"amtool did not finish within {_AMTOOL_TIMEOUT:g} s", "Alertmanager hangs") from None
    if process.returncode != 0:
        raise StepFailed(
            f"amtool failed: {err.decode(errors='replace').strip() or out.decode(errors='replace').strip()}",
            "amtool could not talk to Alertmanager or refused the arguments",
            " ".join([amtool, f"--alertmanager.url={am_url}", *args[:3]]),
        )
    return out.decode(errors="replace")


def delivered(record: DeliveryRecord, receiver: str) -> str:
    if record.state != "delivered":
        raise StepFailed(
            f"{receiver} failed: {record.error}",
            "the receiver refused the message for good; its check above says more",
            "journalctl -u gpu-alert-bot | grep 'delivery failed'",
        )
    return f"delivered after {record.attempts} attempt(s)"
