"""Verdicts: conclusions of the enrichment that change what an alert means.

An enricher that reaches one puts it in its section's data under `verdict`; the title and the first line of
every message then say it, and playbooks can condition steps, escalation and shown severity on it by name
(`{verdict: stale_xid_gauge}`). A verdict that could not be reached is a verdict too: it says why, so the
reader does not take silence for a fresh fault or for a stale gauge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bot.evidence import Enrichment

STALE_XID_GAUGE = "stale_xid_gauge"
XID_GAUGE_UNJUDGED = "xid_gauge_unjudged"
# The names a playbook may test, with what each means (check-config rejects any other).
KNOWN_VERDICTS: Mapping[str, str] = {
    STALE_XID_GAUGE: "DCGM_FI_DEV_XID_ERRORS held its value since before the alert and the kernel log of the "
    "window has no Xid line for this GPU: the alert is an old code, not a new fault",
    XID_GAUGE_UNJUDGED: "DCGM_FI_DEV_XID_ERRORS held its value since before the alert, but the kernel log is not "
    "configured, unavailable or cut at Loki's line limit: stale or fresh cannot be told",
}


@dataclass(frozen=True)
class Verdict:
    name: str
    # Said in the title after the alert's name and place: "probably a stale gauge, no Xid in the kernel log".
    headline: str
    # The message's first line: the verdict and its evidence in one sentence.
    line: str

    def to_data(self) -> dict[str, str]:
        return {"name": self.name, "headline": self.headline, "line": self.line}

    @classmethod
    def from_data(cls, data: Any) -> Verdict | None:
        if not isinstance(data, Mapping):
            return None
        fields = [data.get(key) for key in ("name", "headline", "line")]
        if not all(isinstance(value, str) and value for value in fields):
            return None
        return cls(name=data["name"], headline=data["headline"], line=data["line"])


def verdicts_of(enrichment: Enrichment) -> list[Verdict]:
    """The verdicts the enrichment reached, in the order of its sections."""
    found = (
        Verdict.from_data(section.data.get("verdict")) for section in enrichment.sections if section.status == "ok"
    )
    return [verdict for verdict in found if verdict is not None]
