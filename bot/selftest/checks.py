"""Step 1 of the self-test: each configured dependency answers as the bot needs it to. Nothing is sent to people:
Slack is asked who the token is and whether it is in its channel, SMTP goes as far as AUTH and quits."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.alertmanager import AlertmanagerClient, AlertmanagerError, AmStatus
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import EmailReceiver, LokiConfig, PagerDutyReceiver, PrometheusConfig, Secret, SlackReceiver
from bot.datafile import bundled_rules
from bot.enrich.queryapi import bearer_auth, body_text
from bot.failure import what_failed
from bot.render.graph_worker import graphs_installed
from bot.selftest.steps import StepFailed, duration
from bot.sinks.email import probe_smtp

SHIPPED_RULES = bundled_rules()
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{6,}$")
_CHANNEL_TYPES = "public_channel,private_channel"
# How Prometheus shows a rule it never evaluated: the zero time.
_NEVER = "0001-01-01T00:00:00"
# Beyond one interval of the Watchdog's group: the evaluation itself, and Prometheus's answer.
_EVALUATION_MARGIN = 5.0
_RULES_POLL = 1.0
_POLLS_PER_INTERVAL = 30


async def alertmanager_status(client: AlertmanagerClient) -> AmStatus:
    try:
        return await client.status()
    except AlertmanagerError as exc:
        url = client.urls[0]
        raise StepFailed(
            exc.detail,
            "Alertmanager is down or not at this URL (set alertmanager.urls, or --alertmanager URL)",
            f"curl -s {url}/api/v2/status; systemctl status prometheus-alertmanager",
        ) from None


def describe_status(status: AmStatus) -> str:
    peers = len(status.cluster.peers)
    return f"{status.url}: version {status.version}, cluster {status.cluster.status}, {peers} peer(s)"


async def prometheus_ready(config: PrometheusConfig) -> str:
    async with _http(config.url, config.timeout, config.bearer_token_file) as http:
        await _get(http, "/-/ready", "Prometheus")
    return f"{config.url} is ready"


async def prometheus_rules(
    config: PrometheusConfig,
    watchdog: str,
    *,
    clock: Clock = SYSTEM_CLOCK,
    limit: float = 300.0,
    say: Callable[[str], None] | None = None,
    shipped: Path = SHIPPED_RULES,
) -> str:
    """The shipped alert rules are loaded and the Watchdog fires. A Watchdog rule Prometheus has not evaluated yet
    (it just started) is waited for, one interval of its group at most (and `limit` seconds, the self-test's
    timeout), before it is called not firing."""
    look = f"curl -s {config.url}/api/v1/rules | jq '.data.groups[].rules[].name'"
    async with _http(config.url, config.timeout, config.bearer_token_file) as http:
        groups = _rule_groups(await _get(http, "/api/v1/rules", "Prometheus"))
        loaded = {r.get("name") for g in groups for r in g.get("rules", [])}
        missing = sorted(shipped_alert_names(shipped) - loaded)
        if missing:
            named = f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
            raise StepFailed(
                f"{len(missing)} shipped rule(s) not loaded: {named}",
                "prometheus.yml's rule_files does not include config/rules/*.yml",
                look,
            )
        found = _watchdog_rule(groups, watchdog)
        if found is not None and not _evaluated(found[1]):
            found = await _first_evaluation(http, watchdog, found[0], clock, limit, say)
    if found is None:
        raise StepFailed(
            f"no {watchdog} rule is loaded in Prometheus",
            "prometheus.yml's rule_files does not include config/rules/monitoring-alerts.yml, or deadman.alertname "
            "names another alert",
            look,
        )
    rule = found[1]
    if rule.get("state") != "firing":
        error = f", {rule['lastError']}" if rule.get("lastError") else ""
        raise StepFailed(
            f"the {watchdog} alert is not firing in Prometheus: its rule is {rule.get('state')} (health "
            f"{rule.get('health')}{error})",
            "its expression was changed (the shipped one, vector(1), always fires) or fails to evaluate",
            f"curl -s {config.url}/api/v1/rules",
        )
    return f"{len(loaded)} rules loaded, {watchdog} firing"


def _rule_groups(answer: Any) -> list[dict[str, Any]]:
    groups = answer.get("data", {}).get("groups", []) if isinstance(answer, dict) else []
    return [g for g in groups if isinstance(g, dict)]


def _watchdog_rule(groups: list[dict[str, Any]], watchdog: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The Watchdog's alerting rule and its group (the firing one, when several rules carry the name)."""
    found = [(g, r) for g in groups for r in g.get("rules", []) if r.get("name") == watchdog]
    return next((pair for pair in found if pair[1].get("state") == "firing"), found[0] if found else None)


