"""Webhook credentials: bearer and basic, from secret files, compared in constant time, never logged."""

from __future__ import annotations

import base64
import hmac
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot import auth as auth_module
from bot.auth import WebhookAuth
from bot.config import load_config
from tests.support.bot import eventually, running_bot
from tests.support.payloads import am_alert, body, webhook
from tests.support.processes import BotProcess

TOKEN = "s3cr3t-t0ken-for-the-webhook"
PASSWORD = "pa55-w0rd:with-colon"


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _auth_config(tmp_path: Path, *, bearer: bool = False, basic: bool = False) -> dict[str, Any]:
    auth: dict[str, Any] = {}
    if bearer:
        (tmp_path / "token").write_text(TOKEN + "\n")
        auth["bearer_token_file"] = "token"
    if basic:
        (tmp_path / "password").write_text(PASSWORD)
        auth["basic"] = {"username": "alertmanager", "password_file": "password"}
    return {"server": {"auth": auth}}


def _auth(tmp_path: Path, **kinds: bool) -> WebhookAuth:
    from tests.support.bot import write_config

    return WebhookAuth(load_config(write_config(tmp_path, _auth_config(tmp_path, **kinds))).server.auth)


class TestBearer:
    def test_the_configured_token_is_accepted(self, tmp_path: Path) -> None:
        auth = _auth(tmp_path, bearer=True)
        assert auth.allows(f"Bearer {TOKEN}")
        assert auth.allows(f"bearer   {TOKEN}  ")

    @pytest.mark.parametrize(
        "header",
        [None, "", "Bearer", "Bearer ", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Token {TOKEN}", TOKEN],
    )
    def test_anything_else_is_refused(self, tmp_path: Path, header: str | None) -> None:
        assert not _auth(tmp_path, bearer=True).allows(header)

    def test_basic_credentials_do_not_open_a_bearer_only_webhook(self, tmp_path: Path) -> None:
        assert not _auth(tmp_path, bearer=True).allows(_basic("alertmanager", TOKEN))


class TestBasic:
    def test_the_configured_user_and_password_are_accepted(self, tmp_path: Path) -> None:
        assert _auth(tmp_path, basic=True).allows(_basic("alertmanager", PASSWORD))

    @pytest.mark.parametrize(
        "header",
        [
            _basic("alertmanager", "wrong"),
            _basic("someone", PASSWORD),
            _basic("alertmanager", PASSWORD + "x"),
            "Basic " + base64.b64encode(b"alertmanager").decode(),
            "Basic !!!not-base64!!!",
            "Basic " + base64.b64encode(b"\xff\xfe:\xff").decode(),
            "Basic d\u00e9j\u00e0",
            f"Bearer {PASSWORD}",
        ],
    )
    def test_anything_else_is_refused(self, tmp_path: Path, header: str) -> None:
        assert not _auth(tmp_path, basic=True).allows(header)

    def test_user_and_password_are_both_compared_in_constant_time(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        compared: list[tuple[bytes, bytes]] = []
        real = hmac.compare_digest

        def spy(a: bytes, b: bytes) -> bool:
            compared.append((a, b))
            return real(a, b)

        monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
        auth = _auth(tmp_path, basic=True)
        assert not auth.allows(_basic("intruder", PASSWORD))
        # The password is still compared when the user is wrong, so timing does not tell which part failed;
        # digests of equal length are compared, so the expected length does not leak either.
        assert len(compared) == 2
        assert all(len(a) == len(b) == 32 for a, b in compared)


def test_either_kind_opens_a_webhook_configured_with_both(tmp_path: Path) -> None:
    auth = _auth(tmp_path, bearer=True, basic=True)
    assert auth.allows(f"Bearer {TOKEN}")
    assert auth.allows(_basic("alertmanager", PASSWORD))
    assert not auth.allows(None)


def test_without_credentials_configured_everything_is_allowed(tmp_path: Path) -> None:
    auth = _auth(tmp_path)
    assert not auth.enabled
    assert auth.allows(None)


def test_a_missing_secret_file_is_a_config_problem(tmp_path: Path) -> None:
    from bot.config import ConfigError
    from tests.support.bot import write_config

    path = write_config(tmp_path, {"server": {"auth": {"bearer_token_file": "absent"}}})
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert error.value.problems[0].startswith("server.auth.bearer_token_file: cannot read secret file")


async def _post(url: str, authorization: str | bytes | None) -> httpx.Response:
    headers: dict[str, Any] = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, content=body(webhook([am_alert()])), headers=headers)


@pytest.mark.parametrize(
    ("kinds", "good", "challenge"),
    [
        ({"bearer": True}, f"Bearer {TOKEN}", "Bearer"),
        ({"basic": True}, _basic("alertmanager", PASSWORD), "Basic"),
    ],
    ids=["bearer", "basic"],
)
async def test_webhook_answers_401_json_until_the_right_credentials_come(
    tmp_path: Path, kinds: dict[str, bool], good: str, challenge: str
) -> None:
    async with running_bot(tmp_path, _auth_config(tmp_path, **kinds)) as bot:
        for wrong in (None, "Bearer nope", _basic("alertmanager", "nope"), b"Bearer \xff\xfe"):
            response = await _post(bot.webhook_url, wrong)
            assert response.status_code == 401
            assert response.json()["error"] == "unauthorized"
            assert response.headers["WWW-Authenticate"].startswith(challenge)
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "unauthorized"}) == 4
        assert bot.metric("gpu_alert_bot_notifications_received_total") == 0
        accepted = await _post(bot.webhook_url, good)
        assert accepted.status_code == 200
        assert accepted.json()["status"] == "accepted"


