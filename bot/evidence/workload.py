"""What an incident's alerts cost: the jobs, users, pods and containers their GPUs carried, from each alert's
workload evidence (bot/enrich/workload.py). A leaf like the rest of bot/evidence: the incident's message can count
without loading the enrichers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bot.evidence.outputs import WorkloadEvidence


@dataclass(frozen=True)
class AffectedWork:
    jobs: int
    users: int
    pods: int
    # Of those jobs, pods and containers, the ones an Xid or ECC alert likely cost.
    likely_lost: int
    containers: int = 0

    def text(self) -> str:
        """`3 Slurm jobs of 2 users, 1 pod, 2 containers (2 likely lost)`; empty when no work was found."""
        parts = []
        if self.jobs:
            parts.append(f"{self.jobs} Slurm job{'s' if self.jobs != 1 else ''}")
            parts[-1] += f" of {self.users} user{'s' if self.users != 1 else ''}" if self.users else ""
        if self.pods:
            parts.append(f"{self.pods} pod{'s' if self.pods != 1 else ''}")
        if self.containers:
            parts.append(f"{self.containers} container{'s' if self.containers != 1 else ''}")
        said = ", ".join(parts)
        return f"{said} ({self.likely_lost} likely lost)" if said and self.likely_lost else said


def affected_work(found: Iterable[WorkloadEvidence | None]) -> AffectedWork:
    """Distinct jobs (by id), their users, pods (by namespace and name) and containers (by host and id) over the
    alerts' evidence."""
    jobs: dict[str, str] = {}
    pods: set[tuple[str, str]] = set()
    containers: set[tuple[str, str]] = set()
    lost: set[str] = set()
    for evidence in found:
        if evidence is None:
            continue
        for job in evidence.jobs:
            jobs.setdefault(job.id, job.user)
            if evidence.likely_lost:
                lost.add(f"job {job.id}")
        for pod in evidence.pods:
            pods.add((pod.namespace, pod.pod))
            if evidence.likely_lost:
                lost.add(f"pod {pod.namespace}/{pod.pod}")
        for container in evidence.containers:
            containers.add((container.host, container.id))
            if evidence.likely_lost:
                lost.add(f"container {container.host}/{container.id}")
    users = {user for user in jobs.values() if user}
    return AffectedWork(
        jobs=len(jobs), users=len(users), pods=len(pods), likely_lost=len(lost), containers=len(containers)
    )
