"""Routing rules: Alertmanager's matcher syntax and semantics, ordered rules, `continue`, the default."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from bot.config import RoutingConfig
from bot.routing import LabelMatcher, Router, parse_matcher

RULES: list[dict[str, Any]] = [
    # 1: every critical alert pages, and routing goes on to find its chat channel.
    {"matchers": ['severity="critical"'], "receivers": ["pagerduty"], "continue": True},
    # 2: vLLM alerts to the serving team, then stop.
    {"matchers": ['alertname=~"vLLM.*"'], "receivers": ["slack-serving"]},
    # 3: GPU alerts of the k-ai hosts, except the lab host, to the GPU channel.
    {"matchers": ['alertname=~"GPU.*"', 'host=~"k-ai-\\d+"', 'host!="k-ai-99"'], "receivers": ["slack-gpu"]},
    # 4: anything not from the test environment and not a Watchdog, by mail.
    {"matchers": ['env!~"test|staging"', 'alertname!="Watchdog"'], "receivers": ["email", "pagerduty"]},
]


def router(rules: list[dict[str, Any]] = RULES, default: list[str] | None = None) -> Router:
    return Router(RoutingConfig.model_validate({"rules": rules, "default": default or ["console"]}))


@pytest.mark.parametrize(
    ("labels", "receivers", "matched"),
    [
        # critical continues past rule 1 and is picked up by rule 3, which stops.
        ({"alertname": "GPUXidError", "host": "k-ai-01", "severity": "critical"}, ["pagerduty", "slack-gpu"], [1, 3]),
        # not critical: rule 1 does not match; rule 3 does.
        ({"alertname": "GPUXidError", "host": "k-ai-01", "severity": "warning"}, ["slack-gpu"], [3]),
        # regex is anchored: "k-ai-01x" is not k-ai-\d+; falls to rule 4 (no env label is "" which is not test).
        ({"alertname": "GPUXidError", "host": "k-ai-01x", "severity": "warning"}, ["email", "pagerduty"], [4]),
        # != excludes the lab host.
        ({"alertname": "GPUXidError", "host": "k-ai-99", "severity": "warning"}, ["email", "pagerduty"], [4]),
        # "GPU.*" anchored: "NodeGPUHot" does not start with GPU.
        ({"alertname": "NodeGPUHot", "host": "k-ai-01", "env": "test"}, ["console"], []),
        # !~ on an anchored alternation: "test" excluded, "testing" is not "test".
        ({"alertname": "DiskFull", "env": "test"}, ["console"], []),
        ({"alertname": "DiskFull", "env": "testing"}, ["email", "pagerduty"], [4]),
        # critical + rule 4 adds only what is new, in order: pagerduty is not listed twice.
        ({"alertname": "DiskFull", "severity": "critical"}, ["pagerduty", "email"], [1, 4]),
        # rule 2 stops: rule 4 is never reached for vLLM.
        ({"alertname": "vLLMQueueBacklog", "severity": "critical"}, ["pagerduty", "slack-serving"], [1, 2]),
        # nothing matches: the default receivers.
        ({"alertname": "Watchdog", "env": "staging"}, ["console"], []),
    ],
)
def test_routing_table(labels: dict[str, str], receivers: list[str], matched: list[int]) -> None:
    decision = router().route(labels)
    assert list(decision.receivers) == receivers
    assert [rule.number for rule in decision.matched_rules] == matched
    assert decision.used_default == (not matched)


def test_first_match_wins_without_continue() -> None:
    rules = [{"matchers": ['team="gpu"'], "receivers": ["a"]}, {"matchers": ['team="gpu"'], "receivers": ["b"]}]
    assert router(rules).route({"team": "gpu"}).receivers == ("a",)


def test_continue_on_every_rule_collects_all_receivers() -> None:
    rules = [
        {"matchers": ['team="gpu"'], "receivers": ["a"], "continue": True},
        {"matchers": [], "receivers": ["b", "a"], "continue": True},
    ]
    assert router(rules).route({"team": "gpu"}).receivers == ("a", "b")


def test_default_receivers_when_no_rule_and_when_no_rules() -> None:
    assert router([], ["console", "email"]).route({"alertname": "X"}).receivers == ("console", "email")
    assert router(RULES, ["email"]).route({"alertname": "Watchdog", "env": "test"}).receivers == ("email",)


def test_a_rule_with_no_receivers_records_the_alert_and_notifies_nobody() -> None:
    rules = [{"matchers": ['alertname="Watchdog"'], "receivers": []}, {"matchers": [], "receivers": ["a"]}]
    decision = router(rules, ["console"]).route({"alertname": "Watchdog"})
    assert decision.receivers == ()
    assert not decision.used_default
    assert router(rules, ["console"]).route({"alertname": "GPUTempCritical"}).receivers == ("a",)


def test_a_missing_label_matches_like_the_empty_string() -> None:
    assert LabelMatcher.parse('team=""').matches({})
    assert LabelMatcher.parse('team!=""').matches({"team": "gpu"})
    assert not LabelMatcher.parse('team!=""').matches({})
    assert LabelMatcher.parse('team=~".*"').matches({})
    assert not LabelMatcher.parse('team=~".+"').matches({})


def test_regex_is_anchored_at_both_ends_even_before_a_trailing_newline() -> None:
    matcher = LabelMatcher.parse('severity=~"critical"')
    assert matcher.matches({"severity": "critical"})
    assert not matcher.matches({"severity": "critical\n"})
    assert not matcher.matches({"severity": "non-critical"})
    assert not matcher.matches({"severity": "criticality"})
    assert LabelMatcher.parse('severity!~"critical"').matches({"severity": "critical\n"})
    # An alternation is anchored as a whole, not just its first and last branch.
    assert not LabelMatcher.parse('host=~"a|b"').matches({"host": "ab"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('severity="critical"', ("severity", "=", "critical")),
        ("severity=critical", ("severity", "=", "critical")),
        ('  host  !=  "k-ai-01"  ', ("host", "!=", "k-ai-01")),
        ('host=~"k-ai-\\d+"', ("host", "=~", "k-ai-\\d+")),  # a regex escape survives, as in Alertmanager
        ('alertname=~"GPU\\.Xid"', ("alertname", "=~", "GPU\\.Xid")),
        ('summary="say \\"hi\\""', ("summary", "=", 'say "hi"')),
        ('path="C:\\\\temp"', ("path", "=", "C:\\temp")),
        ('text="two\\nlines"', ("text", "=", "two\nlines")),
        ('team=""', ("team", "=", "")),
        ("team=", ("team", "=", "")),
        ('__name__!~"up|ALERTS"', ("__name__", "!~", "up|ALERTS")),
        ('colon:name="x"', ("colon:name", "=", "x")),
    ],
)
def test_matcher_syntax_follows_alertmanager(text: str, expected: tuple[str, str, str]) -> None:
    assert parse_matcher(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "severity",
        '="x"',
        '1abc="x"',
        'severity=="x"',  # the value would start with an unescaped quote and not end with one
        'severity="crit',
        'severity="a"b"',
        'severity=a"b',
        'severity="ends with escape\\"',
        'alertname=~"GPU("',
    ],
)
def test_bad_matchers_are_configuration_errors(text: str) -> None:
    with pytest.raises(ValidationError):
        RoutingConfig.model_validate({"rules": [{"matchers": [text], "receivers": ["console"]}]})


def _quote(value: str) -> str:
    """A matcher value as Alertmanager's parser wants it: double-quoted, with \\ and " escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@given(st.text())
