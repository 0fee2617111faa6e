"""Whose work is on the alert's GPU: the Kubernetes pod or Slurm job there, and for an Xid or ECC alert whether
the fault likely cost it.

- Kubernetes: dcgm-exporter's pod attribution labels (`pod`, `namespace`, `container`, with its Kubernetes mode
  on) on the GPU's series, from the Prometheus section's inventory (the series present now).
- Slurm: dcgm-exporter's HPC job label (`hpc_job`, with `DCGM_HPC_JOB_MAPPING_DIR` set) names the job; the
  scheduler, when `enrichment.slurm` is set, says whose it is, its name, its GPUs and since when, or, without the
  label, which running job holds this GPU of the node. The scheduler's job list (`squeue --json` through the
  forced command scripts/slurm-node-actions.sh) is asked once for the alerts of a batch and within `cache_ttl`;
  it is filtered here, so nothing of an alert's labels is ever sent to the scheduler.
- Docker: on a host whose remediation configuration reaches a Docker Engine, the running container holding the
  GPU (bot/enrich/containers.py), asked only when neither of the above named any work.

Label values are data: an `hpc_job` that is not a Slurm job id is left out and said so; job names and users from
the scheduler are shown as text, never used."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from bot.config import SlurmEnrichmentConfig
from bot.dockerengine import EngineError
from bot.enrich.base import EnrichmentRequest
from bot.enrich.batch import SharedQueries
from bot.enrich.containers import (
    DOCKER,
    ContainersHolding,
    ContainerSource,
    DockerTarget,
    container_line,
    container_name,
    shown,
)
from bot.enrich.gpu import GpuIdentity, resolve_identity
from bot.enrich.queryapi import Deadline, QueryError
from bot.evidence import (
    ContainerFound,
    EnrichmentSection,
    PodFound,
    PrometheusEvidence,
    SlurmJobFound,
    WorkloadEvidence,
    XidEvidence,
    evidence_of,
)
from bot.message import format_duration
from bot.models import DEFAULT_HOST_LABELS, AlertState, host_from_labels
from bot.printable import printable
from bot.slurm.access import SchedulerError, SlurmAccess
from bot.slurm.jobs import JOB_ID, JobsUnreadable, SlurmJob, parse_jobs

POD_LABELS = "dcgm-exporter pod labels"
JOB_LABEL = "dcgm-exporter hpc_job label"
SCHEDULER = "Slurm scheduler"


class WorkloadEnricher:
    name = "workload"
    title = "Workload"
    source = ""

    def __init__(
        self,
        slurm: SlurmEnrichmentConfig | None,
        timeout: float,
        host_labels: Sequence[str] = DEFAULT_HOST_LABELS,
        docker: ContainerSource | None = None,
    ) -> None:
        self._slurm = slurm
        self._docker = docker
        self._timeout = timeout
        self._host_labels = tuple(host_labels)
        self._access = SlurmAccess(slurm.ssh, timeout) if slurm is not None else None
        self._jobs = SharedQueries(1, slurm.cache_ttl if slurm is not None else 0.0)

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        identity = await resolve_identity(request)
        if not identity.is_gpu:
            return EnrichmentSection.skipped(self.name, self.title, "host-level alert: no GPU to attribute")
        prometheus = evidence_of(await request.section("prometheus"), PrometheusEvidence)
        attributed = [w for w in (prometheus.workloads if prometheus else []) if _same_gpu(identity, w)]
        pods = [
            PodFound(namespace=w.get("namespace", ""), pod=w["pod"], container=w.get("container", ""))
            for w in attributed
            if w.get("pod")
        ]
        job_ids, notes = _job_ids(attributed)
        sources = ([POD_LABELS] if pods else []) + ([JOB_LABEL] if job_ids else [])
        jobs = [SlurmJobFound(id=job) for job in job_ids]
        node = self._node(request.alert)
        failed: list[tuple[str, str]] = []
        if self._access is not None and (job_ids or not pods):
            try:
                running = await self._running_jobs()
            except (SchedulerError, JobsUnreadable, QueryError) as exc:
                failed.append(("Slurm", _why(exc)))
            else:
                jobs = _from_scheduler(running, job_ids, node, identity)
                sources.append(SCHEDULER)
        containers: list[ContainerFound] = []
        target = self._docker.target(request.alert) if self._docker is not None else None
        if target is not None and not (pods or jobs):
            try:
                holding = await self._docker_holding(target, identity)
            except EngineError as exc:
                failed.append((DOCKER, str(exc)))
            else:
                containers = holding.containers
                notes.extend(holding.notes)
                sources.append(DOCKER)
        if failed and not (pods or jobs or containers or SCHEDULER in sources or DOCKER in sources):
            return EnrichmentSection(
                name=self.name,
                title=self.title,
                status="unavailable",
                source=" and ".join(source for source, _ in failed),
                reason="; ".join(reason for _, reason in failed),
            )
        notes.extend(f"{source} unavailable: {reason}" for source, reason in failed)
        if not (pods or jobs or notes or sources):
            return EnrichmentSection.skipped(
                self.name,
                self.title,
                "no pod or job label on the GPU's series, and no scheduler or Docker Engine configured for the host",
            )
        lost, why = likely_lost(request.alert, evidence_of(await request.section("xid"), XidEvidence))
        found = bool(pods or jobs or containers)
        data = WorkloadEvidence(
            pods=pods,
            jobs=jobs,
            containers=containers,
            sources=sources,
            likely_lost=lost if found else None,
            lost_reason=why,
        )
        indexes = _indexes(prometheus)
        return EnrichmentSection(
            name=self.name,
            title=self.title,
            status="ok",
            summary=_summary(data, identity, node, target.host if target is not None else ""),
            lines=[
                *(_job_line(job, request.batch.now) for job in jobs),
                *(_pod_line(pod) for pod in pods),
                *(container_line(container, request.batch.now, indexes) for container in containers),
                *notes,
            ],
            data=data,
        )

    async def _docker_holding(self, target: DockerTarget, identity: GpuIdentity) -> ContainersHolding:
        docker = self._docker
        assert docker is not None
        return await docker.holding(target, identity)

    def _node(self, alert: AlertState) -> str:
        host = host_from_labels(alert.labels, self._host_labels)
        mapped = self._slurm.host_map.get(host) if self._slurm is not None else None
        return mapped or host.split(".")[0]

    async def _running_jobs(self) -> list[SlurmJob]:
        access = self._access
        assert access is not None

        async def fetch(deadline: Deadline) -> list[SlurmJob]:
            answer = await access.ask("jobs")
            if not answer.ok:
                raise SchedulerError(f"squeue failed: {answer.text[:300]}")
            return parse_jobs(answer.stdout)

        result: list[SlurmJob] = await self._jobs.get("jobs", self._timeout, fetch)
        return result

    async def close(self) -> None:
        await self._jobs.close()
        if self._docker is not None:
            await self._docker.close()


def _job_ids(attributed: list[dict[str, str]]) -> tuple[list[str], list[str]]:
    """The job ids dcgm-exporter's hpc_job label gives the GPU, and a note for each value that is not one."""
    labelled = sorted({w["hpc_job"] for w in attributed if w.get("hpc_job")})
    ids = [job for job in labelled if JOB_ID.fullmatch(job)]
    notes = [
        f"hpc_job label {printable(job)[:40]!r} is not a Slurm job id: left out" for job in labelled if job not in ids
    ]
    return ids, notes


