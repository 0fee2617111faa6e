"""What only the PostgreSQL store does: several replicas on one database, schema versions, wake-ups.

Two PostgresStore objects on one database are two replicas as far as the database can tell: each has its own
connection pool, its own group commit and its own name.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import yaml

from bot.commands.cli import main
from bot.config import ConfigError, load_config
from bot.dedup import plan_events
from bot.models import EventKind
from bot.storage.interface import ActionRun, StoreUnavailable
from bot.store import open_store
from bot.store.migrations import POSTGRESQL_MIGRATIONS, POSTGRESQL_SCHEMA_VERSION, SchemaTooNew
from bot.store.postgresql import PostgresStore
from tests.support.clock import FakeClock
from tests.support.payloads import distinct_webhooks, gpu_alerts, webhook
from tests.support.processes import REPO, free_port
from tests.support.store import incoming, ingest, ingest_and_dedup, postgres_store, route_all


@asynccontextmanager
async def replicas(dsn: str, count: int = 2, clock: FakeClock | None = None) -> AsyncIterator[list[PostgresStore]]:
    """`count` replicas on one database; with `clock`, all on that clock (replicas keep their clocks in step)."""
    options = {} if clock is None else {"clock": clock}
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(postgres_store(dsn, replica=f"bot-{n}", **options)) for n in range(count)
        ]


async def test_copies_reaching_two_replicas_at_once_store_one_notification(postgres_dsn: str) -> None:
    payloads = list(distinct_webhooks(50, 2))
    async with replicas(postgres_dsn) as (a, b):
        results = await asyncio.gather(*(store.ingest(incoming(p)) for p in payloads for store in (a, b)))
        assert sum(not r.duplicate for r in results) == 50
        assert sum(r.duplicate for r in results) == 50
        assert (await a.stats()).notifications_pending == 50


async def test_notifications_are_applied_once_whichever_replicas_dedup(postgres_dsn: str) -> None:
    async with replicas(postgres_dsn) as (a, b):
        for payload in distinct_webhooks(20, 3):
            await ingest(a, payload)
        while (await a.stats()).notifications_pending:
            await asyncio.gather(a.dedup_pending(plan_events, 4), b.dedup_pending(plan_events, 4))
        assert (await b.stats()).events_pending == 60


async def test_an_event_claimed_by_one_replica_goes_to_another_when_its_lease_expires(postgres_dsn: str) -> None:
    clock = FakeClock()
    async with replicas(postgres_dsn, clock=clock) as (a, b):
        await ingest_and_dedup(a, webhook(gpu_alerts(4)))
        first, second = await asyncio.gather(a.claim_events(2, 30), b.claim_events(10, 30))
        assert len(first) + len(second) == 4
        assert not {e.id for e in first} & {e.id for e in second}
        await clock.advance(29)
        assert await b.claim_events(10, 60) == []
        await clock.advance(1)  # replica a "died" holding its leases
        taken_over = await b.claim_events(10, 60)
        assert sorted(e.id for e in taken_over) == sorted(e.id for e in first + second)
        assert {e.attempts for e in taken_over} == {2}


async def test_a_receiver_is_dispatched_by_one_replica_until_its_lease_expires(postgres_dsn: str) -> None:
    clock = FakeClock()
    async with replicas(postgres_dsn, clock=clock) as (a, b):
        assert await a.hold_receiver("slack", 30)
        assert not await b.hold_receiver("slack", 30)
        assert await b.hold_receiver("email", 30)  # one lease per receiver
        await clock.advance(20)
        assert await a.hold_receiver("slack", 30)  # renewed by its holder
        await clock.advance(20)
        assert await a.receiver_holders() == {"slack": "bot-0"}  # the email lease expired, the renewed one did not
        assert not await b.hold_receiver("slack", 30)
        await clock.advance(11)
        assert await b.hold_receiver("slack", 30)
        assert not await a.hold_receiver("slack", 30)
        await b.release_receiver("slack")
        assert await a.hold_receiver("slack", 30)


async def test_another_replica_is_woken_when_work_or_deliveries_are_stored(postgres_dsn: str) -> None:
    async with replicas(postgres_dsn) as (a, b):
        work, deliveries = asyncio.Event(), asyncio.Queue[str]()
        b.subscribe(work.set, deliveries.put_nowait)
        await asyncio.sleep(0)
        work.clear()
        async with asyncio.timeout(10):
            while not work.is_set():  # the listen connection may still be starting: resend until heard
                await ingest_and_dedup(a, webhook(gpu_alerts(1)))
                await asyncio.sleep(0.05)
        await route_all(a, ["slack"])
        async with asyncio.timeout(10):
            assert await deliveries.get() == "slack"


async def test_the_schema_is_created_once_and_a_newer_one_is_refused(postgres_dsn: str) -> None:
    async with replicas(postgres_dsn, 3) as stores:
        assert await stores[0].migrate() == POSTGRESQL_SCHEMA_VERSION
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        versions = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert versions == [(version,) for version, _ in POSTGRESQL_MIGRATIONS]  # each applied once
        conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (POSTGRESQL_SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew, match="newer than this gpu-alert-bot knows"):
        async with postgres_store(postgres_dsn):
            pass


async def test_an_unreachable_database_is_unavailable(postgres_dsn: str) -> None:
    dsn = f"host=127.0.0.1 port={free_port()} user=postgres dbname=none"
    with pytest.raises(StoreUnavailable, match="cannot connect"):
        async with postgres_store(dsn, connect_timeout=1.0):
            pass


def test_the_postgresql_backend_takes_its_dsn_from_a_file(tmp_path: Path) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"backend": "postgresql"}}))
    with pytest.raises(ConfigError, match=r"store: .*needs dsn_file"):
        load_config(config)
    (tmp_path / "dsn").write_text("host=db user=bot password=s3cret-pw dbname=bot\n")
    config.write_text(yaml.safe_dump({"store": {"backend": "postgresql", "dsn_file": "dsn", "replica": "bot-a"}}))
    store = load_config(config).store
    assert store.dsn_file is not None and store.dsn_file.get() == "host=db user=bot password=s3cret-pw dbname=bot"
    assert "s3cret-pw" in list(load_config(config).secrets())  # so the logs mask it
    assert load_config(None).store.backend == "sqlite"


async def test_open_store_opens_the_configured_backend(tmp_path: Path, postgres_dsn: str) -> None:
    (tmp_path / "dsn").write_text(postgres_dsn)
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"backend": "postgresql", "dsn_file": "dsn", "replica": "bot-a"}}))
    store = await open_store(load_config(config).store)
    try:
        assert isinstance(store, PostgresStore) and store.replica == "bot-a"
        await store.check_writable()
    finally:
        await store.close()


def test_the_shipped_ha_compose_runs_two_named_replicas_on_one_database_with_file_secrets(
    tmp_path: Path, postgres_dsn: str
) -> None:
    compose = yaml.safe_load((REPO / "config" / "docker-compose.ha.yml").read_text())
    bots = {name: s for name, s in compose["services"].items() if name.startswith("gpu-alert-bot")}
    assert len(bots) == 2 and len({s["hostname"] for s in bots.values()}) == 2  # the hostname names the replica
    for service in compose["services"].values():
        assert not any("PASSWORD=" in e or "DSN=" in e for e in service.get("environment", []))
    assert all(secret["file"].startswith("./secrets/") for secret in compose["secrets"].values())
    assert all("postgres_dsn" in s["secrets"] and "/readyz" in str(s["healthcheck"]) for s in bots.values())

    (tmp_path / "webhook_token").write_text("t0k3n\n")
    (tmp_path / "postgres_dsn").write_text(postgres_dsn)
    text = (REPO / "config" / "bot.ha.yaml").read_text().replace("/run/secrets", str(tmp_path))
    text = text.replace("/etc/gpu-alert-bot/playbooks", str(REPO / "playbooks"))
    (tmp_path / "bot.yaml").write_text(text)
    config = load_config(tmp_path / "bot.yaml", {"store.replica": "gpu-alert-bot-a"})
    assert (config.store.backend, config.store.replica) == ("postgresql", "gpu-alert-bot-a")
    assert main(["migrate", "--config", str(tmp_path / "bot.yaml")]) == 0


async def test_every_commit_waits_for_the_wal_flush_whatever_the_server_default(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        database = conn.info.dbname
        conn.execute(f"ALTER DATABASE {database} SET synchronous_commit = off".encode())
    async with postgres_store(postgres_dsn) as store:
        row = await store._fetchone("SHOW synchronous_commit")
        assert row is not None and row["synchronous_commit"] == "on"
        await ingest(store, webhook(gpu_alerts(1)))
        async with store._ingest_transaction() as conn:
            shown = await (await conn.execute("SHOW synchronous_commit")).fetchone()
            assert shown is not None and shown["synchronous_commit"] == "on"


async def test_a_reader_never_migrates_and_refuses_a_schema_it_does_not_know(postgres_dsn: str) -> None:
    with pytest.raises(StoreUnavailable, match="run gpu-alert-bot migrate"):
        async with postgres_store(postgres_dsn, read_only=True):
            pass
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('alerts')").fetchone() == (None,)
    async with postgres_store(postgres_dsn) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
    async with postgres_store(postgres_dsn, read_only=True) as reader:
        assert len(await reader.list_alerts()) == 2


async def test_replicas_racing_on_one_action_run_move_it_once(postgres_dsn: str) -> None:
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    requested = ActionRun(
        0, "restart-dcgm-exporter", "a@1", "gpu01", None, "cli:alice", False, False, "requested", at, at
    )
    async with replicas(postgres_dsn, 3) as stores:
        run = await stores[0].add_action_run(requested)
        moves = await asyncio.gather(
            *(
                store.transition_action_run(run.id, "requested", "running", at, detail=store.replica)
                for _ in range(5)
                for store in stores
            )
        )
        [winner] = [moved for moved in moves if moved is not None]
        assert await stores[1].get_action_run(run.id) == winner


async def test_replicas_writing_the_watchdog_timers_at_once_keep_the_latest(postgres_dsn: str) -> None:
    start = datetime(2026, 11, 30, 12, tzinfo=UTC)
    async with replicas(postgres_dsn, 3) as stores:
        await asyncio.gather(
            *(
                store.watchdog_seen(["any", f"http://am-{n % 2}:9093"], start + timedelta(seconds=n))
                for n in range(30)
                for store in stores
            )
        )
        await stores[0].watchdog_start("any", start - timedelta(hours=1))  # a starting replica keeps the timer
        records = {r.replica: r.last_seen for r in await stores[2].watchdog_records()}
        assert records == {
            "any": start + timedelta(seconds=29),
            "http://am-0:9093": start + timedelta(seconds=28),
            "http://am-1:9093": start + timedelta(seconds=29),
        }


async def test_a_database_of_the_first_schemas_gets_silences_timers_and_runs_on_open(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for version, statements in POSTGRESQL_MIGRATIONS[:2]:
            conn.execute(statements.encode())
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
    async with replicas(postgres_dsn, 1) as [old]:
        # Opening migrated it; an alert stored by the older version reads with no silence.
        with psycopg.connect(postgres_dsn) as conn:
            assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (POSTGRESQL_SCHEMA_VERSION,)
        await ingest_and_dedup(old, webhook(gpu_alerts(1)))
        [alert] = await old.list_alerts()
        assert (alert.silence_id, alert.silenced_by, alert.silenced_until) == (None, None, None)
        assert await old.watchdog_records() == []
        assert await old.get_breaker() is None


async def test_replicas_taking_the_same_ack_at_once_record_it_once(postgres_dsn: str) -> None:
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    async with replicas(postgres_dsn, 3) as stores:
        await ingest_and_dedup(stores[0], webhook(gpu_alerts(1)))
        [alert] = await stores[0].list_alerts()
        acked = await asyncio.gather(*(store.ack(alert.key, store.replica, at) for _ in range(4) for store in stores))
        assert sum(acked) == 1
        kinds = [e.kind for e in await stores[1].alert_events(alert.key)]
        assert kinds == [EventKind.FIRING, EventKind.ACK]
