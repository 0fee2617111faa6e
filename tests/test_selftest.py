"""`gpu-alert-bot selftest` against a real Alertmanager and amtool, the bot in the test's loop on a real SQLite
file, and the Slack fake driven by slack_sdk."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.commands.cli import main
from bot.config import BotConfig, load_config
from bot.selftest.command import Options, selftest_command
from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.bot import eventually, running_bot, write_config
from tests.support.postgres import store_section
from tests.support.processes import Alertmanager, BotProcess, free_port, webhook_alertmanager_config

ALERT_PATH = ["routing", "fire", "bot received", "resolve"]
# As config/bot.example.yaml routes it: the always-firing Watchdog arms the dead man's switch and tells nobody.
WATCHDOG_TELLS_NOBODY = {"matchers": ['alertname="Watchdog"'], "receivers": []}


def bot_config(tmp_path: Path, slack: FakeSlack, token: str = DEFAULT_TOKEN) -> dict[str, Any]:
    token_file = tmp_path / "slack_token"
    token_file.write_text(token + "\n")
    return {
        "receivers": [
            {"name": "console", "type": "console"},
            {
                "name": "slack-gpu",
                "type": "slack",
                "channel": "#gpu-alerts",
                "token_file": str(token_file),
                "api_url": slack.api_url,
            },
        ],
        "routing": {"rules": [WATCHDOG_TELLS_NOBODY], "default": ["console", "slack-gpu"]},
    }


def watchdog_firing(am: Alertmanager) -> Alertmanager:
    """Alertmanager holding the always-firing Watchdog, as Prometheus keeps it there: it arms the bot's switch."""
    am.amtool("alert", "add", "Watchdog", "severity=none", "--annotation=summary=heartbeat")
    return am


async def selftest(config: BotConfig, am_url: str, **options: Any) -> tuple[int, list[dict[str, Any]], str]:
    """Exit status, the steps (JSON output) and the progress lines."""
    out = io.StringIO()
    code = await selftest_command(config, Options(alertmanager=am_url, timeout=30, output="json", **options), out)
    return code, json.loads(out.getvalue())["steps"], out.getvalue()


def outcomes(steps: list[dict[str, Any]]) -> dict[str, str]:
    return {step["step"]: step["outcome"] for step in steps}


async def test_a_correct_setup_passes_every_step_and_prints_the_table(
    tmp_path: Path, alertmanager_factory: Any, slack: FakeSlack
) -> None:
    config = {**bot_config(tmp_path, slack), "deadman": {"check_interval": "1s"}}
    async with running_bot(tmp_path, config) as bot:
        am = watchdog_firing(alertmanager_factory(bot.url))
        out = io.StringIO()
        code = await selftest_command(bot.config, Options(alertmanager=am.url, timeout=30), out)
        text = out.getvalue()
        assert code == 0, text
        for step in (
            "alertmanager",
            "bot",
            "bot config",
            "bot store",
            "slack slack-gpu",
            "routing",
            "fire",
            "bot received",
            "deliver console",
            "deliver slack-gpu",
            "resolve",
            "bot received resolve",
            "deliver resolve console",
            "deliver resolve slack-gpu",
            "dead man's switch",
        ):
            assert any(line.startswith(f"[pass] {step}: ") for line in text.splitlines()), (step, text)
        assert "step" in text and "result" in text and "self-test passed: 0 step(s) failed of 15" in text
        assert "[pass] dead man's switch: armed: the Watchdog reaches the bot" in text
        # Marked as a test in every sink: the console line and the Slack message, updated in place on resolve.
        fired, resolved = [e for e in bot.console_events() if e["alertname"] == "GPUSelfTest"]
        assert fired["title"] == resolved["title"] == "[self-test] GPUSelfTest"
        [message] = slack.top_level()
        assert "[self-test] GPUSelfTest" in message.rendered_text()
        assert message.versions  # resolved in place

        async def readyz_says() -> str:
            async with httpx.AsyncClient() as client:
                said = str((await client.get(f"{bot.url}/readyz")).json()["checks"]["deadman"])
            return said if said != "not checked yet" and not said.startswith("never armed") else ""

        # What /readyz says once the switch checks again (every deadman.check_interval): no loop back to selftest.
        assert await eventually(readyz_says) == "armed"