def _same_gpu(identity: GpuIdentity, work: Mapping[str, str]) -> bool:
    uuid = work.get("UUID", "")
    if identity.uuid and uuid:
        return identity.uuid.lower() == uuid.lower()
    return identity.index is not None and work.get("gpu") == identity.index


def _from_scheduler(
    running: list[SlurmJob], job_ids: list[str], node: str, identity: GpuIdentity
) -> list[SlurmJobFound]:
    """The labelled jobs as the scheduler knows them (those it no longer runs, said so); without a label, the
    running jobs holding this GPU of the node."""
    if job_ids:
        known = {job.id: job for job in running}
        return [_found(known[job], node) if job in known else SlurmJobFound(id=job, running=False) for job in job_ids]
    index = int(identity.index) if identity.index is not None and identity.index.isdigit() else None
    if index is None:
        return []
    return [_found(job, node) for job in running if job.holds(node, index)]


def _found(job: SlurmJob, node: str) -> SlurmJobFound:
    held = job.gpus.get(node)
    where = node if held is not None else next(iter(job.gpus), "")
    return SlurmJobFound(
        id=job.id,
        user=shown(job.user),
        name=shown(job.name),
        node=where,
        gpus=list(job.gpus.get(where, ())),
        since=job.start.isoformat() if job.start is not None else None,
    )


