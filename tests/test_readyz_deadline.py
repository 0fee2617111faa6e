"""/readyz answers within its own deadline (server.ready_timeout) whatever the store does: with the real
PostgreSQL stopped, its pool would wait store.connect_timeout (here 30 s) for a connection."""

from __future__ import annotations

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