async def test_alertmanager_routing_the_alert_elsewhere_fails_at_the_routing_step_with_the_amtool_hint(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with running_bot(tmp_path, bot_config(tmp_path, slack)) as bot:
        config = webhook_alertmanager_config(bot.url)
        config["route"]["routes"] = [{"receiver": "elsewhere", "matchers": ['alertname=~"GPU.*"']}]
        config["receivers"].append({"name": "elsewhere", "webhook_configs": [{"url": "http://127.0.0.1:9/hook"}]})
        am = Alertmanager(tmp_path / "am", config)
        try:
            code, steps, _ = await selftest(bot.config, am.url)
        finally:
            am.stop()
        assert code == 1
        [routing] = [s for s in steps if s["step"] == "routing"]
        assert routing["outcome"] == "FAIL"
        assert routing["detail"] == "alertname=GPUSelfTest goes to elsewhere, not to bot"
        assert routing["look"].startswith(
            f"amtool config routes test --alertmanager.url={am.url} alertname=GPUSelfTest"
        )
        assert "fire" not in outcomes(steps)  # nothing was sent
        assert [e for e in bot.console_events() if e["alertname"] == "GPUSelfTest"] == []


async def test_a_slack_token_the_workspace_refuses_fails_at_the_slack_step(
    tmp_path: Path, alertmanager_factory: Any, slack: FakeSlack
) -> None:
    async with running_bot(tmp_path, bot_config(tmp_path, slack, token="xoxb-revoked")) as bot:
        am = watchdog_firing(alertmanager_factory(bot.url))
        code, steps, _ = await selftest(bot.config, am.url)
        assert code == 1
        assert outcomes(steps)["alertmanager"] == "pass"
        [failed] = [s for s in steps if s["outcome"] == "FAIL"]
        assert failed["step"] == "slack slack-gpu"
        assert failed["detail"] == "Slack refused: invalid_auth"
        assert "is wrong or was revoked" in failed["cause"]
        # The rest of the path is still proven (tests/test_selftest_edges.py); only Slack's delivery is not.
        assert all(outcomes(steps)[step] == "pass" for step in ALERT_PATH)
        assert outcomes(steps)["deliver slack-gpu"] == "skip"


async def test_a_bot_missing_from_its_channel_fails_at_the_slack_step(
    tmp_path: Path, alertmanager_factory: Any, slack: FakeSlack
) -> None:
    slack.channels["random"] = "C0RANDOM"
    slack.member_of = {"C0RANDOM"}
    async with running_bot(tmp_path, bot_config(tmp_path, slack)) as bot:
        am = watchdog_firing(alertmanager_factory(bot.url))
        code, steps, _ = await selftest(bot.config, am.url)
        [failed] = [s for s in steps if s["outcome"] == "FAIL"]
        assert (code, failed["step"]) == (1, "slack slack-gpu")
        assert failed["detail"] == "gpu-alert-bot is not a member of #gpu-alerts"
        assert failed["look"] == "in Slack: /invite @gpu-alert-bot in #gpu-alerts"


def test_alertmanager_down_fails_at_the_first_step_without_waiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, {})
    dead = f"http://127.0.0.1:{free_port()}"
    code = main(["selftest", "--config", str(config), "--alertmanager", dead, "--json", "--timeout", "1h"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and result["passed"] is False
    first = result["steps"][0]
    assert (first["step"], first["outcome"]) == ("alertmanager", "FAIL")
    assert first["detail"].startswith(f"cannot reach {dead}")
    assert first["look"] == f"curl -s {dead}/api/v2/status; systemctl status prometheus-alertmanager"
    # The alert path never started, so nothing waited for the hour-long timeout.
    assert {s["step"]: s["outcome"] for s in result["steps"] if s["step"] in ALERT_PATH} == dict.fromkeys(
        ALERT_PATH, "skip"
    )


async def test_a_bot_on_another_host_is_followed_through_the_metrics_of_its_two_processes(
    tmp_path: Path, alertmanager_factory: Any, slack: FakeSlack
) -> None:
    """`serve` as it runs: the ingest process counts the alerts received, its worker process the deliveries."""
    worker_port = free_port()
    config = {
        **bot_config(tmp_path, slack),
        "worker": {"metrics_listen": f"127.0.0.1:{worker_port}"},
        "deadman": {"check_interval": "1s"},  # its gpu_alert_bot_deadman_armed is set at each check
    }
    bot = BotProcess(write_config(tmp_path, config), worker_metrics_port=worker_port)
    try:
        am = watchdog_firing(alertmanager_factory(bot.url))
        # The self-test's own configuration names no store it could read: only the bot's URL tells.
        (tmp_path / "elsewhere").mkdir()
        elsewhere = load_config(write_config(tmp_path / "elsewhere", config))
        code, steps, _ = await selftest(elsewhere, am.url, bot_url=bot.url)
    finally:
        bot.stop()
    assert code == 0, steps
    [watched] = [s for s in steps if s["step"] == "bot metrics"]
    assert watched["detail"] == f"reading {bot.url}/metrics and http://127.0.0.1:{worker_port}/metrics"
    assert outcomes(steps)["deliver console"] == "pass"
    assert outcomes(steps)["deliver resolve slack-gpu"] == "pass"
    assert outcomes(steps)["dead man's switch"] == "pass"


async def test_a_bot_on_postgresql_is_followed_in_its_database(
    tmp_path: Path, alertmanager_factory: Any, postgres_dsn: str
) -> None:
    config = {"store": store_section(tmp_path, postgres_dsn, "bot-a"), "deadman": {"enabled": False}}
    async with running_bot(tmp_path, config) as bot:
        am = alertmanager_factory(bot.url)
        code, steps, _ = await selftest(bot.config, am.url)
    assert code == 0, steps
    [watched] = [s for s in steps if s["step"] == "bot store"]
    assert watched["detail"] == "reading the PostgreSQL store (replica bot-a)"
    assert outcomes(steps)["deliver resolve console"] == "pass"


async def test_without_amtool_the_api_fires_the_alert_and_tells_where_alertmanager_routed_it(
    tmp_path: Path, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_bot(tmp_path, bot_config(tmp_path, slack)) as bot:
        config = webhook_alertmanager_config(bot.url)
        config["route"]["routes"] = [{"receiver": "elsewhere", "matchers": ['alertname=~"GPU.*"']}]
        config["receivers"].append({"name": "elsewhere", "webhook_configs": [{"url": "http://127.0.0.1:9/hook"}]})
        am = Alertmanager(tmp_path / "am", config)
        monkeypatch.setenv("PATH", str(tmp_path / "no-amtool-here"))
        try:
            code, steps, _ = await selftest(bot.config, am.url)
        finally:
            am.stop()
        assert code == 1
        assert [s["step"] for s in steps][-3:] == ["fire", "routing", "resolve"]
        assert steps[-3]["detail"].startswith("POST /api/v2/alerts alertname=GPUSelfTest selftest=")
        assert (steps[-2]["outcome"], steps[-2]["detail"]) == (
            "FAIL",
            "alertname=GPUSelfTest goes to elsewhere, not to bot",
        )
        # The alert it had to post to learn the route does not stay firing.
        assert (steps[-1]["outcome"], steps[-1]["detail"].split(" (ended)")[0]) == ("pass", steps[-3]["detail"])


async def test_a_bot_routing_the_self_test_to_nobody_fails(tmp_path: Path, alertmanager_factory: Any) -> None:
    config = {"routing": {"rules": [{"matchers": ['alertname=~"GPU.*"'], "receivers": []}]}}
    async with running_bot(tmp_path, config) as bot:
        am = alertmanager_factory(bot.url)
        code, steps, _ = await selftest(bot.config, am.url)
        assert code == 1
        assert [(s["step"], s["outcome"]) for s in steps][-2:] == [("deliver", "FAIL"), ("resolve", "pass")]
        assert steps[-2]["detail"] == "the bot's routing sends GPUSelfTest to no receiver: nobody would be told"


@pytest.mark.parametrize("page", [False, True])
async def test_pagerduty_hears_of_the_self_test_only_when_asked(
    tmp_path: Path, alertmanager_factory: Any, page: bool
) -> None:
    key_file = tmp_path / "routing_key"
    key_file.write_text("0123456789abcdef0123456789abcdef\n")
    async with FakePagerDuty() as pagerduty:
        receiver = {"name": "pd", "type": "pagerduty", "routing_key_file": str(key_file), "url": pagerduty.url}
        config = {"receivers": [receiver], "routing": {"rules": [WATCHDOG_TELLS_NOBODY], "default": ["pd"]}}
        async with running_bot(tmp_path, config) as bot:
            am = watchdog_firing(alertmanager_factory(bot.url))
            code, steps, _ = await selftest(bot.config, am.url, pagerduty_event=page)
        assert code == 0, steps
        assert outcomes(steps)["deliver resolve pd"] == "pass"
        if not page:
            assert pagerduty.alerts == {}
            return
        [[incident]] = pagerduty.alerts.values()
        assert incident.status == "resolved"
        assert incident.summary.startswith("[self-test] GPUSelfTest")


def bot_process(tmp_path: Path, config: dict[str, Any]) -> tuple[BotProcess, Path]:
    """`serve` as a real process, listening where its file says (where the self-test looks for it)."""
    port = free_port()
    path = write_config(tmp_path, {**config, "server": {"listen": f"127.0.0.1:{port}"}})
    return BotProcess(path, listen_port=port), path


def edit(path: Path, config: dict[str, Any]) -> BotConfig:
    """The file changed after the bot started (its listen address and store kept), as the self-test reads it."""
    kept = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**config, "server": kept["server"], "store": kept["store"]}))
    return load_config(path)


