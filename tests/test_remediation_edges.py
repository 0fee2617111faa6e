"""Remediation at its edges, end to end: signed Slack requests into the running bot, the Slack fake, and a real
sshd (the shipped forced command) behind every configured host. A reset of the circuit breaker starts a new
window; a run the cooldown forbids is refused when asked for; each request is audited once; an action's button
shows only where an executor can run it."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.models import short_id
from tests.fakes.kubernetes import FakeKubernetes
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import eventually, running_bot
from tests.support.processes import Prometheus
from tests.support.slack_requests import RESPONDER, click_payload, post_click, post_command
from tests.support.sshd import SSHD, Sshd
from tests.test_remediation_slack_e2e import ADMIN, RESTART, buttons, post_alert, remediating_config

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)"),
]


def hosts_config(tmp_path: Path, slack: FakeSlack, sshd: Sshd, hosts: list[str], **remediation: Any) -> dict[str, Any]:
    """The bot with each of `hosts` reachable over SSH (all the same sshd), and these remediation settings."""
    config = remediating_config(tmp_path, slack, sshd)
    ssh = config["remediation"]["hosts"]["k-ai-01"]["ssh"]
    config["remediation"]["hosts"] = {host: {"ssh": ssh} for host in hosts}
    config["remediation"].update(remediation)
    return config


@pytest.fixture
def prometheus(tmp_path: Path) -> Any:
    """A real Prometheus scraping nothing: automatic runs need one to verify with (here they escalate)."""
    server = Prometheus(tmp_path / "prometheus", {"global": {"scrape_interval": "1s"}, "scrape_configs": []})
    yield server
    server.stop()


async def test_a_breaker_reset_starts_a_new_window(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd, prometheus: Prometheus
) -> None:
    hosts = ["k-ai-01", "k-ai-02", "k-ai-03", "k-ai-04"]
    config = hosts_config(
        tmp_path,
        slack,
        sshd,
        hosts,
        actions={RESTART: {"automatic": True, "verify_within": "1s"}},
        circuit_breaker={"max_hosts": 2, "window": "1h"},
        prometheus={"url": prometheus.url},
    )
    async with running_bot(tmp_path, config) as bot:
        for host in hosts[:2]:
            await post_alert(bot, slack, "DCGMExporterNoGPUs", host=host)
        await eventually(lambda: sshd.verbs() == [RESTART, RESTART], timeout=30)
        await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-03")  # a third host: fleet-wide
        await eventually(lambda: bot.runtime.store.get_breaker(), timeout=15)
        answer = await post_command(bot.url, "reset-breaker", user=ADMIN)
        assert answer == "Circuit breaker reset: the automatic policy may act again."
        assert bot.metric("gpu_alert_bot_remediation_breaker_open") == 0

        # Within the hour of the first two runs: they made the admin's decision, and count no more.
        alert, _ = await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-04")
        await eventually(lambda: len(sshd.verbs()) == 3, timeout=30)
        assert await bot.runtime.store.get_breaker() is None
        assert bot.metric("gpu_alert_bot_remediation_breaker_open") == 0
        [run] = [r for r in await bot.runtime.store.action_runs(alert.starts_at) if r.target == "k-ai-04"]
        assert run.automatic
        assert run.state in ("running", "done", "escalated")


async def test_a_run_the_cooldown_forbids_is_refused_when_asked_never_sent_to_an_approver(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd
) -> None:
    async with running_bot(tmp_path, remediating_config(tmp_path, slack, sshd)) as bot:  # approval needed
        alert, root = await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-01")
        sid = short_id(alert.key)
        first = await post_command(bot.url, f"run {RESTART} {sid}")
        assert "waits for approval" in first
        run_id = int(first.split("(run #", 1)[1].split(")", 1)[0])
        assert (await post_command(bot.url, f"approve {run_id}", user=ADMIN)).startswith(f"Approved run #{run_id}")
        await eventually(lambda: _state(bot, run_id, "done"), timeout=30)
        assert sshd.verbs() == [RESTART]
        ran = await bot.runtime.store.get_action_run(run_id)
        assert ran is not None
        allowed = ran.updated_at + timedelta(minutes=30)

        again = await post_command(bot.url, f"run {RESTART} {sid}", response_url=slack.response_url("2"))
        assert again == (
            f"Refused: cooldown: {RESTART} ran on k-ai-01 at {ran.updated_at:%H:%M:%S} UTC, "
            f"next allowed after {allowed:%H:%M:%S} UTC"
        )
        assert [run.id for run in await bot.runtime.store.action_runs(alert.starts_at)] == [run_id]
        refusal = lambda: [t for t in _thread(slack, root) if f"{RESTART} refused" in t and "allowed after" in t]  # noqa: E731
        await eventually(refusal, timeout=15)
        # The thread only ever spoke of the first run: nobody was asked to approve a second.
        mentioned = {text.split("(run #", 1)[1].split(")", 1)[0] for text in _thread(slack, root) if "(run #" in text}
        assert mentioned == {str(run_id)}
        assert sshd.verbs() == [RESTART]


async def _state(bot: Any, run_id: int, state: str) -> bool:
    run = await bot.runtime.store.get_action_run(run_id)
    return run is not None and run.state == state


def _thread(slack: FakeSlack, root: SlackMessage) -> list[str]:
    return [reply.text for reply in slack.replies(root)]


async def test_each_slack_request_is_audited_once_done_or_refused(tmp_path: Path, slack: FakeSlack, sshd: Sshd) -> None:
    async with running_bot(tmp_path, remediating_config(tmp_path, slack, sshd)) as bot:
        alert, root = await post_alert(bot, slack, "DCGMExporterNoGPUs", host="k-ai-01")
        stranger, _ = await post_alert(bot, slack, "GPUMissing", host="k-ai-09")  # no executor reaches it
        assert await post_click(bot.url, click_payload(RESTART, alert.key, root.ts, RESPONDER, slack.response_url()))
        [requested] = await eventually(lambda: slack.responses, timeout=15)
        run_id = int(requested["text"].split("(run #", 1)[1].split(")", 1)[0])
        assert (await post_command(bot.url, f"approve {run_id}", user=ADMIN)).startswith("Approved")
        await eventually(lambda: _state(bot, run_id, "done"), timeout=30)
        refused = await post_command(bot.url, f"run {RESTART} {short_id(stranger.key)}")
        assert refused.startswith("Refused: host 'k-ai-09' is not a configured remediation target")
        assert await post_command(bot.url, "approve 99", user=ADMIN) == "Refused: no run #99"
        assert await post_command(bot.url, "reset-breaker", user=ADMIN) == (
            "Circuit breaker reset: the automatic policy may act again."
        )

        entries = await bot.runtime.store.audit_log(alert.starts_at - timedelta(minutes=1))
        asked = [(e.actor, e.action, e.outcome) for e in entries if e.actor.startswith("slack:")]
        assert asked == [
            ("slack:U0RESPOND1 alice", f"run {RESTART}", "requested"),
            ("slack:U0ADMIN001 ada", f"approve {RESTART}", "approved"),
            ("slack:U0RESPOND1 alice", f"run {RESTART}", "done"),  # the run's own step, not a request
            ("slack:U0RESPOND1 alice", f"run {RESTART}", "refused"),
            ("slack:U0ADMIN001 ada", "approve", "refused"),
            ("slack:U0ADMIN001 ada", "circuit-breaker", "reset"),
        ]


async def test_an_action_button_shows_only_on_an_alert_whose_host_can_run_it(
    tmp_path: Path, slack: FakeSlack, sshd: Sshd
) -> None:
    async with running_bot(tmp_path, remediating_config(tmp_path, slack, sshd)) as bot:
        _, reachable = await post_alert(bot, slack, "GPUMissing", host="k-ai-01")
        _, elsewhere = await post_alert(bot, slack, "GPUThermalThrottling", host="k-ai-09")  # in no remediation.hosts
        _, hostless = await post_alert(bot, slack, "HostMemoryLow", cluster="east")
        assert "collect-diagnostics" in buttons(reachable)
        for message in (elsewhere, hostless):  # their playbooks name it too, but no executor reaches them
            assert "collect-diagnostics" not in buttons(message)
            assert buttons(message)[:2] == ["ack", "silence-1h"]


async def test_each_host_shows_the_buttons_of_its_own_executor(tmp_path: Path, slack: FakeSlack, sshd: Sshd) -> None:
    async with FakeKubernetes() as cluster:
        cluster.add_node("gpu-node-1")
        config = remediating_config(tmp_path, slack, sshd)  # k-ai-01 over SSH
        config["remediation"]["kubernetes"] = {"kubeconfig": str(cluster.kubeconfig(tmp_path / "kubeconfig"))}
        config["remediation"]["hosts"]["gpu-node-1"] = {"kubernetes_node": "gpu-node-1"}
        async with running_bot(tmp_path, config) as bot:
            _, over_ssh = await post_alert(bot, slack, "GPUXidError", host="k-ai-01", gpu="3")
            _, node = await post_alert(bot, slack, "GPUXidError", host="gpu-node-1", gpu="0")
            # One playbook names both; SSH has the diagnostics verb, the Kubernetes executor serves the node.
            assert "collect-diagnostics" in buttons(over_ssh) and "cordon-node" not in buttons(over_ssh)
            assert "cordon-node" in buttons(node) and "collect-diagnostics" not in buttons(node)
