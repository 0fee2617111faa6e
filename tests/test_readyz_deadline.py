"""/readyz answers within its own deadline (server.ready_timeout) whatever the store does: with the real
PostgreSQL stopped, its pool would wait store.connect_timeout (here 30 s) for a connection; with it hung (its
processes stopped, the connections open), a cancelled query would wait for the server to take its cancel."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from tests.support.bot import running_bot
from tests.support.postgres import PostgresServer

READY_TIMEOUT = 0.25
# The bound of the test's wait: far above the deadline it sets, far below the pool's wait (and under the 2 s that
# each of the two store checks of an ingest process used to be given).
BOUND = 1.5


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.close()


def config(tmp_path: Path, dsn: str) -> dict[str, Any]:
    dsn_file = tmp_path / "postgres_dsn"
    dsn_file.write_text(dsn + "\n")
    store = {"backend": "postgresql", "dsn_file": str(dsn_file), "replica": "a", "connect_timeout": "30s"}
    return {"store": store, "server": {"ready_timeout": f"{READY_TIMEOUT}s"}, "deadman": {"enabled": False}}


@pytest.mark.parametrize("side", ["all", "ingest"])
async def test_readyz_says_503_within_its_deadline_while_postgresql_is_down(
    tmp_path: Path, own_postgres: PostgresServer, side: Literal["all", "ingest"]
) -> None:
    async with running_bot(tmp_path, config(tmp_path, own_postgres.create_database()), side=side) as bot:
        own_postgres.stop("immediate")
        async with httpx.AsyncClient(timeout=BOUND) as client:
            answer = await client.get(f"{bot.url}/readyz")
        assert answer.status_code == 503
        checks = answer.json()["checks"]
        # The deadline the test set is the one that ended the wait, for each check that needed the store.
        assert checks["store"] == f"not writable: no answer within {READY_TIMEOUT:g} s (server.ready_timeout)"
        if side == "ingest":
            assert checks["worker"] == f"unknown: the store did not answer within {READY_TIMEOUT:g} s"


def postgres_processes(server: PostgresServer) -> list[int]:
    """The postmaster and every process it started (the backends holding the bot's connections)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *map(int, children)]


@pytest.mark.parametrize("side", ["all", "ingest"])
async def test_readyz_says_503_within_its_deadline_while_postgresql_hangs(
    tmp_path: Path, own_postgres: PostgresServer, side: Literal["all", "ingest"]
) -> None:
    dsn = own_postgres.create_database()
    async with (
        running_bot(tmp_path, config(tmp_path, dsn), side=side) as bot,
        httpx.AsyncClient(timeout=BOUND) as client,
    ):
        assert (await client.get(f"{bot.url}/readyz")).json()["checks"]["store"] == "writable"
        hung = postgres_processes(own_postgres)
        for pid in hung:
            os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(2):  # a check still waiting from the first answer does not hold up the second
                answer = await client.get(f"{bot.url}/readyz")
                assert answer.status_code == 503
                checks = answer.json()["checks"]
                assert checks["store"] == f"not writable: no answer within {READY_TIMEOUT:g} s (server.ready_timeout)"
        finally:
            for pid in hung:
                os.kill(pid, signal.SIGCONT)
