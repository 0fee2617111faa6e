"""What each enricher found, as a model: messages, verdicts, playbook conditions and later enrichers read these
fields, so a misspelt one is a type error rather than an empty section.

Field names are the keys enrichment has always been stored under (the store keeps `model_dump(mode="json")`),
so enrichment stored before these models existed reads back unchanged. An Xid event's decoding, which only
messages show, keeps its JSON shape beyond the fields code reads.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


class EvidenceModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SectionEvidence(EvidenceModel):
    """The output of one enricher; `section` is the name of the enricher (and of its section)."""

    section: ClassVar[str]


class Verdict(EvidenceModel):
    """A conclusion of the enrichment that changes what an alert means (bot/verdict.py lists the names)."""

    name: str = Field(min_length=1)
    # Said in the title after the alert's name and place: "probably a stale gauge, no Xid in the kernel log".
    headline: str = Field(min_length=1)
    # The message's first line: the verdict and its evidence in one sentence.
    line: str = Field(min_length=1)


class GpuIdentityData(EvidenceModel):
    """One GPU as far as it is known; unknown parts are left out of the JSON, not written as null."""

    index: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    model: str | None = None
    host: str | None = None
    serial: str | None = None

    @model_serializer(mode="wrap")
    def _known_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


class GpuEvidence(GpuIdentityData, SectionEvidence):
    section: ClassVar[str] = "gpu"

    # Where the identity came from: "alert labels", "dcgm-exporter inventory", "kernel log".
    sources: list[str] = Field(default_factory=list)


class LokiEvidence(SectionEvidence):
    section: ClassVar[str] = "loki"

    host: str
    query: str
    start: str
    end: str
    # (ISO timestamp, line), oldest first.
    entries: list[tuple[str, str]] = Field(default_factory=list)
    truncated: bool = False
    render: str = "code"


class PrometheusSeries(EvidenceModel):
    """One series over the enrichment window; `current` is None when the series stopped before now."""

    query: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    values: list[tuple[float, float]] = Field(default_factory=list)
    current: float | None = None
    current_text: str = ""
    min: float | None = None
    max: float | None = None
    changes: int = 0
    sparkline: str = ""
    covered_seconds: int | None = None


class PrometheusWindow(EvidenceModel):
    start: float
    end: float
    step: float


class PrometheusEvidence(SectionEvidence):
    section: ClassVar[str] = "prometheus"

    expr: str | None = None
    expr_source: str | None = None
    graphed: str | None = None
    comparison: str | None = None
    window: PrometheusWindow | None = None
    history: PrometheusSeries | None = None
    # What the graphed value measures; None where the number would mislead (see bot.enrich.prometheus.promql).
    value_meaning: str | None = ""
    related: dict[str, PrometheusSeries] = Field(default_factory=dict)
    unavailable: dict[str, str] = Field(default_factory=dict)
    # The host's GPUs from dcgm-exporter's labels (gpu, UUID, pci_bus_id, modelName, Hostname).
    gpus: list[dict[str, str]] = Field(default_factory=list)
    # The work dcgm-exporter attributes to the host's GPUs now (gpu, UUID, pod, namespace, container, hpc_job);
    # left out of the JSON when there is none, as it was before it existed.
    workloads: list[dict[str, str]] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _workloads_when_found(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        if not dumped.get("workloads"):
            dumped.pop("workloads", None)
        return dumped


class RelatedAlertFound(EvidenceModel):
    alertname: str
    key: str = ""
    host: str = ""
    status: str = ""
    severity: str = ""
    starts_at: str = ""
    # Seconds from this alert's start to the related one's: negative when it started before.
    offset_seconds: float
    summary: str = ""


class RelatedEvidence(SectionEvidence):
    section: ClassVar[str] = "related"

    alerts: list[RelatedAlertFound] = Field(default_factory=list)
    # The key of the incident's first alert, which this one's message is threaded under.
    root: str | None = None


class DecodedXidRecord(EvidenceModel):
    """A decoded kernel Xid line (bot.gpu.xid_catalog.DecodedXid.to_dict): the fields code reads are typed, the rest
    of the decoding is kept for messages."""

    model_config = ConfigDict(extra="allow")

    xid: int
    pci_bus_id: str | None = None
    uuid: str | None = None
    timestamp: str | None = None
    basis: str = "catalog"


class XidWorst(EvidenceModel):
    xid: int
    title: str
    severity: str
    action: str


class XidCatalogEntry(EvidenceModel):
    """The catalog's entry for one Xid code the alert or its kernel lines name (bot.gpu.xid_catalog.XidEntry)."""

    name: str
    title: str
    severity: str
    action: str
    follow_up: str = ""
    causes: list[str] = Field(default_factory=list)
    # NVIDIA's resolution buckets (immediate, investigatory); empty in enrichment stored before they existed.
    nvidia: dict[str, str] = Field(default_factory=dict)
    known: bool = True


