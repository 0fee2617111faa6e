"""`gpu-alert-bot run|approve|refuse` against the running bot's admin endpoint: the request runs through the
engine (here on the Docker fake), approvals go by the operator's login, and the endpoint answers bad or
unauthenticated calls with a JSON error."""

from __future__ import annotations

import asyncio
import getpass
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.commands.cli import main
from bot.models import short_id
from bot.storage.interface import BreakerState
from tests.fakes.docker import FakeDocker
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.payloads import am_alert, body, webhook

TOKEN = "admin-token-for-tests"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def docker(tmp_path: Path) -> AsyncIterator[FakeDocker]:
    async with FakeDocker(tmp_path / "docker.sock", ["dcgm-exporter"]) as fake:
        yield fake


def config(tmp_path: Path, docker: FakeDocker, **remediation: Any) -> dict[str, Any]:
    token_file = tmp_path / "admin_token"
    token_file.write_text(TOKEN + "\n")
    host = {"docker": {"url": docker.url, "containers": {"restart-dcgm-exporter": "dcgm-exporter"}}}
    return {"remediation": {"hosts": {"gpu01": host}, "admin_token_file": str(token_file), **remediation}}


async def alert_id(bot: RunningBot) -> str:
    alert = am_alert("DCGMExporterNoGPUs", instance="gpu01:9400")
    async with httpx.AsyncClient() as http:
        (await http.post(bot.webhook_url, content=body(webhook([alert])), headers=JSON)).raise_for_status()
    [stored] = await eventually(lambda: bot.runtime.store.list_alerts("firing"))
    return short_id(stored.key)


async def cli(bot: RunningBot, tmp_path: Path, *args: str) -> int:
    """The command in a thread of its own, as a separate process would be: the bot keeps serving meanwhile."""
    path = tmp_path / "bot.yaml"
    return await asyncio.to_thread(main, [*args, "--config", str(path), "--url", bot.url])


async def test_run_restarts_through_the_bot_and_a_dry_run_only_says_what_it_would_do(
    tmp_path: Path, docker: FakeDocker, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_bot(tmp_path, config(tmp_path, docker)) as bot:
        alert = await alert_id(bot)
        assert await cli(bot, tmp_path, "run", "restart-dcgm-exporter", "--alert", alert, "--dry-run") == 0
        assert "would run: docker restart -t 10 dcgm-exporter" in capsys.readouterr().out
        assert docker.restarts("dcgm-exporter") == 0

        assert await cli(bot, tmp_path, "run", "restart-dcgm-exporter", "--alert", alert) == 0
        assert capsys.readouterr().out == "run #2 restart-dcgm-exporter on gpu01: approved\n"
        await eventually(lambda: docker.restarts("dcgm-exporter") == 1)
        entries = await bot.runtime.store.audit_log(datetime(2000, 1, 1, tzinfo=UTC))
        assert (f"cli:{getpass.getuser()}", "run restart-dcgm-exporter", "dry-run") in [
            (e.actor, e.action, e.outcome) for e in entries
        ]


async def test_an_action_needing_approval_is_approved_by_an_operator_listed_as_approver(
    tmp_path: Path, docker: FakeDocker, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = config(
        tmp_path,
        docker,
        approvers=[f"cli:{getpass.getuser()}"],
        actions={"restart-dcgm-exporter": {"approval": True}},
    )
    async with running_bot(tmp_path, settings) as bot:
        alert = await alert_id(bot)
        assert await cli(bot, tmp_path, "run", "restart-dcgm-exporter", "--alert", alert) == 0
        assert "requested" in capsys.readouterr().out
        assert docker.restarts("dcgm-exporter") == 0
        assert await cli(bot, tmp_path, "approve", "1") == 0
        assert capsys.readouterr().out == "run #1 restart-dcgm-exporter on gpu01: approved\n"
        await eventually(lambda: docker.restarts("dcgm-exporter") == 1)
        assert await cli(bot, tmp_path, "refuse", "1") == 1
        assert "not waiting for approval" in capsys.readouterr().err


async def test_refusals_exit_1_with_the_reason(
    tmp_path: Path, docker: FakeDocker, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_bot(tmp_path, config(tmp_path, docker)) as bot:
        await alert_id(bot)
        assert await cli(bot, tmp_path, "run", "restart-dcgm-exporter", "--alert", "nosuch1") == 1
        assert capsys.readouterr().err == "run refused (409): no alert 'nosuch1'\n"
        assert await cli(bot, tmp_path, "approve", "42") == 1
        assert capsys.readouterr().err == "approve refused (409): no run #42\n"


async def test_an_unknown_action_is_refused_with_the_valid_ones(
    tmp_path: Path, docker: FakeDocker, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_bot(tmp_path, config(tmp_path, docker)) as bot:
        alert = await alert_id(bot)
        for action in ("restart-dcgm", "ack"):  # a typo, and an action of the conversation, not of remediation
            assert await cli(bot, tmp_path, "run", action, "--alert", alert) == 1
            assert capsys.readouterr().err == (
                f"run refused (409): {action!r} is not a remediation action: collect-diagnostics, run-dcgm-diag, "
                "restart-dcgm-exporter, restart-inference-server, lower-power-limit, cordon-node, uncordon-node, "
                "drain-node, resume-node, reset-gpu, reboot-node\n"
            )


async def test_the_admin_endpoint_wants_its_token_and_a_valid_body(tmp_path: Path, docker: FakeDocker) -> None:
    async with running_bot(tmp_path, config(tmp_path, docker)) as bot, httpx.AsyncClient() as http:
        url = f"{bot.url}/admin/remediation/run"
        good = {"action": "restart-dcgm-exporter", "alert": "x", "actor": "alice"}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            answer = await http.post(url, json=good, headers=headers)
            assert (answer.status_code, answer.json()["error"]) == (401, "unauthorized")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for bad in (b"not json", b'{"action": "x"}', b'{"action": "x", "alert": "y", "actor": "a b;reboot"}'):
            answer = await http.post(url, content=bad, headers=auth)
            assert (answer.status_code, answer.json()["error"]) == (400, "bad_request")
        assert docker.restarts("dcgm-exporter") == 0


async def test_without_an_admin_token_the_endpoint_is_off(tmp_path: Path, docker: FakeDocker) -> None:
    settings = config(tmp_path, docker)
    del settings["remediation"]["admin_token_file"]
    async with running_bot(tmp_path, settings) as bot, httpx.AsyncClient() as http:
        answer = await http.post(f"{bot.url}/admin/remediation/run", json={})
        assert answer.status_code == 404 and "admin_token_file" in answer.json()["message"]


async def test_reset_breaker_closes_the_circuit_breaker_for_an_admin_only(
    tmp_path: Path, docker: FakeDocker, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_bot(tmp_path, config(tmp_path, docker)) as bot:
        store = bot.runtime.store
        await store.set_breaker(BreakerState(datetime.now(UTC), "4 hosts needed an automatic action"))
        assert await cli(bot, tmp_path, "reset-breaker") == 1
        assert "is not a remediation admin" in capsys.readouterr().err
        assert await store.get_breaker() is not None

    admin = config(tmp_path, docker, admins=[f"cli:{getpass.getuser()}"])
    async with running_bot(tmp_path, admin) as bot:
        assert await cli(bot, tmp_path, "reset-breaker") == 0
        assert capsys.readouterr().out == "circuit breaker closed\n"
        assert await bot.runtime.store.get_breaker() is None
