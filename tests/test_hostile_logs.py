"""Floods of identical failures log one line a minute, with the count of those left out: a client retrying
a refused request, a store that cannot write (each 503), a full file table (each failed accept)."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from bot.config import ServerConfig
from bot.logs import RateLimitedLog
from bot.server import GuardedSite, install_accept_error_log
from tests.support.bot import running_bot
from tests.support.payloads import body, gpu_alerts, webhook
from tests.support.processes import free_port
from tests.support.store import refuse_writes


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_key_per_interval_then_the_count_of_those_left_out(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    logger = logging.getLogger("test.ratelimit")
    limited = RateLimitedLog(logger, interval=60, clock=clock)
    caplog.set_level(logging.INFO, logger="test.ratelimit")
    logged = [limited.log(logging.ERROR, "disk", "cannot write", path="/var") for _ in range(1000)]
    assert logged.count(True) == 1
    assert limited.log(logging.ERROR, "other", "another failure")  # each key has its own budget
    clock.now += 59.9
    assert not limited.log(logging.ERROR, "disk", "cannot write")
    clock.now += 0.1
    assert limited.log(logging.ERROR, "disk", "cannot write")
    disk = [r for r in caplog.records if r.getMessage() == "cannot write"]
    assert [r.__dict__["suppressed"] for r in disk] == [0, 1000]
    assert disk[0].__dict__["path"] == "/var"


async def test_failed_accepts_log_one_line_a_minute_and_other_loop_errors_keep_their_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.INFO)
    install_accept_error_log(loop, RateLimitedLog(logging.getLogger("bot.server"), clock=FakeClock()))
    try:
        for _ in range(500):
            loop.call_exception_handler(
                {
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(errno.EMFILE, "Too many open files"),
                }
            )
        loop.call_exception_handler({"message": "something else broke", "exception": RuntimeError("boom")})
    finally:
        loop.set_exception_handler(None)
    accept = [r for r in caplog.records if r.name == "bot.server"]
    assert len(accept) == 1
    assert accept[0].getMessage() == "cannot accept connections: Too many open files"
    assert accept[0].__dict__["errno"] == "EMFILE"
    assert not accept[0].exc_info
    assert any(r.name == "asyncio" and "something else broke" in r.getMessage() for r in caplog.records)


async def test_a_store_that_cannot_write_logs_one_error_for_many_503s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="bot.ingest")
    async with running_bot(tmp_path) as bot, httpx.AsyncClient(timeout=10) as client:
        await refuse_writes(bot.runtime.store, "query_only = 1")  # type: ignore[arg-type]
        for n in range(20):
            payload = body(webhook(gpu_alerts(2, host=f"h{n}")))
            refused = await client.post(bot.webhook_url, content=payload, headers={"Content-Type": "application/json"})
            assert refused.status_code == 503
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "store_unavailable"}) >= 20
    errors = [r for r in caplog.records if r.getMessage().startswith("cannot store the notification")]
    assert len(errors) == 1
    assert "readonly" in errors[0].__dict__["reason"]


async def test_an_exception_no_middleware_caught_is_a_json_500_logged_without_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bot's own middleware turns handler exceptions into JSON; below it, aiohttp's last resort must too."""

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError(f"failed on {request.headers['Authorization']}")

    app = web.Application()
    app.router.add_get("/broken", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    caplog.set_level(logging.DEBUG)
    try:
        await GuardedSite(runner, "127.0.0.1", port, ServerConfig()).start()
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{port}/broken", headers={"Authorization": "Bearer s3cr3t"})
    finally:
        await runner.cleanup()
    assert answer.status_code == 500
    assert answer.json()["error"] == "internal_error"
    assert [r.getMessage() for r in caplog.records if r.name == "bot.server"] == [
        "HTTP request failed: internal_error (HTTP 500)"
    ]
    assert not any("s3cr3t" in r.getMessage() or r.exc_info for r in caplog.records)
