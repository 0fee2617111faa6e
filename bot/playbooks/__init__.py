"""Playbooks: what to do about an alert, as data in playbooks/*.yaml that operators read and edit.

A playbook matches an alert by name (and optional label matchers) and gives its meaning, likely causes, the
thresholds behind it and why, ordered runbook steps with commands, when to escalate, related Prometheus
queries for enrichment, related alerts for correlation, judgements (conditions over the enrichment, written as
data) and suggested actions by name. An alert nobody wrote a playbook for gets the generic one, so no message
renders empty. playbooks/README.md documents the format.

Everything is checked at start-up (and by `check-config`); each problem names its file and line.
"""

from bot.playbooks.base import PlaybookError
from bot.playbooks.conditions import Evidence
from bot.playbooks.playbook_set import PlaybookSet
from bot.playbooks.schema import GENERIC, Advice, Playbook, PlaybookMatch, RelatedAlert
from bot.playbooks.templating import fill_command

__all__ = [
    "GENERIC",
    "Advice",
    "Evidence",
    "Playbook",
    "PlaybookError",
    "PlaybookMatch",
    "PlaybookSet",
    "RelatedAlert",
    "fill_command",
]
