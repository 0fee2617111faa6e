"""The self-test's edges against a real Alertmanager and amtool, the bot in the test's loop on a real SQLite file:
an early end resolves what it fired, and the bot tells nobody of a self-test alert whose run is over."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.config import BotConfig
from bot.selftest.command import Options, selftest_command
from bot.selftest_label import UNTIL_ANNOTATION
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.payloads import am_alert, webhook
from tests.support.processes import Alertmanager, free_port, webhook_alertmanager_config
from tests.test_selftest import watchdog_firing

CONSOLE = {"receivers": [{"name": "console", "type": "console"}], "routing": {"default": ["console"]}}


def firing_self_tests(am: Alertmanager) -> list[dict[str, Any]]:
    """GPUSelfTest alerts still active in Alertmanager (a resolved one is no longer listed)."""
    answer = httpx.get(f"{am.url}/api/v2/alerts", params={"filter": 'alertname="GPUSelfTest"'})
    answer.raise_for_status()
    alerts: list[dict[str, Any]] = answer.json()
    return alerts


def nowhere(tmp_path: Path) -> Alertmanager:
    """Alertmanager posting the bot's webhook to a port nobody listens on: the alert never reaches the bot."""
    return Alertmanager(tmp_path / "am", webhook_alertmanager_config(f"http://127.0.0.1:{free_port()}"))


async def run(config: BotConfig, am: Alertmanager, timeout: float) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    code = await selftest_command(config, Options(alertmanager=am.url, timeout=timeout, output="json"), out)
    return code, json.loads(out.getvalue())["steps"]


async def test_a_run_that_times_out_resolves_the_alert_it_fired(tmp_path: Path) -> None:
    async with running_bot(tmp_path, CONSOLE) as bot:
        am = nowhere(tmp_path)
        try:
            code, steps = await run(bot.config, am, timeout=2)
            assert code == 1
            assert [(s["step"], s["outcome"]) for s in steps][-3:] == [
                ("fire", "pass"),
                ("bot received", "FAIL"),
                ("resolve", "pass"),
            ]
            assert steps[-1]["detail"].endswith("the alert fired above does not stay firing after this run")
            assert firing_self_tests(am) == []
        finally:
            am.stop()


async def test_ctrl_c_while_waiting_resolves_the_alert_it_fired(tmp_path: Path) -> None:
    async with running_bot(tmp_path, CONSOLE) as bot:
        am = nowhere(tmp_path)
        out = io.StringIO()
        try:
            options = Options(alertmanager=am.url, timeout=3600)
            task = asyncio.create_task(selftest_command(bot.config, options, out))
            await eventually(lambda: "[pass] fire: " in out.getvalue(), timeout=30)
            assert firing_self_tests(am) != []
            task.cancel()  # what asyncio.run does to its task on Ctrl-C
            with pytest.raises(asyncio.CancelledError):
                await task
            assert "[pass] resolve: amtool alert add" in out.getvalue()
            assert firing_self_tests(am) == []
        finally:
            am.stop()


def self_test_alert(run_id: str, until: datetime | None, status: str = "firing") -> dict[str, Any]:
    """`until` None: as resolved by hand (`amtool alert add ... --end=now`), without the run's deadline."""
    annotations = {"summary": "gpu-alert-bot self-test"}
    if until is not None:
        annotations[UNTIL_ANNOTATION] = until.isoformat()
    return am_alert("GPUSelfTest", status=status, annotations=annotations, selftest=run_id, severity="info")


async def post(bot: RunningBot, alert: dict[str, Any]) -> None:
    async with httpx.AsyncClient() as client:
        answer = await client.post(bot.webhook_url, json=webhook([alert], group_key='{}:{alertname="GPUSelfTest"}'))
    assert answer.status_code == 200


async def test_the_bot_tells_nobody_of_a_self_test_alert_first_heard_after_its_run(tmp_path: Path) -> None:
    async with running_bot(tmp_path, CONSOLE) as bot:
        now = datetime.now(UTC)
        await post(bot, self_test_alert("over", now - timedelta(hours=1)))
        await post(bot, self_test_alert("over", now - timedelta(hours=1), "resolved"))
        # Resolved by hand after its run: its firing reached nobody, so its resolve does not either.
        await post(bot, self_test_alert("by-hand", now - timedelta(hours=1)))
        await post(bot, self_test_alert("by-hand", None, "resolved"))
        await post(bot, self_test_alert("running", now + timedelta(minutes=5)))

        def told() -> list[str]:
            return [e["labels"]["selftest"] for e in bot.console_events() if e["alertname"] == "GPUSelfTest"]

        assert await eventually(told) == ["running"]

        async def handled() -> bool:
            stats = await bot.runtime.store.stats()
            return stats.notifications_pending + stats.events_pending + stats.deliveries_pending == 0

        await eventually(handled)
        assert told() == ["running"]
        # A run still going is told to the end: its resolve too.
        await post(bot, self_test_alert("running", now + timedelta(minutes=5), "resolved"))
        await eventually(lambda: told() == ["running", "running"])


