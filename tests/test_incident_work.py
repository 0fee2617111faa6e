"""Who is hurt in an incident: the jobs, users, pods and containers on its GPUs, counted over its alerts' workload
evidence (gathered in the batch that changed it, or stored with the alerts), and told by every receiver."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.config import PagerDutyReceiver
from bot.evidence.outputs import PodFound, SlurmJobFound, WorkloadEvidence
from bot.incident.members import MemberSummary, alert_line
from bot.incident.record import IncidentRecord
from bot.incident.view import build_view
from bot.render.email_incident import render_incident_email
from bot.render.pagerduty_incident import incident_trigger
from bot.render.slack.incident import scope_text

OPENED = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _enrichment(evidence: WorkloadEvidence) -> dict[str, Any]:
    section = {"name": "workload", "title": "Workload", "status": "ok", "data": evidence.model_dump(mode="json")}
    return {"sections": [section]}


def _record(stored: dict[str, dict[str, Any]]) -> IncidentRecord:
    summary = MemberSummary()
    for n in range(4):
        key = f"k{n}"
        labels = {"alertname": "GPUXIDError", "severity": "critical", "host": f"k-ai-0{n}", "gpu": "0", "xid": "79"}
        line = alert_line(key, "firing", labels, {}, OPENED, "GPUXIDError")
        summary.add(line, {}, labels, alone=False, last_seen=OPENED, enrichment=stored.get(key))
    return IncidentRecord("inc1", "GPUXIDError", "GPUXIDError", "open", OPENED, None, 3, None, summary)


def test_an_incident_counts_the_jobs_users_and_pods_on_its_gpus_stored_or_just_gathered() -> None:
    alice = WorkloadEvidence(jobs=[SlurmJobFound(id="4121", user="alice", name="train")], likely_lost=True)
    bob = WorkloadEvidence(jobs=[SlurmJobFound(id="4122", user="bob")], likely_lost=True)
    pod = WorkloadEvidence(pods=[PodFound(namespace="inference", pod="vllm-0")], likely_lost=False)
    # k0 stored with its alert; k1 and k2 gathered by the batch that changed the incident; k3 found nothing.
    record = _record({"k0": _enrichment(alice)})
    view = build_view(record, {"k1": _enrichment(bob), "k2": _enrichment(pod)})
    assert view.work == "2 Slurm jobs of 2 users, 1 pod (2 likely lost)"
    assert build_view(record).work == "1 Slurm job of 1 user (1 likely lost)"
    assert build_view(_record({})).work == ""  # nothing found: nothing said


def test_every_receiver_says_who_is_hurt(tmp_path: Path) -> None:
    job = WorkloadEvidence(jobs=[SlurmJobFound(id="4121", user="alice")], likely_lost=True)
    view = build_view(_record({"k0": _enrichment(job)}))
    said = "1 Slurm job of 1 user (1 likely lost)"
    assert f"*Who is hurt:* {said}" in scope_text(view)
    key = "R0UTINGKEY" * 3 + "12"
    (tmp_path / "routing_key").write_text(key + "\n")
    pagerduty = PagerDutyReceiver(type="pagerduty", name="pd", routing_key_file=str(tmp_path / "routing_key"))
    assert incident_trigger(view, pagerduty, key, [])["payload"]["custom_details"]["who_is_hurt"] == said
    mail = render_incident_email(view, "gpu-alert-bot.example", "opening")
    assert "WHO IS HURT" in mail.rendered.text and said in mail.rendered.text
