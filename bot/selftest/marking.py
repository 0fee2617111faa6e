"""How a self-test alert is told apart: its `selftest` label (the run's unique id). Every sink shows it as a test
(`[self-test]` in the title), PagerDuty is not paged unless the run asked for it, and it never counts as a real
incident (no GPU history, no storm)."""

from __future__ import annotations

from collections.abc import Mapping

ALERTNAME = "GPUSelfTest"
LABEL = "selftest"
# Set by `selftest --pagerduty-event`: this run's alert goes to PagerDuty as a real (test) event.
PAGE_LABEL = "selftest_pagerduty"
TITLE_PREFIX = "[self-test] "


def is_selftest(labels: Mapping[str, str]) -> bool:
    return bool(labels.get(LABEL))


def pages_pagerduty(labels: Mapping[str, str]) -> bool:
    """Whether PagerDuty hears of this alert: every real alert, a self-test only when asked."""
    return not is_selftest(labels) or labels.get(PAGE_LABEL) == "true"