def listening(tmp_path: Path, port: int, token: str | None = None) -> dict[str, Any]:
    """CONSOLE, with the address the bot listens on (where the self-test reads its figures) and its token."""
    server: dict[str, Any] = {"listen": f"127.0.0.1:{port}"}
    if token is not None:
        (tmp_path / "webhook_token").write_text(token + "\n")
        server["auth"] = {"bearer_token_file": str(tmp_path / "webhook_token")}
    return {**CONSOLE, "server": server}


async def bot_received(config: BotConfig, am: Alertmanager, **options: Any) -> dict[str, Any]:
    """The `bot received` step of a run whose timeout is far longer than the test may last."""
    out = io.StringIO()
    code = await selftest_command(config, Options(alertmanager=am.url, timeout=600, output="json", **options), out)
    assert code == 1
    steps = json.loads(out.getvalue())["steps"]
    [received] = [s for s in steps if s["step"] == "bot received"]
    assert received["outcome"] == "FAIL"
    assert steps[-1]["step"] == "resolve" and steps[-1]["outcome"] == "pass"
    return received


async def test_a_token_the_bot_refuses_is_named_as_soon_as_the_bot_counts_the_refusal(tmp_path: Path) -> None:
    port = free_port()
    async with running_bot(tmp_path, listening(tmp_path, port, "right-token"), port=port) as bot:
        am = Alertmanager(tmp_path / "am", webhook_alertmanager_config(bot.url, bearer_token="wrong-token"))
        try:
            received = await bot_received(bot.config, am)
        finally:
            am.stop()
        assert received["detail"].startswith("Alertmanager's token is refused by the bot (401): ")
        assert "server.auth" in received["cause"]


async def test_a_webhook_url_that_reaches_nothing_is_named_as_soon_as_alertmanager_counts_a_failure(
    tmp_path: Path,
) -> None:
    port = free_port()
    async with running_bot(tmp_path, listening(tmp_path, port), port=port) as bot:
        am = nowhere(tmp_path)
        try:
            received = await bot_received(bot.config, am)
        finally:
            am.stop()
        assert received["detail"].startswith("nothing reaches the bot: check the webhook URL (Alertmanager counted ")
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "unauthorized"}) == 0


async def test_a_wrong_webhook_path_says_which_path_the_bot_serves(tmp_path: Path) -> None:
    port = free_port()
    async with running_bot(tmp_path, listening(tmp_path, port), port=port) as bot:
        am = Alertmanager(tmp_path / "am", webhook_alertmanager_config(f"{bot.url}/hooks"))
        try:
            received = await bot_received(bot.config, am, receiver="bot")
        finally:
            am.stop()
        assert received["detail"] == (
            "Alertmanager posts to a path the bot does not serve: the bot's webhook is at /alertmanager"
        )


def with_slack(tmp_path: Path, slack: FakeSlack) -> dict[str, Any]:
    token_file = tmp_path / "slack_token"
    token_file.write_text(DEFAULT_TOKEN + "\n")
    slack_receiver = {
        "name": "slack-gpu",
        "type": "slack",
        "channel": "#gpu-alerts",
        "token_file": str(token_file),
        "api_url": slack.api_url,
    }
    return {"receivers": [*CONSOLE["receivers"], slack_receiver], "routing": {"default": ["console", "slack-gpu"]}}


async def test_slack_answering_503_is_down_or_unreachable_not_an_auth_problem(
    tmp_path: Path, alertmanager_factory: Any, slack: FakeSlack
) -> None:
    slack.fail_next("auth.test", status=503, times=3)
    async with running_bot(tmp_path, with_slack(tmp_path, slack)) as bot:
        am = alertmanager_factory(bot.url)
        _, steps = await run(bot.config, am, timeout=30)
    [check] = [s for s in steps if s["step"] == "slack slack-gpu"]
    assert check["outcome"] == "FAIL"
    assert check["detail"] == f"Slack is down or unreachable: it answered 503 at {slack.api_url}"
    assert "not a token problem" in check["cause"]


