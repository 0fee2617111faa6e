"""Shared fixtures. Real Prometheus/Alertmanager come from tests/support/processes.py."""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings

from bot.store.sqlite import SqliteStore
from tests.fakes.slack import FakeSlack
from tests.support.cluster import StartPair, start_clustered_pair
from tests.support.postgres import PostgresServer
from tests.support.processes import Alertmanager, webhook_alertmanager_config
from tests.support.sshd import Sshd
from tests.support.store import Opener, postgres_store, slowed_stores, sqlite_store

if TYPE_CHECKING:
    from playwright.async_api import Browser

# CI must not fail on an example nobody has seen before: property tests replay the same examples
# unless HYPOTHESIS_PROFILE=explore asks for fresh ones (run it locally to hunt for new failures).
# Nor on a busy machine: an example's time is no property of the code under test (speed goals are bench/ figures),
# so neither the per-example deadline nor the too-slow health check applies.
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("deterministic", derandomize=True, print_blob=True, **_UNTIMED)
settings.register_profile("explore", derandomize=False, max_examples=1000, print_blob=True, **_UNTIMED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="delay every call into the store (both backends, in the test process) by this long",
    )


@pytest.fixture(autouse=True, scope="session")
def _store_delay(pytestconfig: pytest.Config) -> Iterator[None]:
    """`--store-delay=0.1`: the suite must not depend on how fast the store answers."""
    delay: float = pytestconfig.getoption("--store-delay")
    if not delay:
        yield
        return
    with slowed_stores(delay):
        yield


@pytest.fixture
def store_delay(pytestconfig: pytest.Config) -> float:
    """How long each store call is delayed in this run (`--store-delay`), for the few tests whose deadline is a
    volume of work: the time that work takes grows with it."""
    delay: float = pytestconfig.getoption("--store-delay")
    return delay


@pytest.fixture
def alertmanager_factory(tmp_path: Path) -> Iterator[object]:
    """Start real Alertmanagers that deliver to a given bot URL; all are stopped after the test."""
    started: list[Alertmanager] = []

    def start(bot_url: str, **options: object) -> Alertmanager:
        am = Alertmanager(tmp_path / f"am{len(started)}", webhook_alertmanager_config(bot_url, **options))  # type: ignore[arg-type]
        started.append(am)
        return am

    yield start
    for am in started:
        am.stop()


@pytest.fixture
def clustered_pair(tmp_path: Path) -> Iterator[StartPair]:
    """Start clustered pairs of real Alertmanagers (tests/support/cluster.py); all are stopped after the test."""
    started: list[Alertmanager] = []

    def start(config: dict[str, Any], *, peer_timeout: str | None = None) -> list[Alertmanager]:
        pair = start_clustered_pair(tmp_path / f"cluster{len(started) // 2}", config, peer_timeout=peer_timeout)
        started.extend(pair)
        return pair

    yield start
    for am in started:
        am.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL for the whole session; tests take a fresh database each (`postgres_dsn`)."""
    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """The store contract runs on both backends: opens the store under test (again and again, on the same
    data) with `async with opened(**options) as store`."""
    if request.param == "sqlite":
        return functools.partial(sqlite_store, tmp_path)
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return functools.partial(postgres_store, server.create_database())


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    """The loopback Slack fake (Web API, response_url, Socket Mode)."""
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    """A real SQLite store in the test's temporary directory (a module may define its own `store` instead)."""
    async with sqlite_store(tmp_path) as opened:
        yield opened


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """A real sshd on loopback with a forced command (tests/support/sshd.py)."""
    server = Sshd(tmp_path / "sshd")
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """Debian's chromium, headless, one for the session (tests/support/browser.py): its tests run in the session's
    event loop (`pytest.mark.asyncio(loop_scope="session")`)."""
    # Imported here: only the browser tests load playwright.
    from tests.support.browser import chromium

    async with chromium() as started:
        yield started