def test_any_quoted_value_parses_back_to_itself_and_matches_only_itself(value: str) -> None:
    matcher = LabelMatcher.parse(f"label={_quote(value)}")
    assert matcher.value == value
    assert matcher.matches({"label": value})
    assert not matcher.matches({"label": value + "x"})


@given(st.text())
def test_an_escaped_regex_matches_exactly_its_literal(value: str) -> None:
    matcher = LabelMatcher.parse(f"label=~{_quote(re.escape(value))}")
    assert matcher.matches({"label": value})
    assert not matcher.matches({"label": value + "\n"})
    assert not matcher.matches({"label": "x" + value})


def test_matcher_prints_back_in_a_form_that_parses_to_the_same_matcher() -> None:
    for text in ('summary="say \\"hi\\""', 'host=~"k-ai-\\d+"', 'text="two\\nlines"'):
        matcher = LabelMatcher.parse(text)
        assert LabelMatcher.parse(str(matcher)) == matcher


def test_trace_names_the_failing_matcher_and_the_rules_never_evaluated() -> None:
    trace = router().trace({"alertname": "vLLMQueueBacklog", "severity": "warning"})
    first, second = trace.checks
    assert not first.matched
    assert str(first.mismatch) == 'severity="critical"' and first.actual == "warning"
    assert second.matched and second.rule.number == 2
    assert [rule.number for rule in trace.skipped] == [3, 4]
    assert trace.decision.receivers == ("slack-serving",)

    missing = router().trace({"alertname": "GPUXidError"}).checks[2]
    assert str(missing.mismatch) == 'host=~"k-ai-\\\\d+"' and missing.actual is None
