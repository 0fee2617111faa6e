"""Slack roles, checked evenly: a role that is not configured grants nothing, whichever it is (viewer, responder,
admin), and `check-config` and `serve` say what that locks; a role that `permissions` names must be configured,
and so must each permission name it uses.
Real config files, the CLI, a real `serve` process, and signed commands into the running bot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.commands.cli import main
from tests.fakes.slack import FakeSlack
from tests.support.bot import running_bot, write_config
from tests.support.processes import BotProcess
from tests.support.slack_requests import RESPONDER, VIEWER, interactive_config, post_command


def without_role(config: dict[str, Any], name: str) -> dict[str, Any]:
    section = config["interactivity"]
    section["roles"] = [role for role in section["roles"] if role["name"] != name]
    return config


def with_remediation(config: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    for name in ("ssh_key", "known_hosts"):
        (tmp_path / name).write_text("not read by check-config\n")
        (tmp_path / name).chmod(0o600)
    ssh = {"address": "127.0.0.1", "user": "gpu-actions"}
    ssh |= {"key_file": str(tmp_path / "ssh_key"), "known_hosts": str(tmp_path / "known_hosts")}
    config["remediation"] = {"hosts": {"k-ai-01": {"ssh": ssh}}}
    return config


@pytest.mark.parametrize(
    ("missing", "locked"),
    [("viewer", "list, silences, status"), ("admin", "run-dangerous, approve-dangerous, reset-breaker")],
)
def test_check_config_accepts_a_missing_role_and_says_what_it_locks(
    tmp_path: Path, slack: FakeSlack, capsys: pytest.CaptureFixture[str], missing: str, locked: str
) -> None:
    config = with_remediation(interactive_config(tmp_path, slack, ["http://127.0.0.1:9"]), tmp_path)
    config["interactivity"]["roles"].append({"name": "admin", "users": ["U0ADMIN001"]})
    path = write_config(tmp_path, without_role(config, missing))
    assert main(["check-config", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"warning: interactivity.roles: no '{missing}' role is configured" in err
    assert f"so nobody may use {locked} from Slack: a role that is not configured grants nothing" in err


def test_a_role_the_permissions_name_must_be_configured_whichever_it_is(
    tmp_path: Path, slack: FakeSlack, capsys: pytest.CaptureFixture[str]
) -> None:
    for role in ("viewer", "admin"):
        config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"], permissions={"status": role})
        path = write_config(tmp_path, without_role(config, "viewer"))
        assert main(["check-config", str(path)]) == 2
        assert f"permissions.status: '{role}' is not a configured role (roles: responder)" in capsys.readouterr().err


def test_an_unknown_permission_name_is_refused_naming_the_valid_ones(
    tmp_path: Path, slack: FakeSlack, capsys: pytest.CaptureFixture[str]
) -> None:
    # `silense: admin` would leave `silence` to its default role (responder) while the file looks tightened.
    config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"], permissions={"silense": "responder"})
    path = write_config(tmp_path, config)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "permissions.silense: not a permission (did you mean 'silence'? permissions: ack, approve, " in err
    assert "run-dangerous, silence, silences, status, unack, unsilence)" in err
    config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"], permissions={"silence": "responder"})
    assert main(["check-config", str(write_config(tmp_path, config))]) == 0


async def test_serve_runs_without_a_viewer_role_and_a_refusal_says_why(tmp_path: Path, slack: FakeSlack) -> None:
    config = without_role(interactive_config(tmp_path, slack, ["http://127.0.0.1:9"]), "viewer")
    async with running_bot(tmp_path, config) as bot:
        answer = await post_command(bot.url, "list", user=VIEWER)
        assert answer == (
            "Sorry, `list` needs the viewer role, and no viewer role is configured: nobody may use it "
            "(see interactivity.roles)."
        )
        assert (await post_command(bot.url, "ack nope", user=RESPONDER)).startswith("Unknown alert id")


def test_serve_logs_what_a_missing_role_locks(tmp_path: Path, slack: FakeSlack) -> None:
    config = without_role(interactive_config(tmp_path, slack, ["http://127.0.0.1:9"]), "viewer")
    config["store"] = {"path": str(tmp_path / "bot.db")}
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump(config))
    bot = BotProcess(tmp_path / "bot.yaml")
    try:
        logged = "\n".join(bot.stderr.snapshot())
    finally:
        assert bot.stop() == 0
    assert "interactivity.roles: no 'viewer' role is configured" in logged
    assert "nobody may use list, silences, status from Slack" in logged
