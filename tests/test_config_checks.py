"""What `check-config` refuses before the bot would misbehave: keys written twice, URLs that are not http(s)
URLs with a host, a zero ingest timeout, a file that is not UTF-8."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from bot.commands.cli import main
from bot.config import ConfigError, http_url, load_config, located
from bot.playbooks import PlaybookError, PlaybookSet
from bot.yamldoc import duplicate_keys

PAGERDUTY_KEY = "0123456789abcdef0123456789abcdef"


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as error:
        load_config(path)
    return error.value.problems


def _config_with(tmp_path: Path, section: dict[str, Any]) -> Path:
    (tmp_path / "token").write_text("xoxb-token\n")
    (tmp_path / "pd_key").write_text(PAGERDUTY_KEY)
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(section))
    return path


def test_a_key_written_twice_is_an_error_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bot.yaml"
    path.write_text(
        "routing:\n"
        "  default: [console]\n"
        "server:\n"
        "  listen: 127.0.0.1:9095\n"
        "  listen: 127.0.0.1:9096\n"
        "routing:\n"
        "  default: []\n"
    )
    assert _problems(path) == [
        f"{path}:5: server.listen: duplicate key 'listen'; YAML would keep only the last one",
        f"{path}:6: routing: duplicate key 'routing'; YAML would keep only the last one",
    ]


def test_duplicate_keys_come_with_the_other_problems(tmp_path: Path) -> None:
    path = tmp_path / "bot.yaml"
    path.write_text("store:\n  retention: forever\n  retention: 30d\n")
    problems = _problems(path)
    assert problems[0] == f"{path}:3: store.retention: duplicate key 'retention'; YAML would keep only the last one"
    assert problems[1:] == []  # the last value, 30d, is valid


BAD_URLS = [
    (" http://loki:3100", None),
    ("not-a-url", "relative URL without a base"),
    ("ftp://files.example.com/", "URL scheme should be 'http' or 'https'"),
    ("loki:3100", "URL scheme should be 'http' or 'https'"),
    ("http://", "empty host"),
]


def _url_sections(url: str) -> dict[str, dict[str, Any]]:
    """Each URL key of the configuration, in a configuration of its own, set to `url`."""
    slack = {"type": "slack", "name": "slack", "channel": "#gpu", "token_file": "token", "api_url": url}
    pagerduty = {"type": "pagerduty", "name": "pd", "routing_key_file": "pd_key"}
    return {
        "enrichment.loki.url": {"enrichment": {"loki": {"url": url}}},
        "enrichment.prometheus.url": {"enrichment": {"prometheus": {"url": url}}},
        "receivers.0.api_url": {"receivers": [slack], "routing": {"default": ["slack"]}},
        "receivers.0.url": {"receivers": [{**pagerduty, "url": url}], "routing": {"default": ["pd"]}},
        "receivers.0.client_url": {
            "receivers": [{**pagerduty, "client_url": url}],
            "routing": {"default": ["pd"]},
        },
    }


@pytest.mark.parametrize(("url", "reason"), BAD_URLS)
@pytest.mark.parametrize("key", list(_url_sections("")))
def test_every_url_key_needs_an_http_url_with_a_host(tmp_path: Path, key: str, url: str, reason: str | None) -> None:
    problems = _problems(_config_with(tmp_path, _url_sections(url)[key]))
    if reason is None:
        assert problems == [f"{key}: {url!r} is not a URL: it contains spaces or control characters"]
    else:
        assert problems == [f"{key}: {url!r} is not an http:// or https:// URL with a host ({reason})"]


@pytest.mark.parametrize("key", list(_url_sections("")))
def test_http_and_https_urls_are_kept_as_written(tmp_path: Path, key: str) -> None:
    url = "http://[::1]:3100/base"
    config = load_config(_config_with(tmp_path, _url_sections(url)[key]))
    assert url in config.model_dump_json(by_alias=True)


@given(st.text(max_size=40))
def test_the_url_check_accepts_only_http_urls_with_a_host_and_never_crashes(text: str) -> None:
    try:
        accepted = http_url(text)
    except ValueError:
        return
    parts = urllib.parse.urlsplit(accepted)
    assert accepted == text
    assert parts.scheme.lower() in ("http", "https")
    assert parts.hostname


@pytest.mark.parametrize("timeout", [0, "0s"])
def test_a_zero_ingest_timeout_is_refused(tmp_path: Path, timeout: Any) -> None:
    problems = _problems(_config_with(tmp_path, {"server": {"ingest_timeout": timeout}}))
    assert problems == ["server.ingest_timeout: must be above 0"]


def test_a_configuration_that_is_not_utf8_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bot.yaml"
    path.write_bytes(b"server:\n  listen: 127.0.0.1:9095\n# r\xe9seau du labo\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{path}:3: not UTF-8 text (byte 0xe9); save the file as UTF-8",
        f"{path}: 1 problem(s)",
    ]


def test_a_playbook_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "Latin1.yaml").write_bytes(b"match: {alertname: Latin1}\ntitle: temp\xe9rature\n")
    with pytest.raises(PlaybookError) as error:
        PlaybookSet.load(tmp_path)
    assert error.value.problems == [f"{tmp_path / 'Latin1.yaml'}:2: not UTF-8 text (byte 0xe9); save the file as UTF-8"]


_KEYS = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
_TREES = st.recursive(
    st.integers() | st.text(max_size=5),
    lambda children: st.dictionaries(_KEYS, children, max_size=4) | st.lists(children, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(_KEYS, _TREES, min_size=1, max_size=5))
def test_duplicate_keys_are_found_exactly_where_a_key_is_written_again(mapping: dict[str, Any]) -> None:
    text = yaml.safe_dump(mapping, sort_keys=False)
    assert list(duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader))) == []
    first = next(iter(mapping))
    again = text + yaml.safe_dump({first: mapping[first]})
    line = text.count("\n") + 1
    found = list(duplicate_keys(yaml.compose(again, Loader=yaml.SafeLoader)))
    assert found == [(line, (first,), f"duplicate key {first!r}")]


def test_unknown_keys_and_wrong_types_name_the_key_and_the_line_in_plain_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bot.yaml"
    path.write_text(
        "server:\n"
        "  max_body_bytes: lots\n"
        "worker:\n"
        "  concurency: 3\n"
        "  batch_size: 2.5\n"
        "receivers:\n"
        "  - name: c\n"
        "    type: consol\n"
        "  - name: s\n"
        "    type: slack\n"
        "    channel: 5\n"
        "    token_fil: token\n"
        "logging:\n"
        "  level: loud\n"
        "routing:\n"
        "  default: c\n"
        "deadman: yes\n"
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{path}:2: server.max_body_bytes: expected a whole number, not 'lots'",
        f"{path}:5: worker.batch_size: expected a whole number, not the number 2.5",
        f"{path}:4: worker.concurency: unknown key (check the spelling against config/bot.example.yaml)",
        f"{path}:14: logging.level: expected 'debug', 'info', 'warning' or 'error', not 'loud'",
        f"{path}:8: receivers.0.type: 'consol' is not a type the bot knows: one of console, slack, email, pagerduty",
        f"{path}:11: receivers.1.channel: expected text (put it in quotes), not the number 5",
        f"{path}:9: receivers.1.token_file: missing: this key is required",
        f"{path}:12: receivers.1.token_fil: unknown key (check the spelling against config/bot.example.yaml)",
        f"{path}:16: routing.default: expected a list ([a, b], or one '- item' line each), not 'c'",
        f"{path}:17: deadman: expected a mapping of keys, not the boolean true",
        f"{path}: 10 problem(s)",
    ]
    assert not any("Input" in line for line in err)


@pytest.mark.parametrize(
    ("token", "kind"),
    [("xoxp-1-2-3-abc", "a Slack user token (xoxp-...)"), ("xapp-1-A0-1-abc", "an app-level token (xapp-...)")],
)
def test_check_config_refuses_a_slack_token_that_is_not_a_bots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], token: str, kind: str
) -> None:
    (tmp_path / "token").write_text(token + "\n")
    path = tmp_path / "bot.yaml"
    path.write_text(
        "receivers:\n"
        "  - {name: console, type: console}\n"
        "  - name: slack\n"
        "    type: slack\n"
        "    channel: '#gpu'\n"
        "    token_file: token\n"
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:6: receivers.1.token_file: {tmp_path / 'token'} holds {kind}")
    assert "bot token (xoxb-..." in err and token not in err


def test_a_missing_playbook_directory_is_a_problem_with_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bot.yaml"
    path.write_text("store:\n  retention: 30d\nplaybooks:\n  dir: ./my-playbooks\n")
    problems = [located(problem) for problem in _problems(path)]
    assert problems == [f"{path}:4: playbooks.dir: playbook directory {tmp_path / 'my-playbooks'} not found"]