class XidEvidence(SectionEvidence):
    section: ClassVar[str] = "xid"

    scope: str
    gpu: GpuIdentityData = Field(default_factory=GpuIdentityData)
    alert_xid: int | None = None
    alert_xid_source: str | None = None
    alert_xid_label: str | None = None
    events: list[DecodedXidRecord] = Field(default_factory=list)
    events_total: int = 0
    # Keyed by the Xid code as text (JSON object keys).
    catalog: dict[str, XidCatalogEntry] = Field(default_factory=dict)
    worst: XidWorst | None = None
    stale_gauge: bool | None = None
    stale_reason: str = ""
    verdict: Verdict | None = None
    kernel_log: str = ""
    # PCI bus id -> UUID, as the kernel log's `GPU at` lines map them.
    gpus: dict[str, str] = Field(default_factory=dict)
    truncated: bool = False


class EscalationVerdict(EvidenceModel):
    """One of the catalog's escalation rules that one GPU's Xid history meets (bot.gpu.xid_escalation.Verdict)."""

    rule: str
    xid: int
    count: int
    severity: str
    text: str


class AlertCount(EvidenceModel):
    name: str
    count: int


class RecurrenceGpu(GpuIdentityData):
    """One GPU's history in the window: its identity, Xid counts (keyed by the code as text), this alert's
    count and its escalation verdicts."""

    gpu_key: str
    xids: dict[str, int] = Field(default_factory=dict)
    alert: AlertCount
    verdicts: list[EscalationVerdict] = Field(default_factory=list)


class RecurrenceEvidence(SectionEvidence):
    section: ClassVar[str] = "recurrence"

    window: str
    window_seconds: float
    gpus: list[RecurrenceGpu] = Field(default_factory=list)
    # Every GPU's verdicts, most severe first.
    verdicts: list[EscalationVerdict] = Field(default_factory=list)
    escalate: bool = False
    recorded: int = 0


class SlurmJobFound(EvidenceModel):
    """A Slurm job on the alert's GPU: its id, owner, name, the GPUs it holds on the node and since when (ISO)."""

    id: str
    user: str = ""
    name: str = ""
    node: str = ""
    gpus: list[int] = Field(default_factory=list)
    since: str | None = None
    # False: a job dcgm-exporter's label names that the scheduler no longer runs.
    running: bool = True


class PodFound(EvidenceModel):
    namespace: str = ""
    pod: str
    container: str = ""


class ContainerFound(EvidenceModel):
    """A running Docker container holding the alert's GPU, as the host's Docker Engine says."""

    # The remediation host whose engine was asked.
    host: str = ""
    id: str
    name: str
    image: str = ""
    # When it started (ISO), if the engine says.
    since: str | None = None
    # The GPUs it was given as they were named (indexes, UUIDs, N:M for a MIG device); empty with all_gpus.
    gpus: list[str] = Field(default_factory=list)
    all_gpus: bool = False
    # How: "DeviceRequests" (docker run --gpus, compose's device reservations) or "NVIDIA_VISIBLE_DEVICES".
    given_by: str = ""


class WorkloadEvidence(SectionEvidence):
    """Whose work is on the alert's GPU (bot/enrich/workload.py), and whether the fault likely cost it."""

    section: ClassVar[str] = "workload"

    pods: list[PodFound] = Field(default_factory=list)
    jobs: list[SlurmJobFound] = Field(default_factory=list)
    # Left out of the JSON when there is none, as it was before the Docker Engine was asked.
    containers: list[ContainerFound] = Field(default_factory=list)
    # Where it was read: "dcgm-exporter pod labels", "dcgm-exporter hpc_job label", "Slurm scheduler",
    # "Docker Engine".
    sources: list[str] = Field(default_factory=list)
    # For Xid and ECC alerts: whether the work on the GPU is likely lost; None when the alert does not say.
    likely_lost: bool | None = None
    lost_reason: str = ""

    @model_serializer(mode="wrap")
    def _containers_when_found(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        if not dumped.get("containers"):
            dumped.pop("containers", None)
        return dumped


SectionData = (
    GpuEvidence
    | LokiEvidence
    | PrometheusEvidence
    | RelatedEvidence
    | XidEvidence
    | RecurrenceEvidence
    | WorkloadEvidence
)
SECTION_MODELS: dict[str, type[SectionData]] = {
    model.section: model
    for model in (
        GpuEvidence,
        LokiEvidence,
        PrometheusEvidence,
        RelatedEvidence,
        XidEvidence,
        RecurrenceEvidence,
        WorkloadEvidence,
    )
}
