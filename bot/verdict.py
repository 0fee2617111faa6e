"""Verdicts: conclusions of the enrichment that change what an alert means.

An enricher that reaches one puts it in its evidence (bot.evidence.Verdict, as XidEvidence.verdict); the title
and the first line of every message then say it, and playbooks can condition steps, escalation and shown
severity on it by name (`{verdict: stale_xid_gauge}`). A verdict that could not be reached is a verdict too: it
says why, so the reader does not take silence for a fresh fault or for a stale gauge.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.evidence import Enrichment, Verdict, XidEvidence

STALE_XID_GAUGE = "stale_xid_gauge"
XID_GAUGE_UNJUDGED = "xid_gauge_unjudged"
# The names a playbook may test, with what each means (check-config rejects any other).
KNOWN_VERDICTS: Mapping[str, str] = {
    STALE_XID_GAUGE: "DCGM_FI_DEV_XID_ERRORS held its value since before the alert and the kernel log of the "
    "window has no Xid line for this GPU: the alert is an old code, not a new fault",
    XID_GAUGE_UNJUDGED: "DCGM_FI_DEV_XID_ERRORS held its value since before the alert, but the kernel log is not "
    "configured, unavailable or cut at Loki's line limit: stale or fresh cannot be told",
}


def verdicts_of(enrichment: Enrichment) -> list[Verdict]:
    """The verdicts the enrichment reached."""
    xid = enrichment.evidence(XidEvidence)
    return [xid.verdict] if xid is not None and xid.verdict is not None else []
