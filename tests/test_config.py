"""The YAML configuration: validation with key paths, durations, secrets from files, paths relative to the file."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from bot.config import BotConfig, ConfigError, Secret, load_config, parse_duration

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "bot.example.yaml"


def _write(tmp_path: Path, data: Any, name: str = "bot.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _problems(tmp_path: Path, data: Any) -> list[str]:
    with pytest.raises(ConfigError) as error:
        load_config(_write(tmp_path, data))
    return error.value.problems


def test_the_example_configuration_loads_as_it_is() -> None:
    config = load_config(EXAMPLE)
    assert config.server.listen == "127.0.0.1:9095"
    assert not config.server.auth.enabled
    assert config.server.max_body_bytes > 1024 * 1024
    assert [r.type for r in config.receivers] == ["console"]
    assert config.store.synchronous == "full"


def test_the_store_scripts_run_keeps_is_the_one_commands_read_in_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/run serves the example configuration from the checkout's root; `gpus`, `audit` and `report` run
    there without --config read the default store of the working directory: the same file."""
    monkeypatch.chdir(REPO)
    assert load_config(EXAMPLE).store.path == load_config(None).store.path.absolute()


def test_relative_paths_resolve_against_the_config_file_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config(EXAMPLE).store.path == REPO / "gpu-alert-bot.db"
    nested = tmp_path / "etc" / "bot"
    nested.mkdir(parents=True)
    (nested / "token").write_text("abcd1234\n")
    path = _write(nested, {"store": {"path": "data/bot.db"}, "server": {"auth": {"bearer_token_file": "token"}}})
    monkeypatch.chdir("/")
    config = load_config(path)
    assert config.store.path == nested / "data" / "bot.db"
    assert config.server.auth.bearer_token_file is not None
    assert config.server.auth.bearer_token_file.get() == "abcd1234"


def _model_keys(model: type[BaseModel]) -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        keys.add(field.alias or name)
        for nested in _models_in(field.annotation):
            keys |= _model_keys(nested)
    return keys


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (list, dict, typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def test_every_key_is_documented_in_the_example_file() -> None:
    text = EXAMPLE.read_text()
    undocumented = sorted(
        key for key in _model_keys(BotConfig) if not re.search(rf"^\s*#?\s*(- )?{re.escape(key)}:", text, re.M)
    )
    assert undocumented == [], f"add these keys to {EXAMPLE.name}: {undocumented}"


def test_each_problem_is_reported_with_its_key_path(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        {
            "server": {"listen": "nope", "max_body_bytes": 12, "auth": {"bearer_token_file": "/nonexistent/x"}},
            "store": {"dedup_window": "soon", "synchronus": "full"},
            "worker": {"concurrency": 0},
            "receivers": [{"name": "console", "type": "console"}, {"name": "s", "type": "slack", "channel": "#x"}],
        },
    )
    assert [p.split(":", 1)[0] for p in problems] == [
        "server.listen",
        "server.max_body_bytes",
        "server.auth.bearer_token_file",
        "store.dedup_window",
        "store.synchronus",
        "worker.concurrency",
        "receivers.1.token_file",
    ]
    assert "unknown key" in problems[4]
    assert "cannot read secret file /nonexistent/x" in problems[2]


def test_a_slack_receivers_storm_keys_point_at_incidents(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("xoxb-1")
    slack = {"name": "s", "type": "slack", "channel": "#x", "token_file": str(token), "storm_threshold": 5}
    [problem] = _problems(tmp_path, {"receivers": [slack], "routing": {"default": ["s"]}})
    assert problem.startswith("receivers.0: ") and "storm_threshold" in problem and "`incidents`" in problem


def test_references_to_receivers_are_checked_with_key_paths(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        {
            "receivers": [{"name": "console", "type": "console"}, {"name": "console", "type": "console"}],
            "routing": {"default": ["console", "nobody"], "rules": [{"matchers": [], "receivers": ["ghost"]}]},
        },
    )
    assert problems == [
        "receivers.1.name: 'console' is used by more than one receiver; names must be unique",
        "routing.default.1: 'nobody' is not a configured receiver (configured: console)",
        "routing.rules.0.receivers.0: 'ghost' is not a configured receiver (configured: console)",
    ]


def test_checks_across_sections_are_reported_with_the_key_errors(tmp_path: Path) -> None:
    """pydantic runs a model's own checks only once its fields are valid: the file's values stand in."""
    problems = _problems(
        tmp_path,
        {
            "server": {"listen": "nope", "auth": {"bearer_token_file": "/run/secrets/absent"}},
            "routing": {"default": ["console", "slack"], "rules": [{"matchers": ["bad matcher"], "receivers": ["x"]}]},
            "store": {"retention": "7d"},
        },
    )
    assert problems == [
        "server.listen: expected HOST:PORT, for example 127.0.0.1:9095 or 0.0.0.0:9095",
        "server.auth.bearer_token_file: cannot read secret file /run/secrets/absent: No such file or directory",
        "routing.rules.0.matchers.0: 'bad matcher' is not a matcher such as "
        'severity="critical" or alertname=~"GPU.*"',
        "routing.default.1: 'slack' is not a configured receiver (configured: console)",
        "routing.rules.0.receivers.0: 'x' is not a configured receiver (configured: console)",
        "store.retention: shorter than enrichment.recurrence_window; the GPU history that recurrence counts would "
        "be pruned before the window ends",
    ]


def test_a_receiver_with_a_bad_key_still_counts_as_configured(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        {
            "receivers": [
                {"name": "console", "type": "console"},
                {"name": "slack", "type": "slack", "channel": "#gpu", "token_file": "absent"},
                {"name": "console", "type": "console", "colour": "red"},
            ],
            "routing": {"default": ["slack", "pager"]},
        },
    )
    assert problems == [
        f"receivers.1.token_file: cannot read secret file {tmp_path / 'absent'}: No such file or directory",
        "receivers.2.colour: unknown key (check the spelling against config/bot.example.yaml)",
        "receivers.2.name: 'console' is used by more than one receiver; names must be unique",
        "routing.default.1: 'pager' is not a configured receiver (configured: console, slack)",
    ]


def test_what_cannot_be_told_from_broken_values_is_not_checked(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        {"receivers": {"console": "console"}, "routing": {"default": ["nobody"]}, "store": {"retention": "soon"}},
    )
    assert problems == [
        "store.retention: 'soon' is not a duration such as 30s, 15m or 2h",
        "receivers: expected a list ([a, b], or one '- item' line each), not a mapping",
    ]


def test_an_email_receivers_own_checks_come_with_its_key_errors(tmp_path: Path) -> None:
    mail = {"name": "mail", "type": "email", "to": ["nobody"], "from": "bot@example.com", "smarthost": "smtp:25"}
    problems = _problems(tmp_path, {"receivers": [{**mail, "security": "none", "username": "bot"}]})
    assert problems == [
        "receivers.0.to: 'nobody' is not an email address such as oncall@example.com",
        "receivers.0: security: none sends mail in clear text; set allow_plaintext: true to accept that",
        "receivers.0: username and password_file go together",
        "receivers.0: SMTP AUTH without TLS would send the password in clear text; use starttls or tls",
        "routing.default.0: 'console' is not a configured receiver (configured: mail)",
    ]
    valid = {**mail, "to": ["oncall@example.com"], "allow_plaintext": "yes"}
    assert _problems(tmp_path, {"receivers": [valid], "routing": {"default": ["mail"]}}) == [
        "receivers.0: allow_plaintext only applies to security: none; with starttls a server without TLS is refused"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server: [1, 2", "not valid YAML"),
        ("- just\n- a list\n", "the top level must be a mapping"),
    ],
)
def test_unreadable_files_are_one_clear_problem(tmp_path: Path, text: str, expected: str) -> None:
    problems = _problems(tmp_path, text)
    assert len(problems) == 1 and expected in problems[0]
    assert str(tmp_path / "bot.yaml") in problems[0]


def test_a_missing_file_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_empty_file_and_empty_sections_mean_defaults(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "")).server.listen == "127.0.0.1:9095"
    config = load_config(_write(tmp_path, "server:\n  auth:\n    # bearer_token_file: x\nstore:\n"))
    assert not config.server.auth.enabled


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("15m", 900),
        ("1h30m", 5400),
        ("30d", 2592000),
        ("2w", 1209600),
        (90, 90),
        (1.5, 1.5),
    ],
)
def test_durations(value: Any, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "soon", "10", "5 m", "-5s", "1h-5m", True, None, -1])
def test_bad_durations(value: Any) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize("listen", ["127.0.0.1:9095", "0.0.0.0:1", "[::1]:9095", "bot.internal:65535"])
def test_listen_addresses(tmp_path: Path, listen: str) -> None:
    assert load_config(_write(tmp_path, {"server": {"listen": listen}})).server.listen == listen