async def test_a_receiver_added_to_the_file_of_a_running_bot_is_said_at_once(
    tmp_path: Path, alertmanager_factory: Any, slack: FakeSlack
) -> None:
    console_only = {"receivers": [{"name": "console", "type": "console"}], "routing": {"default": ["console"]}}
    bot, path = bot_process(tmp_path, console_only)
    try:
        am = alertmanager_factory(bot.url)
        edited = edit(path, bot_config(tmp_path, slack))  # a Slack receiver added, the bot not restarted
        code, steps, _ = await selftest(edited, am.url, config_file=str(path))
    finally:
        bot.stop()
    assert code == 1
    [failed] = [s for s in steps if s["outcome"] == "FAIL"]
    assert (failed["step"], failed["detail"]) == (
        "bot config",
        "the running bot has no receiver slack-gpu: restart it with this config",
    )
    assert failed["cause"] == f"{path} was changed after the bot started, or the bot runs another configuration file"
    assert failed["look"] == (
        f"curl -s {bot.url}/config; systemctl restart gpu-alert-bot (or: docker compose restart gpu-alert-bot)"
    )
    # Nothing was fired to wait for: the alert path is skipped.
    assert {step: outcomes(steps)[step] for step in ALERT_PATH} == dict.fromkeys(ALERT_PATH, "skip")


