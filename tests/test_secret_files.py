"""Secret files: read again when they change (a rotated token needs no restart), and a warning when every user
of the host can read one."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import yaml

from bot.commands.cli import main
from bot.config import Secret, load_config
from bot.config.secrets import bot_only_advice
from bot.enrich.loki import LokiEnricher
from bot.logs import JsonFormatter
from tests.fakes.loki import FakeLoki
from tests.support.bot import running_bot
from tests.support.processes import BotProcess
from tests.test_auth import _post
from tests.test_loki import SYSLOG, XID, T, config, enrich, make_alert

OLD = "old-token-0123456789"
NEW = "new-token-rotated-abcdef"


def rotate(path: Path, content: str) -> None:
    """How secrets are rotated: a new file moved into place (Kubernetes swaps a link the same way)."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(content + "\n")
    os.replace(fresh, path)


def _secret(tmp_path: Path) -> tuple[Path, Secret]:
    path = tmp_path / "token"
    path.write_text(OLD + "\n")
    return path, Secret.read(path)


def test_a_rotated_secret_file_is_read_again(tmp_path: Path) -> None:
    path, secret = _secret(tmp_path)
    assert secret.get() == OLD
    rotate(path, NEW)
    assert secret.get() == NEW


@pytest.mark.parametrize("change", ["emptied", "removed"])
def test_a_secret_file_caught_mid_rotation_keeps_the_last_good_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    path, secret = _secret(tmp_path)
    if change == "emptied":
        path.write_text("")
    else:
        path.unlink()
    with caplog.at_level(logging.WARNING, logger="bot.config"):
        assert secret.get() == OLD
        assert secret.get() == OLD
    warnings = [r for r in caplog.records if r.getMessage().startswith("secret file changed and cannot be used")]
    assert len(warnings) == 1  # once per change, not at every use
    assert OLD not in caplog.text
    rotate(path, NEW)
    assert secret.get() == NEW


async def test_the_webhook_accepts_a_rotated_token_without_a_restart(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(OLD)
    async with running_bot(tmp_path, {"server": {"auth": {"bearer_token_file": "token"}}}) as bot:
        assert (await _post(bot.webhook_url, f"Bearer {OLD}")).status_code == 200
        rotate(tmp_path / "token", NEW)
        assert (await _post(bot.webhook_url, f"Bearer {OLD}")).status_code == 401
        assert (await _post(bot.webhook_url, f"Bearer {NEW}")).status_code == 200


async def test_loki_gets_the_rotated_token_from_the_next_query(tmp_path: Path) -> None:
    token = tmp_path / "loki_token"
    token.write_text(OLD)
    async with FakeLoki(auth_enabled=True) as loki:
        loki.push(SYSLOG, XID, T, tenant="team-a")
        settings = config(loki, tenant_id="team-a", bearer_token_file=str(token), cache_ttl="0s")
        enricher = LokiEnricher(settings, timeout=2)
        try:
            await enrich(enricher, make_alert())
            rotate(token, NEW)
            await enrich(enricher, make_alert())
        finally:
            await enricher.close()
    assert [query.authorization for query in loki.range_queries] == [f"Bearer {OLD}", f"Bearer {NEW}"]


def test_the_logs_mask_a_rotated_secret(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(OLD)
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"server": {"auth": {"bearer_token_file": "token"}}}))
    formatter = JsonFormatter(load_config(path).secrets)
    rotate(tmp_path / "token", NEW)
    record = logging.LogRecord("bot", logging.INFO, __file__, 1, "got %s", (NEW,), None)
    assert json.loads(formatter.format(record))["msg"] == "got ***"


def _config_with_token(tmp_path: Path, mode: int) -> Path:
    token = tmp_path / "token"
    token.write_text(OLD)
    token.chmod(mode)
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"server": {"auth": {"bearer_token_file": "token"}}, "store": {"path": "bot.db"}}))
    return path


def test_check_config_warns_about_a_secret_file_everyone_can_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config_with_token(tmp_path, 0o644)
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"{path}: OK"
    assert err.splitlines() == [
        f"warning: {tmp_path / 'token'}: secret file readable by every user of this host; {bot_only_advice()}"
    ]


def test_a_secret_file_only_its_owner_and_group_read_gets_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config_with_token(tmp_path, 0o640)
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_serve_warns_at_start_about_a_secret_file_everyone_can_read(tmp_path: Path) -> None:
    bot = BotProcess(_config_with_token(tmp_path, 0o604))
    bot.stop()
    logged = [json.loads(line) for line in bot.stderr.snapshot() if line.startswith("{")]
    warnings = [entry["msg"] for entry in logged if entry["level"] == "warning"]
    assert f"{tmp_path / 'token'}: secret file readable by every user of this host; {bot_only_advice()}" in warnings
