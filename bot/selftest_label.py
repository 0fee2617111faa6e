"""How a self-test alert is told apart: its `selftest` label (the run's unique id). Every sink shows it as a test
(`[self-test]` in the title), PagerDuty is not paged unless the run asked for it, and it never counts as a real
incident (no GPU history, never one of an incident's alerts)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

ALERTNAME = "GPUSelfTest"
LABEL = "selftest"
# Set by `selftest --pagerduty-event`: this run's alert goes to PagerDuty as a real (test) event.
PAGE_LABEL = "selftest_pagerduty"
TITLE_PREFIX = "[self-test] "
# When the run that fired the alert is over (ISO 8601): an alert the bot first hears of later is not told, so a
# failed run's alert that Alertmanager delivers once the path is fixed reaches nobody; nor is any later update of
# it, such as a resolve by hand that carries no deadline (bot/pipeline.py: its firing reached nobody).
UNTIL_ANNOTATION = "selftest_until"
# The bot's clock and the self-test's may differ a little (another host).
CLOCK_SKEW = timedelta(seconds=30)


def is_selftest(labels: Mapping[str, str]) -> bool:
    return bool(labels.get(LABEL))


def pages_pagerduty(labels: Mapping[str, str]) -> bool:
    """Whether PagerDuty hears of this alert: every real alert, a self-test only when asked."""
    return not is_selftest(labels) or labels.get(PAGE_LABEL) == "true"


def heard_after_its_run(labels: Mapping[str, str], annotations: Mapping[str, str], first_seen: datetime) -> bool:
    """Whether the bot first heard of this self-test alert once its run was over."""
    if not is_selftest(labels):
        return False
    try:
        until = datetime.fromisoformat(annotations.get(UNTIL_ANNOTATION, ""))
    except ValueError:  # no deadline (an older self-test): told as before
        return False
    if until.tzinfo is None or first_seen.tzinfo is None:
        return False
    return first_seen > until + CLOCK_SKEW
