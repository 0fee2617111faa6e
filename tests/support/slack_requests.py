"""Requests as Slack sends them to the bot: signed slash commands and button clicks (protocols.md section 5)."""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp
from slack_sdk.signature import SignatureVerifier

from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.slack import DEFAULT_APP_TOKEN, FakeSlack
from tests.support.slack_receiver import slack_receiver

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
RESPONDER = ("U0RESPOND1", "alice")
VIEWER = ("U0VIEWER01", "victor")
STRANGER = ("U0STRANGER", "mallory")
ROUTING_KEY = "0123456789abcdef0123456789abcdef"


def signed_headers(body: bytes, *, timestamp: str | None = None, secret: str = SIGNING_SECRET) -> dict[str, str]:
    stamp = str(int(time.time())) if timestamp is None else timestamp
    signature = SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


def command_fields(text: str, user: tuple[str, str] = RESPONDER, response_url: str = "") -> dict[str, str]:
    return {
        "token": "deprecated",
        "team_id": "T0FAKE",
        "team_domain": "fake",
        "channel_id": "C0GPUALERTS",
        "channel_name": "gpu-alerts",
        "user_id": user[0],
        "user_name": user[1],
        "command": "/gpu",
        "text": text,
        "response_url": response_url,
        "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        "api_app_id": "A0FAKE",
    }


def click_payload(
    action_id: str, value: str, ts: str, user: tuple[str, str] = RESPONDER, response_url: str = ""
) -> dict[str, Any]:
    return {
        "type": "block_actions",
        "team": {"id": "T0FAKE", "domain": "fake"},
        "user": {"id": user[0], "username": user[1], "team_id": "T0FAKE"},
        "api_app_id": "A0FAKE",
        "token": "deprecated",
        "container": {"type": "message", "message_ts": ts, "channel_id": "C0GPUALERTS", "is_ephemeral": False},
        "trigger_id": "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
        "channel": {"id": "C0GPUALERTS", "name": "gpu-alerts"},
        "response_url": response_url,
        "actions": [
            {
                "action_id": action_id,
                "block_id": "alert_actions",
                "value": value,
                "type": "button",
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


async def post_command(bot_url: str, text: str, user: tuple[str, str] = RESPONDER, response_url: str = "") -> Any:
    body = urllib.parse.urlencode(command_fields(text, user, response_url)).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{bot_url}/slack/commands", data=body, headers=signed_headers(body)) as response,
    ):
        assert response.status == 200, await response.text()
        return (await response.json())["text"]


async def post_click(bot_url: str, payload: dict[str, Any]) -> int:
    body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{bot_url}/slack/interactions", data=body, headers=signed_headers(body)) as response,
    ):
        return response.status


def interactive_config(
    tmp_path: Path,
    slack: FakeSlack,
    alertmanager_urls: list[str],
    pagerduty: FakePagerDuty | None = None,
    **interactivity: Any,
) -> dict[str, Any]:
    """A bot posting to the Slack fake (and PagerDuty), taking commands over HTTP, silencing in Alertmanager."""
    (tmp_path / "signing_secret").write_text(SIGNING_SECRET + "\n")
    (tmp_path / "app_token").write_text(DEFAULT_APP_TOKEN + "\n")
    receivers = [slack_receiver(tmp_path, slack, messages_per_second=20)]
    if pagerduty is not None:
        (tmp_path / "pd_key").write_text(ROUTING_KEY + "\n")
        receivers.append(
            {"type": "pagerduty", "name": "pd", "routing_key_file": str(tmp_path / "pd_key"), "url": pagerduty.url}
        )
    return {
        "receivers": receivers,
        "routing": {"default": [r["name"] for r in receivers]},
        "outbox": {"initial_backoff": "100ms", "max_backoff": "500ms"},
        "store": {"dedup_window": "1s"},
        "alertmanager": {"urls": alertmanager_urls, "timeout": "2s"},
        "interactivity": {
            "receiver": "slack",
            "signing_secret_file": str(tmp_path / "signing_secret"),
            "response_url_prefix": f"{slack.url}/response/",
            "roles": [
                {"name": "viewer", "users": [VIEWER[0]]},
                {"name": "responder", "users": [RESPONDER[0]]},
            ],
            **interactivity,
        },
    }
