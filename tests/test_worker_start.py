"""A worker process that cannot start: its metrics port taken is a start-up error naming the key to set, not a
crash loop; and /readyz is 503 while the supervised worker process is not running, whatever its last heartbeat
said."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from bot.metrics import Metrics
from bot.service.heartbeat import Heartbeat
from bot.service.supervisor import CANNOT_START, WorkerSupervisor
from tests.support.bot import eventually, running_bot
from tests.support.clock import FakeClock
from tests.support.processes import BotProcess

RUNNING = {"worker": "running", "outbox": "running"}


def test_a_taken_worker_metrics_port_stops_serve_with_the_key_to_set(tmp_path: Path) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "bot.db")}}))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as started:
            BotProcess(config, worker_metrics_port=port)
    said = str(started.value)
    assert said.startswith(f"process exited with {CANNOT_START} before")  # serve stopped: no crash loop
    assert f"the worker cannot listen on 127.0.0.1:{port} for its /metrics" in said
    assert "set worker.metrics_listen (or --worker-metrics-listen) to a free HOST:PORT" in said
    assert "the worker process cannot start with this configuration" in said
    assert "restarting it" not in said


async def test_a_worker_process_that_cannot_start_is_not_restarted() -> None:
    clock = FakeClock()
    metrics = Metrics()
    gave_up: list[bool] = []
    command = [sys.executable, "-c", f"raise SystemExit({CANNOT_START})"]
    supervisor = WorkerSupervisor(command, metrics, clock, stop_timeout=5, on_give_up=lambda: gave_up.append(True))
    await supervisor.start()
    try:
        await eventually(lambda: gave_up, timeout=30)
        assert metrics.registry.get_sample_value("gpu_alert_bot_worker_restarts_total") == 0
        assert clock.sleeping == 0  # no restart waiting either
        assert supervisor.gave_up is not None and supervisor.not_running() == supervisor.gave_up
    finally:
        await supervisor.stop()


async def test_readyz_is_503_while_the_worker_process_waits_for_its_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    supervisor = WorkerSupervisor([sys.executable, "-c", "raise SystemExit(3)"], Metrics(), clock, stop_timeout=5)
    config = {"deadman": {"enabled": False}}
    async with running_bot(tmp_path, config, clock, side="ingest", worker_process=supervisor.not_running) as bot:
        # The last heartbeat of the worker before it died: recent, and saying it ran.
        await Heartbeat(bot.runtime.store, bot.config.store.replica, clock, lambda: RUNNING).beat()
        await supervisor.start()
        try:
            await eventually(lambda: clock.sleeping == 1, timeout=30)  # dead, its restart waiting on the clock
            async with httpx.AsyncClient() as client:
                answer = await client.get(f"{bot.url}/readyz")
            assert answer.status_code == 503
            assert answer.json()["checks"]["worker"] == "the worker process exited (3): restarting it in 0.5 s"
        finally:
            await supervisor.stop()