def _evaluated(rule: dict[str, Any]) -> bool:
    """Prometheus shows a rule it never evaluated with the zero time and health `unknown`."""
    return not str(rule.get("lastEvaluation", _NEVER)).startswith(_NEVER)


async def _first_evaluation(
    http: httpx.AsyncClient,
    watchdog: str,
    group: dict[str, Any],
    clock: Clock,
    limit: float,
    say: Callable[[str], None] | None,
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The Watchdog's rule once evaluated; StepFailed when its group's interval passed without an evaluation.
    Prometheus evaluates a group first within one interval of loading it."""
    interval = float(group.get("interval") or 0)
    every = f"its group {group.get('name')} runs every {interval:g} s"
    longest = min(interval + _EVALUATION_MARGIN, limit)
    if say is not None:
        say(f"waiting for Prometheus to evaluate the {watchdog} rule a first time ({every}): up to {duration(longest)}")
    deadline = clock.monotonic() + longest
    while clock.monotonic() < deadline:
        await clock.sleep(max(_RULES_POLL, interval / _POLLS_PER_INTERVAL))
        found = _watchdog_rule(_rule_groups(await _get(http, "/api/v1/rules", "Prometheus")), watchdog)
        if found is None or _evaluated(found[1]):
            return found
    stuck = longest > interval
    raise StepFailed(
        f"Prometheus has not evaluated the {watchdog} rule in {duration(longest)} ({every})"
        + (": rule evaluation is stuck" if stuck else ": its first evaluation is not due yet"),
        "Prometheus is overloaded (its rule evaluations take longer than their interval)"
        if stuck
        else "Prometheus started less than an interval ago: run the self-test again, or with a longer --timeout",
        f"curl -s {http.base_url}/api/v1/rules | jq '.data.groups[] | {{name, interval, lastEvaluation}}'",
    )


def shipped_alert_names(directory: Path) -> set[str]:
    names: set[str] = set()
    for path in sorted(directory.glob("*.yml")) if directory.is_dir() else []:
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            names.update(rule["alert"] for rule in group.get("rules", []) if "alert" in rule)
    return names


async def loki_ready(config: LokiConfig) -> str:
    tenant = {"X-Scope-OrgID": config.tenant_id} if config.tenant_id else {}
    async with _http(config.url, config.timeout, config.bearer_token_file, tenant) as http:
        await _get(http, "/ready", "Loki")
    return f"{config.url} is ready"


async def slack_receiver(receiver: SlackReceiver) -> str:
    client = AsyncWebClient(token=receiver.token_file.get(), base_url=receiver.api_url, timeout=int(receiver.timeout))
    try:
        who = await client.auth_test()
        channel = await _find_channel(client, receiver.channel)
    except SlackApiError as exc:
        status = exc.response.status_code
        if status >= 500:
            raise StepFailed(
                f"Slack is down or unreachable: it answered {status} at {receiver.api_url}",
                "an outage at Slack, or a proxy in between failing; not a token problem",
                f"https://slack-status.com; curl -si {receiver.api_url}auth.test",
            ) from None
        error = str(exc.response.get("error", "")) if isinstance(exc.response.data, dict) else ""
        raise StepFailed(f"Slack refused: {error or status}", *_slack_hint(error, receiver)) from None
    except Exception as exc:  # slack_sdk raises the transport's own errors (aiohttp)
        raise StepFailed(
            f"Slack is down or unreachable: cannot reach {receiver.api_url}: {what_failed(exc)}",
            "no network route to Slack, or a proxy in the way",
        ) from None
    _check_files_scope(receiver, who.headers)
    if channel is None:
        return f"token of {who.get('user')} in {who.get('team')}; channel membership not checked (no channels:read)"
    if not channel.get("is_member"):
        raise StepFailed(
            f"{who.get('user')} is not a member of {receiver.channel}",
            "the bot was never invited to the channel: messages would fail with not_in_channel",
            f"in Slack: /invite @{who.get('user')} in {receiver.channel}",
        )
    return f"token of {who.get('user')} in {who.get('team')}, member of {receiver.channel}"


def _check_files_scope(receiver: SlackReceiver, headers: Any) -> None:
    """With graphs on, the token needs files:write (Slack lists a token's scopes in x-oauth-scopes)."""
    scopes = next(
        (
            str(v[0] if isinstance(v, list) else v)
            for k, v in dict(headers or {}).items()
            if k.lower() == "x-oauth-scopes"
        ),
        None,
    )
    graphs_on = graphs_installed() if receiver.graphs is None else receiver.graphs
    if not graphs_on or scopes is None:
        return
    if "files:write" not in {scope.strip() for scope in scopes.split(",")}:
        raise StepFailed(
            "the token lacks files:write: alert graphs cannot be put in threads",
            "the Slack app was installed before graphs needed files:write",
            "add files:write to the app's bot scopes and reinstall it, or set graphs: false on this receiver",
        )


async def _find_channel(client: AsyncWebClient, channel: str) -> dict[str, Any] | None:
    """The channel's object (with `is_member`), or None when the token may not read channels."""
    try:
        if _CHANNEL_ID.match(channel):
            found: dict[str, Any] = (await client.conversations_info(channel=channel))["channel"]
            return found
        name, cursor = channel.removeprefix("#"), None
        while True:
            page = await client.conversations_list(
                types=_CHANNEL_TYPES, exclude_archived=True, limit=200, cursor=cursor
            )
            channels: list[dict[str, Any]] = page.get("channels") or []
            for item in channels:
                if item.get("name") == name:
                    return dict(item)
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                raise StepFailed(
                    f"no channel {channel} visible to the bot",
                    "a typo in the channel name, or a private channel the bot was not invited to",
                    f"in Slack: /invite the bot in {channel}; or set channel: to its ID (C...)",
                )
    except SlackApiError as exc:
        if exc.response.get("error") == "missing_scope":
            return None
        raise


def _slack_hint(error: str, receiver: SlackReceiver) -> tuple[str, str]:
    token = f"the token in {receiver.token_file.path}"
    hints = {
        "invalid_auth": (
            f"{token} is wrong or was revoked",
            "Slack app > OAuth & Permissions: the Bot User OAuth Token",
        ),
        "not_authed": (f"{token} was not sent", "check token_file"),
        "account_inactive": (f"{token} belongs to a deleted app or user", "reinstall the Slack app"),
        "token_revoked": (f"{token} was revoked", "reinstall the Slack app and update token_file"),
        "channel_not_found": (f"no channel {receiver.channel} for this token", "check receivers[].channel"),
    }
    return hints.get(error, ("Slack answered with an error", "https://api.slack.com/methods/auth.test"))


async def email_receiver(receiver: EmailReceiver) -> str:
    result = await probe_smtp(receiver)
    if not result.delivered:
        raise StepFailed(
            f"{receiver.smarthost}: {result.reason}: {result.detail}",
            "the smarthost, its TLS or the credentials are wrong (see docs/selftest.md)",
            f"openssl s_client -starttls smtp -connect {receiver.smarthost}",
        )
    steps = {"starttls": "STARTTLS", "tls": "TLS", "none": "plain text"}[receiver.security]
    auth = ", AUTH" if receiver.username else ""
    return f"{receiver.smarthost}: connected, {steps}{auth}; no mail sent"


def pagerduty_receiver(receiver: PagerDutyReceiver, page: bool) -> str:
    # The configuration already refused a key of the wrong shape; only a real event proves more.
    sent = "the self-test alert goes to PagerDuty" if page else "no event sent (--pagerduty-event sends one)"
    return f"routing key in {receiver.routing_key_file.path} has the Events API v2 shape; {sent}"


def _http(url: str, timeout: float, token: Secret | None, extra: dict[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout, auth=bearer_auth(token), headers=extra)


async def _get(http: httpx.AsyncClient, path: str, service: str) -> Any:
    url = f"{http.base_url}{path}"
    try:
        response = await http.get(path)
    except httpx.HTTPError as exc:
        raise StepFailed(
            f"cannot reach {service} at {url}: {what_failed(exc)}",
            f"{service} is down or not at this URL",
            f"curl -sv {url}",
        ) from None
    if not response.is_success:
        raise StepFailed(
            f"{service} answered {response.status_code} at {url}: {body_text(response)}",
            f"{service} is starting, unhealthy, or wants credentials",
            f"curl -sv {url}",
        )
    # Whatever else a service answers fails the step as an unexpected answer (Steps.run).
    return response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
