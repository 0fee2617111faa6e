"""Drain and resume through a real Slurm scheduler, from Slack, end to end: signed clicks into the running bot,
the Slack fake, a real sshd whose key forces the shipped scripts/slurm-node-actions.sh (configured as
docs/remediation.md says), and a real slurmctld with a slurmd for node n1 (tests/support/slurm.py).

An admin's click asks for drain-node on an Xid 79; an admin approves it in the thread; n1 is DRAIN in the
scheduler with the alert's id in its reason (what `sinfo -R` shows), `/gpu status` says so, and a click on
resume-node brings n1 back. A refused approval changes nothing; an error of the scheduler is said in the thread
and audited."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.models import AlertState, short_id
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.slack_requests import RESPONDER, post_command
from tests.support.slurm import NODE, SLURM_INSTALLED, SlurmCluster, slurm_sshd
from tests.support.sshd import SSHD, Sshd
from tests.test_remediation_approval_e2e import click
from tests.test_remediation_slack_e2e import ADMIN, buttons, post_alert, remediating_config

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)"),
    pytest.mark.skipif(not SLURM_INSTALLED, reason="needs Debian's slurmctld, slurmd and munge (scripts/test)"),
]

DRAIN, RESUME = "drain-node", "resume-node"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    started = SlurmCluster()
    yield started
    started.stop()


@pytest.fixture
def controller(tmp_path: Path, cluster: SlurmCluster) -> Iterator[Sshd]:
    server = slurm_sshd(tmp_path / "sshd", cluster, 'NODES="n1 n2"\n')
    yield server
    server.stop()
    if cluster.state(NODE).startswith("drain"):  # each test starts from an idle n1
        cluster.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")


def slurm_config(tmp_path: Path, slack: FakeSlack, controller: Sshd, node: str = NODE) -> dict[str, Any]:
    config = remediating_config(tmp_path, slack, None)
    ssh = {
        "address": "127.0.0.1",
        "port": controller.port,
        "user": controller.user,
        "key_file": str(controller.key_file),
        "known_hosts": str(controller.known_hosts),
        "timeout": "20s",
    }
    config["remediation"] = {
        "hosts": {"k-ai-01": {"slurm_node": node}},
        "slurm": {"ssh": ssh},
        "actions": {DRAIN: {"enabled": True}},
        "poll_interval": "200ms",
    }
    return config


async def request_drain(bot: RunningBot, slack: FakeSlack) -> tuple[AlertState, SlackMessage, int, SlackMessage]:
    """An admin's click on Drain node under an Xid 79: the alert, its message, the run and the approval message
    in the thread."""
    alert, root = await post_alert(bot, slack, "GPUXIDError", host="k-ai-01", gpu="0", err_code="79")
    assert DRAIN in buttons(root) and RESUME in buttons(root)
    requested = await click(bot, slack, DRAIN, alert.key, root.ts, ADMIN)
    run_id = int(requested.split("(run #", 1)[1].split(")", 1)[0])
    approval = await eventually(
        lambda: next((m for m in slack.replies(root) if "approve-run" in buttons(m)), None), timeout=10
    )
    return alert, root, run_id, approval


async def test_an_approved_drain_sets_drain_with_the_alerts_id_and_resume_brings_the_node_back(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster, controller: Sshd
) -> None:
    async with running_bot(tmp_path, slurm_config(tmp_path, slack, controller)) as bot:
        alert, root, run_id, approval = await request_drain(bot, slack)
        alert_id = short_id(alert.key)
        assert cluster.state(NODE) == "idle" and controller.verbs() == []

        approved = await click(bot, slack, "approve-run", str(run_id), approval.ts, ADMIN)
        assert approved.startswith(f"Approved run #{run_id}")
        replies = lambda: [reply.text for reply in slack.replies(root)]  # noqa: E731
        await eventually(lambda: any(f"{DRAIN} on k-ai-01 done" in text for text in replies()), timeout=30)
        assert cluster.state(NODE) == "drained"
        assert cluster.reason(NODE) == f"gpu-alert-bot GPUXIDError alert {alert_id} run {run_id}"
        assert any(f"Slurm node {NODE} is drained" in text for text in replies())

        status = await post_command(bot.url, "status", user=RESPONDER)
        assert f"Slurm node {NODE} (k-ai-01): drained, reason: gpu-alert-bot GPUXIDError alert {alert_id}" in status

        resumed = await click(bot, slack, RESUME, alert.key, root.ts, RESPONDER)
        assert resumed.startswith("Started resume-node on k-ai-01")
        await eventually(lambda: any(f"{RESUME} on k-ai-01 done" in text for text in replies()), timeout=30)
        assert cluster.state(NODE) == "idle"
        assert controller.verbs() == [
            f"drain {NODE} gpu-alert-bot GPUXIDError alert {alert_id} run {run_id}",
            f"node {NODE}",
            "nodes",
            f"resume {NODE}",
            f"node {NODE}",
        ]
        audit = [(e.actor, e.action, e.outcome) for e in await bot.runtime.store.audit_log(alert.starts_at)]
        assert ("slack:U0ADMIN001 ada", f"run {DRAIN}", "done") in audit
        assert ("slack:U0RESPOND1 alice", f"run {RESUME}", "done") in audit


async def test_a_refused_drain_changes_nothing_in_the_scheduler(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster, controller: Sshd
) -> None:
    async with running_bot(tmp_path, slurm_config(tmp_path, slack, controller)) as bot:
        _, _, run_id, approval = await request_drain(bot, slack)
        refused = await click(bot, slack, "refuse-run", str(run_id), approval.ts, ADMIN)
        assert refused.startswith(f"Refused run #{run_id}")
        run = await bot.runtime.store.get_action_run(run_id)
        assert run is not None and run.state == "refused"
        assert cluster.state(NODE) == "idle" and cluster.reason(NODE) == "none"
        assert controller.verbs() == []


async def test_an_error_of_the_scheduler_is_said_in_the_thread_and_audited(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster, controller: Sshd
) -> None:
    async with running_bot(tmp_path, slurm_config(tmp_path, slack, controller)) as bot:
        alert, root = await post_alert(bot, slack, "GPUXIDError", host="k-ai-01", gpu="0", err_code="79")
        # n1 is not drained: Slurm refuses to resume it.
        started = await click(bot, slack, RESUME, alert.key, root.ts, RESPONDER)
        assert started.startswith("Started resume-node")
        replies = lambda: [reply.text for reply in slack.replies(root)]  # noqa: E731
        failed = await eventually(
            lambda: [text for text in replies() if f"{RESUME} on k-ai-01 failed" in text], timeout=30
        )
        assert "Invalid node state specified" in failed[0]
        audit = await bot.runtime.store.audit_log(alert.starts_at)
        [entry] = [e for e in audit if e.action == f"run {RESUME}" and e.outcome == "failed"]
        assert "Invalid node state specified" in entry.detail
        assert cluster.state(NODE) == "idle"


async def test_a_hostile_alertname_never_reaches_the_reason_and_another_node_is_never_touched(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster, controller: Sshd
) -> None:
    hostile = 'X" State=DOWN NodeName=n2 $(scancel -u root)'
    async with running_bot(tmp_path, slurm_config(tmp_path, slack, controller)) as bot:
        alert, root = await post_alert(bot, slack, hostile, host="k-ai-01", gpu="0", node="n2")
        answer = await post_command(bot.url, f"run cordon-node {alert.fingerprint}", user=RESPONDER)
        assert answer.startswith("Started cordon-node on k-ai-01")
        replies = lambda: [reply.text for reply in slack.replies(root)]  # noqa: E731
        await eventually(lambda: any("cordon-node on k-ai-01 done" in text for text in replies()), timeout=30)
        [run] = await bot.runtime.store.action_runs(alert.starts_at)
    assert cluster.reason(NODE) == f"gpu-alert-bot alert alert {short_id(alert.key)} run {run.id}"
    assert cluster.state(NODE) == "drained"
    assert cluster.state("n2") != "drained" and cluster.reason("n2") == "none"
