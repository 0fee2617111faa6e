"""The Docker executor driven by aiodocker against the loopback Docker Engine API fake on a unix socket: the
version is negotiated, the configured container is restarted (the call waits for the slow restart), and 404 and
500 answers become failed runs with Docker's message."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import trustme
from pydantic import ValidationError

from bot.actions.authorization import ConfigAuthorizer
from bot.actions.build import alert_finder, build_executors
from bot.actions.docker import DockerExecutor
from bot.actions.engine import Remediation
from bot.actions.executor import ExecutorError
from bot.config import DockerExecutorConfig, RemediationConfig
from tests.fakes.docker import API_VERSION, FakeDocker
from tests.support.clock import FakeClock
from tests.support.remediation import Thread, firing_alert
from tests.support.store import sqlite_store


@pytest.fixture
async def docker(tmp_path: Path) -> AsyncIterator[FakeDocker]:
    async with FakeDocker(tmp_path / "docker.sock", ["dcgm-exporter", "vllm"]) as fake:
        yield fake


def docker_config(fake: FakeDocker, **settings: object) -> DockerExecutorConfig:
    return DockerExecutorConfig.model_validate(
        {"url": fake.url, "containers": {"restart-dcgm-exporter": "dcgm-exporter"}, **settings}
    )


async def test_a_restart_negotiates_the_version_and_waits_for_the_slow_restart(docker: FakeDocker) -> None:
    docker.restart_seconds = 1.5  # longer than aiohttp would wait with a read timeout of 1 s
    executor = DockerExecutor("gpu01", docker_config(docker, stop_timeout=1, timeout="10s"))
    result = await executor.run("restart-dcgm-exporter", None)
    assert result.ok and result.output == "container dcgm-exporter restarted on gpu01"
    assert docker.restarts("dcgm-exporter") == 1
    assert docker.requests[-1] == ("POST", f"/v{API_VERSION}/containers/dcgm-exporter/restart", {"t": "1"})
    assert ("GET", "/version", {}) in docker.requests


async def test_a_restart_longer_than_the_timeout_fails(docker: FakeDocker) -> None:
    docker.restart_seconds = 3.0
    executor = DockerExecutor("gpu01", docker_config(docker, stop_timeout=0, timeout="1s"))
    with pytest.raises(ExecutorError, match="unreachable: TimeoutError"):
        await executor.run("restart-dcgm-exporter", None)


async def test_a_missing_container_and_a_daemon_error_carry_dockers_message(docker: FakeDocker) -> None:
    missing = DockerExecutor("gpu01", docker_config(docker, containers={"restart-dcgm-exporter": "dcgm-exporter-old"}))
    with pytest.raises(ExecutorError, match="404: No such container: dcgm-exporter-old"):
        await missing.run("restart-dcgm-exporter", None)
    docker.failing.add("dcgm-exporter")
    with pytest.raises(ExecutorError, match="500: Cannot restart container dcgm-exporter"):
        await DockerExecutor("gpu01", docker_config(docker)).run("restart-dcgm-exporter", None)


def test_the_timeout_must_cover_the_stop_grace_period_and_only_restarts_are_configurable() -> None:
    with pytest.raises(ValidationError, match="timeout must be longer than stop_timeout"):
        DockerExecutorConfig.model_validate({"stop_timeout": 30, "timeout": "20s"})
    with pytest.raises(ValidationError, match="Docker can run only"):
        DockerExecutorConfig.model_validate({"containers": {"reboot-node": "x"}})


async def test_the_engine_restarts_through_docker_and_a_failure_is_a_failed_run(
    tmp_path: Path, docker: FakeDocker
) -> None:
    clock, thread = FakeClock(), Thread()
    config = RemediationConfig.model_validate(
        {"hosts": {"gpu01": {"docker": {"url": docker.url, "containers": {"restart-inference-server": "vllm"}}}}}
    )
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, "vLLMQueueBacklog", instance="gpu01:8000")
        bot = Remediation(
            store, config, build_executors(config), thread, ConfigAuthorizer(config), alert_finder(store), clock=clock
        )
        assert bot.executable_actions() == {"restart-inference-server"}
        run = await bot.request("restart-inference-server", alert.fingerprint, "cli:alice")
        await bot.drain()
        assert (await store.get_action_run(run.id)).state == "done"  # type: ignore[union-attr]
        assert docker.restarts("vllm") == 1

        docker.failing.add("vllm")
        await clock.advance(3600)
        failed = await bot.request("restart-inference-server", alert.fingerprint, "cli:alice")
        await bot.drain()
        record = await store.get_action_run(failed.id)
        assert record is not None and record.state == "failed" and "500" in record.detail
        assert any("restart-inference-server on gpu01 failed" in text for text in thread.texts(alert.key))
        outcomes = [e.outcome for e in await store.audit_log(clock.now() - timedelta(days=1))]
        assert outcomes == ["requested", "done", "requested", "failed"]


async def test_over_tcp_the_engine_and_the_bot_prove_who_they_are_with_certificates(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED  # dockerd --tlsverify
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client = ca.issue_cert("gpu-alert-bot")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    client.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    async with FakeDocker(tmp_path / "unused.sock", ["dcgm-exporter"], tls=server) as docker:
        files = {"ca_file": str(tmp_path / "ca.pem"), "cert_file": str(tmp_path / "cert.pem")}
        mutual = docker_config(docker, **files, key_file=str(tmp_path / "key.pem"))
        assert (await DockerExecutor("gpu01", mutual).run("restart-dcgm-exporter", None)).ok
        assert docker.restarts("dcgm-exporter") == 1

        without_client_cert = docker_config(docker, ca_file=str(tmp_path / "ca.pem"))
        with pytest.raises(ExecutorError, match="Docker API unreachable"):
            await DockerExecutor("gpu01", without_client_cert).run("restart-dcgm-exporter", None)
        assert docker.restarts("dcgm-exporter") == 1
