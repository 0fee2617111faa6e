"""Drain and resume through a real Slurm scheduler, from Slack, end to end: signed clicks into the running bot,
the Slack fake, a real sshd whose key forces the shipped scripts/slurm-node-actions.sh (configured as
docs/remediation.md says), and a real slurmctld with a slurmd for node n1 (tests/support/slurm.py).

An admin's click asks for drain-node on an Xid 79; an admin approves it in the thread; n1 is DRAIN in the
scheduler with the alert's id in its reason (what `sinfo -R` shows), `/gpu status` says so, and a click on
resume-node brings n1 back. A refused approval changes nothing; an error of the scheduler is said in the thread
and audited. The node read back decides: a resume the controller applied but answered with an error is done, a
resume of a node that takes jobs already is done, and a resumed node is said responding or not once the
controller's ping to its slurmd had its answer. A dry run names the alert and its id in the reason it shows."""

from __future__ import annotations

import asyncio
import html
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.models import AlertState, short_id
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import RunningBot, eventually, running_bot, write_config
from tests.support.processes import REPO, BotProcess
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
SLACK_DOC = REPO / "docs" / "slack.md"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    started = SlurmCluster()
    yield started
    started.stop()


@pytest.fixture
def controller(tmp_path: Path, cluster: SlurmCluster) -> Iterator[Sshd]:
    # n9: a name the key may change that the scheduler does not know.
    server = slurm_sshd(tmp_path / "sshd", cluster, 'NODES="n1 n2 n9"\n')
    yield server
    server.stop()
    idle_n1(cluster)


def idle_n1(cluster: SlurmCluster) -> None:
    """Each test starts from an idle n1."""
    if cluster.state(NODE).startswith("drain"):
        cluster.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")


def drain_n1(cluster: SlurmCluster) -> None:
    cluster.run("scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=xid 79 by hand")


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
        documented = next(line for line in SLACK_DOC.read_text().splitlines() if line.startswith("| `/gpu status`"))
        assert "Slurm node gpu-node-01 (k-ai-01): drained, reason: " in documented

        resumed = await click(bot, slack, RESUME, alert.key, root.ts, RESPONDER)
        assert resumed.startswith("Started resume-node on k-ai-01")
        await eventually(lambda: any(f"{RESUME} on k-ai-01 done" in text for text in replies()), timeout=30)
        assert cluster.state(NODE) == "idle"
        verbs = controller.verbs()
        assert verbs[:5] == [
            f"drain {NODE} gpu-alert-bot GPUXIDError alert {alert_id} run {run_id}",
            f"node {NODE}",
            "nodes",
            f"resume {NODE}",
            f"node {NODE}",
        ]
        assert set(verbs[5:]) <= {f"node {NODE}"}  # read again until the controller heard from its slurmd
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
    async with running_bot(tmp_path, slurm_config(tmp_path, slack, controller, node="n9")) as bot:
        alert, root = await post_alert(bot, slack, "GPUXIDError", host="k-ai-01", gpu="0", err_code="79")
        started = await post_command(bot.url, f"run cordon-node {alert.fingerprint}", user=RESPONDER)
        assert started.startswith("Started cordon-node")
        replies = lambda: [reply.text for reply in slack.replies(root)]  # noqa: E731
        failed = await eventually(
            lambda: [text for text in replies() if "cordon-node on k-ai-01 failed" in text], timeout=30
        )
        assert "the scheduler refused to drain n9: slurm_update error: Invalid node name specified" in failed[0]
        audit = await bot.runtime.store.audit_log(alert.starts_at)
        [entry] = [e for e in audit if e.action == "run cordon-node" and e.outcome == "failed"]
        assert "Invalid node name specified" in entry.detail
        [run] = await bot.runtime.store.action_runs(alert.starts_at)
    drain = f"drain n9 gpu-alert-bot GPUXIDError alert {short_id(alert.key)} run {run.id}"
    assert controller.verbs() == [drain, "node n9"]  # the node read back after the error


async def resume_from_the_thread(bot: RunningBot, slack: FakeSlack) -> str:
    """A click on Resume node under an Xid 79 alert of k-ai-01; what the thread says the run came to."""
    alert, root = await post_alert(bot, slack, "GPUXIDError", host="k-ai-01", gpu="0", err_code="79")
    started = await click(bot, slack, RESUME, alert.key, root.ts, RESPONDER)
    assert started.startswith(f"Started {RESUME} on k-ai-01")
    ended = await eventually(
        lambda: [
            reply.text
            for reply in slack.replies(root)
            if f"{RESUME} on k-ai-01 done" in reply.text or f"{RESUME} on k-ai-01 failed" in reply.text
        ],
        timeout=60,
    )
    return html.unescape(ended[0])


