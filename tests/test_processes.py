"""`serve --role`: the ingest side's /readyz reads the worker process's heartbeat; the worker process wakes on the
store's commits; `--role all` supervises its worker process (docs/processes.md). The crash tests of the process
layout are in test_crash_recovery.py."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bot.dedup import plan_events
from bot.metrics import ERROR_KINDS, Metrics
from bot.service.heartbeat import STALE_AFTER, Heartbeat
from bot.service.supervisor import WorkerSupervisor
from bot.service.wakeup import WATCH_EVERY, CommitWatch
from tests.support.bot import eventually, running_bot
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, body, webhook
from tests.support.processes import BotProcess
from tests.support.store import ingest, sqlite_store

RUNNING = {"worker": "running", "outbox": "running"}


async def test_an_ingest_process_is_ready_only_while_its_worker_process_beats(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_bot(tmp_path, {"deadman": {"enabled": False}}, clock, side="ingest") as bot:
        store, replica = bot.runtime.store, bot.config.store.replica
        states = dict(RUNNING)
        heartbeat = Heartbeat(store, replica, clock, lambda: states)
        async with httpx.AsyncClient() as client:
            first = await client.get(f"{bot.url}/readyz")
            assert first.status_code == 503
            assert first.json()["checks"] == {
                "store": "writable",
                "worker": "no heartbeat yet",
                "outbox": "no heartbeat yet",
            }

            await heartbeat.beat()
            beating = await client.get(f"{bot.url}/readyz")
            assert beating.status_code == 200
            assert beating.json()["checks"] == {"store": "writable", **RUNNING}

            await clock.advance(STALE_AFTER + 1)
            silent = await client.get(f"{bot.url}/readyz")
            assert silent.status_code == 503
            assert silent.json()["checks"]["worker"] == f"no heartbeat for {STALE_AFTER + 1:.0f} s"

            states["outbox"] = "stopped"
            await heartbeat.beat()
            stopped = await client.get(f"{bot.url}/readyz")
            assert stopped.status_code == 503
            assert stopped.json()["checks"] == {"store": "writable", "worker": "running", "outbox": "stopped"}


async def test_a_commit_by_another_connection_wakes_the_worker_at_the_next_look_and_its_own_do_not(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    wakeups: list[int] = []
    async with sqlite_store(tmp_path, side="worker") as worker:
        watch = CommitWatch(
            [worker.path, worker.inbox_path],
            worker.committed_elsewhere,
            lambda: wakeups.append(len(wakeups)),
            clock,
        )
        watch.start()
        try:
            await eventually(lambda: clock.sleeping == 1)
            await look(clock)
            assert wakeups == []  # nothing committed since the watch began

            async with sqlite_store(tmp_path, side="ingest") as ingest_side:
                await ingest(ingest_side, webhook([am_alert(host="k-ai-01", gpu="3")]))  # to the inbox
                await look(clock)
                assert wakeups == [0]

                await Heartbeat(ingest_side, "other", clock, lambda: RUNNING).beat()  # to the main file
                await Heartbeat(ingest_side, "another", clock, lambda: RUNNING).beat()
                await look(clock)
                assert wakeups == [0, 1]  # one wakeup for whatever was committed since the last look
            # Closed, so that its inbox sweeper deletes nothing from here on.
            await look(clock)
            woken = len(wakeups)

            while await worker.dedup_pending(plan_events, 8):  # the worker's own writes
                pass
            await Heartbeat(worker, "test", clock, lambda: RUNNING).beat()
            await look(clock)
            assert len(wakeups) == woken
        finally:
            await watch.stop()


async def look(clock: FakeClock) -> None:
    """Let the watch take one more look, and wait until it has."""
    await clock.advance(WATCH_EVERY)
    await eventually(lambda: clock.sleeping == 1)


async def test_serve_runs_the_worker_in_a_process_of_its_own_which_stops_with_it(tmp_path: Path) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "bot.db")}}))
    bot = BotProcess(config)
    try:
        worker = bot.worker_pid()
        assert worker is not None and worker != bot.process.pid
        answer = httpx.post(
            f"{bot.url}/alertmanager",
            content=body(webhook([am_alert(host="k-ai-01", gpu="3")])),
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 200
        # The worker process delivers (console lines share the group's stdout) and counts it on its own port.
        await eventually(lambda: any('"event": "firing"' in line for line in bot.stdout.snapshot()), timeout=30)
        worker_metrics = httpx.get(f"http://127.0.0.1:{bot.worker_metrics_port}/metrics").text
        assert 'gpu_alert_bot_deliveries_total{receiver="console",result="delivered"} 1.0' in worker_metrics
        assert_each_process_exports_what_it_owns(httpx.get(f"{bot.url}/metrics").text, worker_metrics)
    finally:
        assert bot.stop(signal.SIGTERM) == 0
    # SIGTERM stopped the worker process too: it logged its own shutdown before the group exited.
    assert any('"msg": "worker shutting down"' in line for line in bot.stderr.snapshot())
    assert not Path(f"/proc/{worker}").exists()


def _series(text: str) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """Each metric family of an exposition, with its series' labels."""
    return {
        family.name: {tuple(sorted(sample.labels.items())) for sample in family.samples}
        for family in text_string_to_metric_families(text)
    }


def assert_each_process_exports_what_it_owns(ingest_text: str, worker_text: str) -> None:
    """No process shows another's figures as stale zeros (both are scraped under one job): each name is exported
    by one process only, but the replica's identity and the errors each process counts, of kinds its own."""
    ingest, worker = _series(ingest_text), _series(worker_text)
    assert set(ingest) & set(worker) == {"gpu_alert_bot_replica_info", "gpu_alert_bot_errors"}
    assert "gpu_alert_bot_deadman_armed" in ingest and "gpu_alert_bot_alerts_received" in ingest
    assert "gpu_alert_bot_deliveries" in worker and "gpu_alert_bot_queue_depth" in worker
    # Both use the store; every other kind is counted by one process.
    both = ingest["gpu_alert_bot_errors"] & worker["gpu_alert_bot_errors"]
    assert both == {(("kind", "store_unavailable"),)}
    assert ingest["gpu_alert_bot_errors"] | worker["gpu_alert_bot_errors"] == {(("kind", k),) for k in ERROR_KINDS}


async def test_a_worker_process_that_keeps_dying_is_restarted_ever_more_slowly() -> None:
    clock = FakeClock()
    metrics = Metrics()
    supervisor = WorkerSupervisor([sys.executable, "-c", "raise SystemExit(3)"], metrics, clock, stop_timeout=5)

    def restarts() -> float | None:
        return metrics.registry.get_sample_value("gpu_alert_bot_worker_restarts_total")

    await supervisor.start()
    try:
        await eventually(lambda: restarts() == 1 and clock.sleeping == 1, timeout=30)
        await clock.advance(0.5)  # the first restart comes after half a second
        await eventually(lambda: restarts() == 2 and clock.sleeping == 1, timeout=30)
        await clock.advance(0.5)
        assert (restarts(), clock.sleeping) == (2, 1)  # the second one only after a whole second
        await clock.advance(0.5)
        await eventually(lambda: restarts() == 3, timeout=30)
    finally:
        await supervisor.stop()
