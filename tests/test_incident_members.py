"""An incident's members folded as the store reads them: what a version shows, without holding every alert."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.incident.members import MemberSummary, alert_line
from bot.incident.model import HOST_IDS
from bot.incident.record import IncidentRecord
from bot.incident.view import build_view
from bot.render.slack.incident_thread import host_line

OPENED = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def _record(alerts_per_host: int, hosts: int) -> IncidentRecord:
    summary = MemberSummary()
    for h in range(hosts):
        for g in range(alerts_per_host):
            labels = {"alertname": "GPUXidError", "severity": "critical", "host": f"k-ai-{h:02d}", "gpu": str(g)}
            annotations = {"value": str(90 + g % 5)}
            status = "resolved" if g == 0 else "firing"
            line = alert_line(f"fp{h:02d}{g:03d}@x", status, labels, annotations, OPENED + timedelta(seconds=g), "X")
            summary.add(line, annotations, labels, alone=False, last_seen=OPENED, enrichment=None)
    return IncidentRecord("inc1", "GPUXidError", "GPUXidError", "open", OPENED, None, 1, None, summary)


def test_a_version_carries_its_hosts_with_the_ids_a_line_shows_and_no_alert_lines() -> None:
    view = build_view(_record(alerts_per_host=40, hosts=3))
    assert view.alerts is None  # read from the store by the receivers that attach them
    assert (view.scope.alerts, view.scope.firing, view.scope.gpus, view.scope.hosts) == (120, 117, 120, 3)
    assert (view.scope.value_min, view.scope.value_max, view.scope.since) == (90.0, 94.0, OPENED)
    host = view.hosts[0]
    assert len(host.short_ids) == HOST_IDS and (host.firing, host.resolved) == (39, 1)
    shown = host_line(host, "", "critical")
    # The line counts the host's 40 alerts, not the ids it carries.
    hidden = int(shown.rsplit("+", 1)[1].split()[0])
    assert hidden + shown.count("`") // 2 - 1 == 40  # the host name is quoted too
    assert len(view.model_dump_json()) < 10_000