@pytest.mark.parametrize("listen", ["9095", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":9095", "::1:9095"])
def test_bad_listen_addresses(tmp_path: Path, listen: str) -> None:
    assert _problems(tmp_path, {"server": {"listen": listen}})[0].startswith("server.listen: expected HOST:PORT")


@pytest.mark.parametrize(
    ("listen", "got"),
    [
        (9095, "the number 9095: a port alone, with no host"),
        (None, "an empty value"),
        (["127.0.0.1:9095"], "a list"),
        (True, "true"),
    ],
)
def test_a_listen_value_that_is_not_text_gets_the_same_hint(tmp_path: Path, listen: Any, got: str) -> None:
    assert _problems(tmp_path, {"server": {"listen": listen}}) == [
        f"server.listen: expected HOST:PORT, for example 127.0.0.1:9095 or 0.0.0.0:9095 (got {got})"
    ]


def test_ipv6_listen_host_and_port(tmp_path: Path) -> None:
    server = load_config(_write(tmp_path, {"server": {"listen": "[::1]:9095"}})).server
    assert (server.host, server.port) == ("::1", 9095)


def test_overrides_from_the_command_line_win(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, {"server": {"listen": "127.0.0.1:1"}}), {"server.listen": "127.0.0.1:2"})
    assert config.server.port == 2


def test_secrets_are_read_from_files_and_never_shown(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("hunter2-secret\n")
    (tmp_path / "token").write_text("tok-123456")
    config = load_config(
        _write(
            tmp_path,
            {"server": {"auth": {"bearer_token_file": "token", "basic": {"username": "am", "password_file": "pw"}}}},
        )
    )
    assert sorted(config.secrets()) == ["hunter2-secret", "tok-123456"]
    secret = config.server.auth.bearer_token_file
    assert isinstance(secret, Secret)
    assert "tok-123456" not in repr(secret) and "tok-123456" not in repr(config)
    dumped = config.model_dump_json()
    assert "tok-123456" not in dumped and "hunter2-secret" not in dumped
    assert str(tmp_path / "token") in dumped


def test_an_empty_secret_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    problems = _problems(tmp_path, {"server": {"auth": {"bearer_token_file": "token"}}})
    assert problems == [f"server.auth.bearer_token_file: secret file {tmp_path / 'token'} is empty"]


def test_body_limit_default_is_well_above_aiohttps_one_mebibyte() -> None:
    assert BotConfig().server.max_body_bytes >= 16 * 1024 * 1024