@pytest.mark.parametrize("failure", ["invalid_auth", "503"])
async def test_a_receiver_failing_its_check_leaves_the_others_proven(
    tmp_path: Path, alertmanager_factory: Any, slack: FakeSlack, failure: str
) -> None:
    if failure == "503":
        slack.fail_next("auth.test", status=503, times=3)
        slack_config = with_slack(tmp_path, slack)
    else:
        slack_config = with_slack(tmp_path, slack)
        Path(slack_config["receivers"][1]["token_file"]).write_text("xoxb-revoked\n")
    async with running_bot(tmp_path, slack_config) as bot:
        am = watchdog_firing(alertmanager_factory(bot.url))
        code, steps = await run(bot.config, am, timeout=30)
    assert code == 1
    assert [s["step"] for s in steps if s["outcome"] == "FAIL"] == ["slack slack-gpu"]
    assert {
        s["step"]: s["outcome"] for s in steps if s["step"] not in ("alertmanager", "bot", "bot config", "bot store")
    } == {
        "slack slack-gpu": "FAIL",
        "routing": "pass",
        "fire": "pass",
        "bot received": "pass",
        "deliver console": "pass",
        "deliver slack-gpu": "skip",
        "resolve": "pass",
        "bot received resolve": "pass",
        "deliver resolve console": "pass",
        "deliver resolve slack-gpu": "skip",
        "dead man's switch": "pass",
    }
    [unproven] = [s for s in steps if s["step"] == "deliver slack-gpu"]
    assert unproven["detail"] == "not proven: the check of slack-gpu failed above"


async def test_a_webhook_url_without_the_bot_path_is_named_at_the_routing_step(tmp_path: Path) -> None:
    async with running_bot(tmp_path, CONSOLE) as bot:
        config = webhook_alertmanager_config(bot.url)
        config["receivers"][0]["webhook_configs"][0]["url"] = f"{bot.url}/"
        am = Alertmanager(tmp_path / "am", config)
        try:
            code, steps = await run(bot.config, am, timeout=600)
        finally:
            am.stop()
    assert code == 1
    [routing] = [s for s in steps if s["step"] == "routing"]
    assert (routing["outcome"], routing["detail"]) == (
        "FAIL",
        f"alertname=GPUSelfTest goes to bot, which posts to {bot.url}/: the bot serves no such path, its webhook "
        "is at /alertmanager",
    )
    assert routing["look"].startswith(f"set url: {bot.url}/alertmanager in Alertmanager's configuration")
    assert "fire" not in [s["step"] for s in steps]  # nothing was sent


async def test_a_bot_that_is_not_running_is_said_at_once(tmp_path: Path) -> None:
    port = free_port()
    async with running_bot(tmp_path, listening(tmp_path, port)) as bot:
        config = bot.config  # it ran, so its store is there to read: only the bot itself is gone
    am = nowhere(tmp_path)
    try:
        out = io.StringIO()
        options = Options(alertmanager=am.url, timeout=3600, output="json")
        assert await selftest_command(config, options, out) == 1
    finally:
        am.stop()
    steps = json.loads(out.getvalue())["steps"]
    [probe] = [s for s in steps if s["step"] == "bot"]
    assert probe["outcome"] == "FAIL"
    refused = "connection refused (nothing listens there)"
    assert probe["detail"] == f"nothing answers at http://127.0.0.1:{port} (server.listen): {refused}"
    assert "the bot is not running" in probe["cause"]
    # The alert path never started: nothing waited for the hour-long timeout, nor blamed Alertmanager.
    assert {s["step"]: s["outcome"] for s in steps if s["step"] in ("fire", "bot received")} == {
        "fire": "skip",
        "bot received": "skip",
    }


async def test_ctrl_c_ends_the_command_with_its_table_and_the_resolve_not_a_traceback(tmp_path: Path) -> None:
    port = free_port()
    async with running_bot(tmp_path, listening(tmp_path, port)) as bot:
        am = nowhere(tmp_path)
        command = [sys.executable, "-m", "bot", "selftest", "--config", str(tmp_path / "bot.yaml")]
        command += ["--alertmanager", am.url, "--timeout", "1h"]
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            assert process.stdout is not None
            said: list[str] = []
            while not said or not said[-1].startswith("[pass] fire: "):
                line = await asyncio.wait_for(process.stdout.readline(), 60)
                assert line, said  # the command ended before it fired
                said.append(line.decode().rstrip("\n"))
            assert firing_self_tests(am) != []
            process.send_signal(signal.SIGINT)
            rest, errors = await asyncio.wait_for(process.communicate(), 60)
            assert firing_self_tests(am) == []
        finally:
            if process.returncode is None:
                process.kill()
            am.stop()
    assert process.returncode == 130
    assert b"Traceback" not in errors and b"KeyboardInterrupt" not in errors
    output = rest.decode()
    assert "[FAIL] bot received: interrupted (Ctrl-C)" in output
    assert "[pass] resolve: amtool alert add alertname=GPUSelfTest" in output
    assert "self-test FAILED: 1 step(s) failed of " in output
    assert bot.console_events() == []
