"""The WAL index file (`-shm`) made unwritable or truncated under a running `serve`: 503 and a log line, no
SIGBUS.

SQLite maps `-shm` into memory; touching that mapping once the file is immutable (after the kernel wrote its
pages back) or shorter than the mapping kills the process with SIGBUS, exit 135, nothing logged. `os.sync()`
forces the write-back that otherwise comes within seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.payloads import body, gpu_alerts, webhook
from tests.support.processes import BotProcess


@contextmanager
def serving(tmp_path: Path) -> Iterator[BotProcess]:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "bot.db")}}))
    bot = BotProcess(config)
    try:
        yield bot
    finally:
        bot.stop()


def post(bot: BotProcess, n: int) -> httpx.Response:
    payload = body(webhook(gpu_alerts(3, host=f"k-ai-{n:02d}"), group_key=f"g{n}"))
    return httpx.post(f"{bot.url}/alertmanager", content=payload, headers={"Content-Type": "application/json"})


def settle(bot: BotProcess, lines: int) -> None:
    """Wait until the webhooks so far are delivered and recorded: a change of `-shm` that lands while SQLite is
    inside one store call is the one case the check before each call cannot see."""
    deadline = time.monotonic() + 20
    while len(bot.stdout.snapshot()) < lines or httpx.get(f"{bot.url}/readyz").status_code != 200:
        assert time.monotonic() < deadline, "the bot did not deliver its first webhook"
        time.sleep(0.05)


def chattr(flag: str, path: Path) -> None:
    if subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr is not available on this filesystem (or not as this user)")


def error_lines(bot: BotProcess) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in bot.stderr.snapshot() if line.startswith("{")]
    return [line for line in lines if line["level"] in ("warning", "error")]


def wait_for_log(bot: BotProcess, reason: str) -> None:
    """The log line is read from the bot's stderr by a thread: it may come a moment after the answer."""
    deadline = time.monotonic() + 20
    while not any(reason in str(line.get("reason")) for line in error_lines(bot)):
        assert time.monotonic() < deadline, f"no log line with {reason!r}"
        time.sleep(0.05)


def test_an_immutable_shm_file_gives_503s_and_the_bot_recovers_when_it_is_writable_again(tmp_path: Path) -> None:
    shm = tmp_path / "bot.db-shm"
    with serving(tmp_path) as bot:
        assert post(bot, 1).status_code == 200
        settle(bot, 3)
        chattr("+i", shm)
        try:
            os.sync()
            refused = post(bot, 2)
            assert refused.status_code == 503
            assert bot.process.poll() is None  # alive, not killed by SIGBUS
            not_ready = httpx.get(f"{bot.url}/readyz")
            assert not_ready.status_code == 503
            assert "bot.db-shm is not writable" in not_ready.json()["checks"]["store"]
            wait_for_log(bot, "bot.db-shm is not writable")
        finally:
            chattr("-i", shm)
        assert post(bot, 3).status_code == 200
        assert httpx.get(f"{bot.url}/readyz").status_code == 200


@pytest.mark.parametrize("database", ["bot.db", "bot.db-inbox"])
def test_a_truncated_shm_file_gives_503s_and_says_to_restart(tmp_path: Path, database: str) -> None:
    shm = tmp_path / f"{database}-shm"
    with serving(tmp_path) as bot:
        assert post(bot, 1).status_code == 200
        settle(bot, 3)
        os.truncate(shm, 0)
        assert post(bot, 2).status_code == 503
        assert bot.process.poll() is None
        not_ready = httpx.get(f"{bot.url}/readyz").json()["checks"]["store"]
        assert f"{database}-shm shrank" in not_ready and "restart the bot" in not_ready
    assert bot.process.returncode == 0  # even its stop is clean
    with serving(tmp_path) as restarted:
        assert post(restarted, 3).status_code == 200