async def test_auth_is_checked_before_the_body_is_read_or_parsed(tmp_path: Path) -> None:
    async with running_bot(tmp_path, _auth_config(tmp_path, bearer=True)) as bot, httpx.AsyncClient() as client:
        response = await client.post(bot.webhook_url, content=b"not json", headers={"Content-Type": "text/plain"})
    assert response.status_code == 401


async def test_a_configured_token_never_appears_in_the_logs_even_when_sent_wrong(tmp_path: Path) -> None:
    config = tmp_path / "bot.yaml"
    settings = _auth_config(tmp_path, bearer=True, basic=True)
    settings["store"] = {"path": str(tmp_path / "bot.db")}
    settings["logging"] = {"level": "debug"}
    config.write_text(json.dumps(settings))
    bot = BotProcess(config)
    try:
        url = f"{bot.url}/alertmanager"
        for sent in (
            f"Bearer {TOKEN}x",
            f"Token {TOKEN}",
            TOKEN,
            _basic(TOKEN, PASSWORD + "x"),
            _basic("alertmanager", TOKEN),
            f"Basic {PASSWORD}",
        ):
            assert (await _post(url, sent)).status_code == 401
        async with httpx.AsyncClient(timeout=10) as client:
            # The right token with a body that fails validation and echoes what it got.
            invalid = await client.post(
                url,
                content=json.dumps({"version": TOKEN, "groupKey": PASSWORD}).encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
            )
            assert invalid.status_code == 400
            unknown_version = body(webhook([am_alert()], version=TOKEN))
            answered = await client.post(
                url,
                content=unknown_version,
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
            )
            assert answered.status_code == 200
        # The accepted alert went all the way (worker, outbox) once the console sink printed it: its logs are in.
        await eventually(lambda: bot.stdout.snapshot())
    finally:
        bot.stop()
    log = bot.stderr.snapshot()
    assert any("rejected a webhook" in line for line in log)
    assert any("unknown payload version" in line for line in log)
    for line in log:
        json.loads(line)  # structured: every line is one JSON object
        assert TOKEN not in line
        assert PASSWORD not in line