async def test_a_resumed_node_is_said_responding_once_its_slurmd_answered_the_controllers_ping(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster, controller: Sshd
) -> None:
    """slurmd stopped while the controller pings it after the resume: the bot's first read finds n1 not
    responding, the next ones, after slurmd goes on, find it idle."""
    drain_n1(cluster)
    async with running_bot(tmp_path, slurm_config(tmp_path, slack, controller)) as bot:
        cluster.pause_slurmd()
        try:
            ended = asyncio.ensure_future(resume_from_the_thread(bot, slack))
            await eventually(lambda: controller.verbs()[:2] == [f"resume {NODE}", f"node {NODE}"], timeout=30)
        finally:
            cluster.continue_slurmd()
        said = await ended
    assert f"{RESUME} on k-ai-01 done" in said and f"Slurm node {NODE} is idle" in said
    assert "not responding" not in said
    assert controller.verbs().count(f"node {NODE}") >= 2


async def test_a_resume_of_a_node_that_takes_jobs_already_is_done(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster, controller: Sshd
) -> None:
    """Slurm refuses to resume a node that is not drained ("Invalid node state specified"): a second click, or
    one after someone resumed the node by hand, finds nothing left to do."""
    async with running_bot(tmp_path, slurm_config(tmp_path, slack, controller)) as bot:
        said = await resume_from_the_thread(bot, slack)
    assert f"{RESUME} on k-ai-01 done" in said and f"Slurm node {NODE} is idle: already taking jobs" in said
    first, *reads = controller.verbs()
    assert first == f"resume {NODE}" and set(reads) == {f"node {NODE}"}


async def test_a_resume_the_controller_applied_but_answered_with_an_error_is_done(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster
) -> None:
    """The key's scontrol applies the update and then reports the error a client gets when the controller's
    answer is lost on its way back (a controller that restarted under it)."""
    lossy = tmp_path / "scontrol-losing-its-answer"
    lossy.write_text(
        f'#!/bin/sh\n{shutil.which("scontrol")} "$@" >/dev/null 2>&1\n'
        "echo 'slurm_update error: Socket timed out on send/recv operation' >&2\nexit 1\n"
    )
    lossy.chmod(0o755)
    drain_n1(cluster)
    server = slurm_sshd(tmp_path / "sshd", cluster, f'NODES="n1"\nSCONTROL={lossy}\n')
    try:
        async with running_bot(tmp_path, slurm_config(tmp_path, slack, server)) as bot:
            said = await resume_from_the_thread(bot, slack)
    finally:
        server.stop()
        idle_n1(cluster)
    assert f"{RESUME} on k-ai-01 done" in said
    assert f'Slurm node {NODE} is idle (the scheduler answered "slurm_update error: Socket timed out' in said
    assert cluster.state(NODE) == "idle"


async def test_a_dry_run_of_a_drain_shows_the_reason_with_the_alert_and_its_id(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster, controller: Sshd
) -> None:
    async with running_bot(tmp_path, slurm_config(tmp_path, slack, controller)) as bot:
        alert, _ = await post_alert(bot, slack, "GPUXIDError", host="k-ai-01", gpu="0", err_code="79")
        answer = await post_command(bot.url, f"run {DRAIN} {short_id(alert.key)} --dry-run", user=ADMIN)
    reason = f"gpu-alert-bot GPUXIDError alert {short_id(alert.key)} run <number>"
    assert f'scontrol update NodeName={NODE} State=DRAIN Reason="{reason}"' in html.unescape(answer)
    assert controller.verbs() == [] and cluster.state(NODE) == "idle"


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


async def test_the_bots_log_stays_json_lines_when_it_speaks_ssh_to_the_scheduler(
    tmp_path: Path, slack: FakeSlack, cluster: SlurmCluster, controller: Sshd
) -> None:
    """The SSH library warns, as it loads, of the key types its cryptography library deprecates: the warnings of
    the libraries the bot loads go through its log, one JSON object a line like every other line."""
    bot = await asyncio.to_thread(BotProcess, write_config(tmp_path, slurm_config(tmp_path, slack, controller)))
    try:
        status = await post_command(bot.url, "status", user=RESPONDER)
        assert f"Slurm node {NODE} (k-ai-01): idle" in status
    finally:
        await asyncio.to_thread(bot.stop)
    logged = bot.stderr.snapshot()
    assert logged
    for line in logged:
        assert isinstance(json.loads(line), dict), line
    assert not any("DSA is deprecated" in line for line in logged)