# NVIDIA's immediate resolution bucket after which the work on the GPU survives; any other bucket (restart the
# application, reset the GPU, reboot) means the processes on it were stopped or must be.
_HARMLESS_BUCKETS = frozenset({"IGNORE"})
_ECC_UNCORRECTABLE = ("ECCUncorrectable", "ECCDoubleBit", "DBE")


def likely_lost(alert: AlertState, xid: XidEvidence | None) -> tuple[bool | None, str]:
    """Whether an Xid or ECC alert likely cost the work on the GPU, and why; (None, "") for other alerts."""
    if any(word.lower() in alert.alertname.lower() for word in _ECC_UNCORRECTABLE):
        return True, "an uncorrectable ECC error: the process that read the page gets a CUDA error or wrong data"
    if xid is None:
        return None, ""
    code = xid.alert_xid if xid.alert_xid is not None else (xid.worst.xid if xid.worst is not None else None)
    if code is None:
        return None, ""
    entry = xid.catalog.get(str(code))
    bucket = entry.nvidia.get("immediate", "") if entry is not None else ""
    if not bucket:
        return None, f"Xid {code}: the catalog gives no first step, so whether the work survived is unknown"
    if bucket in _HARMLESS_BUCKETS:
        return False, f"Xid {code}: NVIDIA's first step is {bucket}, the work on the GPU goes on"
    return True, f"Xid {code}: NVIDIA's first step is {bucket}"


def _summary(data: WorkloadEvidence, identity: GpuIdentity, node: str, docker_host: str) -> str:
    where = f"GPU {identity.index}" if identity.index is not None else "this GPU"
    named = [f"Slurm job {job.id}" + (f" of {job.user}" if job.user else "") for job in data.jobs]
    named += [f"pod {pod.namespace}/{pod.pod}" if pod.namespace else f"pod {pod.pod}" for pod in data.pods]
    named += [container_name(container) for container in data.containers]
    if not named:
        asked = [f"no running Slurm job holds {where} of {node}"] if SCHEDULER in data.sources else []
        asked += [f"no running container holds {where} of {docker_host}"] if DOCKER in data.sources else []
        said = "; ".join(asked)
        return said[:1].upper() + said[1:]
    said = f"On {where}: {', '.join(named)}"
    if data.likely_lost:
        return f"{said}: likely lost ({data.lost_reason})"
    if data.likely_lost is False:
        return f"{said}: likely unharmed ({data.lost_reason})"
    return said


def _job_line(job: SlurmJobFound, now: datetime) -> str:
    if not job.running:
        return f"Slurm job {job.id}: named by dcgm-exporter, not running in the scheduler now"
    parts = [f"Slurm job {job.id}"]
    if job.name:
        parts.append(f"“{job.name}”")
    if job.user:
        parts.append(f"user {job.user}")
    if job.gpus:
        count = len(job.gpus)
        indices = ", ".join(str(gpu) for gpu in job.gpus)
        parts.append(f"{count} GPU{'s' if count != 1 else ''} on {job.node} ({indices})")
    if job.since:
        started = datetime.fromisoformat(job.since)
        parts.append(f"running since {started:%Y-%m-%d %H:%M} UTC ({format_duration((now - started).total_seconds())})")
    return " · ".join(parts)


def _indexes(prometheus: PrometheusEvidence | None) -> dict[str, str]:
    """GPU UUID (lower case) -> index, from dcgm-exporter's inventory of the host, to show a container's GPUs."""
    rows = prometheus.gpus if prometheus is not None else []
    pairs = ((row.get("UUID") or row.get("uuid") or "", row.get("gpu") or "") for row in rows)
    return {uuid.lower(): index for uuid, index in pairs if uuid and index}


def _pod_line(pod: PodFound) -> str:
    name = f"{pod.namespace}/{pod.pod}" if pod.namespace else pod.pod
    return f"Pod {name}" + (f" (container {pod.container})" if pod.container else "")


def _why(exc: Exception) -> str:
    if isinstance(exc, QueryError):
        return exc.detail
    return str(exc)
