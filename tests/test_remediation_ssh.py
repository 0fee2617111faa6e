"""The SSH executor against a real sshd (Debian's openssh-server) whose forced command is the shipped
scripts/gpu-node-actions.sh: the bot sends a fixed verb, the host key is pinned, and label values crafted to pick
another host or container, or to inject shell, never reach the node."""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from bot.actions.authorization import ConfigAuthorizer
from bot.actions.build import alert_finder, build_executors
from bot.actions.engine import Remediation
from bot.actions.executor import ExecutorError
from bot.actions.runs import ActionRefused
from bot.actions.ssh import SshExecutor
from bot.config import RemediationConfig, SshExecutorConfig
from tests.support.clock import FakeClock
from tests.support.remediation import Thread, firing_alert
from tests.support.sshd import NODE_ACTIONS, SSHD, Sshd
from tests.support.store import sqlite_store

pytestmark = pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)")


def ssh_config(sshd: Sshd, known_hosts: Path | None = None) -> dict[str, object]:
    return {
        "address": "127.0.0.1",
        "port": sshd.port,
        "user": sshd.user,
        "key_file": str(sshd.key_file),
        "known_hosts": str(known_hosts or sshd.known_hosts),
        "timeout": "20s",
    }


def remediation(sshd: Sshd, **settings: object) -> RemediationConfig:
    return RemediationConfig.model_validate({"hosts": {"gpu01": {"ssh": ssh_config(sshd)}}, **settings})


async def test_restart_reaches_the_forced_command_as_the_fixed_verb_which_restarts_the_container(
    tmp_path: Path, sshd: Sshd
) -> None:
    clock, thread = FakeClock(), Thread()
    config = remediation(sshd)
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, instance="gpu01:9400")
        bot = Remediation(
            store, config, build_executors(config), thread, ConfigAuthorizer(config), alert_finder(store), clock=clock
        )
        assert "restart-dcgm-exporter" in bot.executable_actions()
        run = await bot.request("restart-dcgm-exporter", alert.fingerprint, "cli:alice")
        await bot.drain()
        done = await store.get_action_run(run.id)
        assert done is not None and done.state == "done", done
        assert sshd.verbs() == ["restart-dcgm-exporter"]
        assert sshd.docker_calls() == ["restart -t 10 dcgm-exporter"]
        assert any("restart-dcgm-exporter on gpu01 done" in text for text in thread.texts(alert.key))
        entries = await store.audit_log(clock.now() - timedelta(hours=1))
        assert [(e.action, e.outcome) for e in entries] == [
            ("run restart-dcgm-exporter", "requested"),
            ("run restart-dcgm-exporter", "done"),
        ]


async def test_a_gpu_action_sends_the_checked_index() -> None:
    executor = SshExecutor("gpu01", SshExecutorConfig.model_construct(address="h", port=22, user="u"))
    assert executor.command("collect-diagnostics", "3") == "collect-diagnostics 3"
    with pytest.raises(ExecutorError, match="needs the alert's gpu label"):
        executor.command("collect-diagnostics", None)


async def test_a_wrong_host_key_is_refused_and_nothing_runs(sshd: Sshd) -> None:
    config = SshExecutorConfig.model_validate(ssh_config(sshd, sshd.wrong_known_hosts))
    with pytest.raises(ExecutorError, match="host key not verified"):
        await SshExecutor("gpu01", config).run("restart-dcgm-exporter", None)
    assert sshd.verbs() == []
    assert sshd.docker_calls() == []


@pytest.mark.parametrize(
    "labels",
    [
        {"instance": "gpu01:9400", "gpu": "0; reboot"},
        {"host": "../../etc", "instance": "gpu01:9400", "gpu": "0"},
        {"instance": "gpu02:9400", "gpu": "0"},
        {"Hostname": "$(reboot)", "instance": "gpu01:9400", "gpu": "0"},
    ],
    ids=["shell-in-gpu", "path-as-host", "other-host", "shell-as-hostname"],
)
async def test_crafted_label_values_are_refused_and_audited(tmp_path: Path, sshd: Sshd, labels: dict[str, str]) -> None:
    clock, thread = FakeClock(), Thread()
    config = remediation(sshd)
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, "GPUXidError", **labels)
        bot = Remediation(
            store, config, build_executors(config), thread, ConfigAuthorizer(config), alert_finder(store), clock=clock
        )
        with pytest.raises(ActionRefused):
            await bot.request("collect-diagnostics", alert.fingerprint, "cli:alice")
        await bot.drain()
        entries = await store.audit_log(clock.now() - timedelta(hours=1))
        assert [(e.action, e.outcome) for e in entries] == [("run collect-diagnostics", "refused")]
        assert sshd.verbs() == []


async def test_labels_that_select_nothing_have_no_say_in_what_runs(tmp_path: Path, sshd: Sshd) -> None:
    clock = FakeClock()
    config = remediation(sshd)
    async with sqlite_store(tmp_path) as store:
        labels = {"instance": "gpu01:9400", "gpu": "0", "container": "sshd", "command": "reboot"}
        alert = await firing_alert(store, "GPUXidError", **labels)
        thread = Thread()
        bot = Remediation(
            store, config, build_executors(config), thread, ConfigAuthorizer(config), alert_finder(store), clock=clock
        )
        run = await bot.request("collect-diagnostics", alert.fingerprint, "cli:alice")
        await bot.drain()
        assert (await store.get_action_run(run.id)).state == "done"  # type: ignore[union-attr]
        assert sshd.verbs() == ["collect-diagnostics 0"]
        assert sshd.docker_calls() == []
        # The diagnostics go to the thread as one code block (collapsed by Slack when long).
        [report] = [text for text in thread.texts(alert.key) if text.startswith("collect-diagnostics on gpu01 done")]
        assert "\n```\n== nvidia-smi -q -i 0\n" in report and report.endswith("\n```")


async def test_a_gpu_action_on_an_alert_without_a_gpu_label_is_refused(tmp_path: Path, sshd: Sshd) -> None:
    clock = FakeClock()
    config = remediation(sshd)
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, "InletTemperatureHigh", instance="gpu01:9290")
        bot = Remediation(
            store, config, build_executors(config), Thread(), ConfigAuthorizer(config), alert_finder(store), clock=clock
        )
        with pytest.raises(ActionRefused, match="lower-power-limit needs the alert's gpu label"):
            await bot.request("lower-power-limit", alert.fingerprint, "cli:alice")
        assert sshd.verbs() == []


def test_the_node_script_refuses_unknown_verbs_and_arguments_that_are_not_gpu_indexes(tmp_path: Path) -> None:
    log = tmp_path / "verbs.log"
    config = tmp_path / "node.conf"
    config.write_text(f"DOCKER=/bin/false\nLOG_FILE={log}\n")
    for request in ("reboot", "collect-diagnostics 0;reboot", "collect-diagnostics ../x", "restart-dcgm-exporter x"):
        result = subprocess.run(
            [str(NODE_ACTIONS), str(config)],
            env={"SSH_ORIGINAL_COMMAND": request, "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 64, (request, result)
        assert result.stderr.startswith("gpu-node-actions: ")
    assert log.read_text().count("refused:") == 4