async def test_a_running_bot_whose_routing_differs_from_the_file_is_said_at_once_and_its_secrets_are_not(
    tmp_path: Path, alertmanager_factory: Any, slack: FakeSlack
) -> None:
    config = bot_config(tmp_path, slack)
    bot, path = bot_process(tmp_path, config)
    try:
        told = httpx.get(f"{bot.url}/config").json()
        am = alertmanager_factory(bot.url)
        edited = edit(path, {**config, "routing": {"default": ["console"]}})
        code, steps, _ = await selftest(edited, am.url, config_file=str(path))
    finally:
        bot.stop()
    assert told["receivers"] == [{"name": "console", "type": "console"}, {"name": "slack-gpu", "type": "slack"}]
    assert DEFAULT_TOKEN not in json.dumps(told) and "slack_token" not in json.dumps(told)
    assert code == 1
    [failed] = [s for s in steps if s["outcome"] == "FAIL"]
    assert (failed["step"], failed["detail"]) == (
        "bot config",
        f"the running bot's receivers or routing differ from {path}: restart it with this config",
    )


async def test_a_switch_no_watchdog_arms_fails_the_self_test_at_once(tmp_path: Path, alertmanager_factory: Any) -> None:
    """The self-test's own alert does not arm the dead man's switch: a self-test that passes leaves it armed, so a
    Watchdog that never comes fails it (and /readyz's "never armed" is not answered by a passing self-test)."""
    async with running_bot(tmp_path) as bot:
        am = alertmanager_factory(bot.url)  # nothing fires the Watchdog
        out = io.StringIO()
        options = Options(alertmanager=am.url, timeout=3600, output="json")  # said at once, not at the timeout
        code = await selftest_command(bot.config, options, out)
        steps = json.loads(out.getvalue())["steps"]
    assert code == 1
    assert [s["step"] for s in steps if s["outcome"] == "FAIL"] == ["dead man's switch"]
    assert steps[-1]["detail"] == (
        "Alertmanager has no Watchdog alert: the bot's dead man's switch is never armed and pages nobody"
    )
    assert "config/rules/monitoring-alerts.yml" in steps[-1]["cause"]


async def test_a_watchdog_alertmanager_sends_elsewhere_is_named(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        config = webhook_alertmanager_config(bot.url)
        config["route"]["routes"] = [{"receiver": "heartbeat", "matchers": ['alertname="Watchdog"']}]
        config["receivers"].append({"name": "heartbeat"})
        am = watchdog_firing(Alertmanager(tmp_path / "am", config))
        try:
            code, steps, _ = await selftest(bot.config, am.url)
        finally:
            am.stop()
    assert code == 1
    assert (steps[-1]["step"], steps[-1]["detail"]) == (
        "dead man's switch",
        "Alertmanager sends Watchdog to heartbeat, not to the bot: its dead man's switch is never armed and pages "
        "nobody",
    )
    assert steps[-1]["look"] == "amtool config routes test alertname=Watchdog"


async def test_a_silenced_watchdog_is_named_with_its_silence(tmp_path: Path, alertmanager_factory: Any) -> None:
    async with running_bot(tmp_path) as bot:
        am = alertmanager_factory(bot.url)
        # Silenced before it fires: Alertmanager never sends it.
        silence = am.amtool("silence", "add", "alertname=Watchdog", "--comment=maintenance", "--duration=1h")
        watchdog_firing(am)
        code, steps, _ = await selftest(bot.config, am.url)
    assert code == 1
    assert (steps[-1]["step"], steps[-1]["detail"]) == (
        "dead man's switch",
        f"the Watchdog is silenced ({silence.stdout.strip()}) in Alertmanager: it never reaches the bot, whose dead "
        "man's switch is never armed and pages nobody",
    )
