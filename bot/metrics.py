"""The bot's own Prometheus metrics, on a registry per application so tests can run several side by side.

Labelled counters whose label values are known in advance start at 0: a series that appears with its first
increment is invisible to increase() and rate(), so the first burst of errors would never alert.

Each process exports only what it owns (docs/processes.md): the ingest process the webhooks, the dead man's switch,
remediation and the worker's restarts; the worker process the pipeline, the queues, the deliveries and the
enrichers. Both say who they are (`replica_info`) and count their own errors (`errors_total`, each its own kinds:
`store_unavailable` in both, as both use the store). A metric a process does not own still works there, unexported,
so that no process shows another's figures as stale zeros.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from bot.models import EventKind

_PREFIX = "gpu_alert_bot"

# `errors_total{kind}`: every kind the bot counts (mypy checks `Metrics.error` calls; tests/test_metrics.py
# checks that the code counts no other kind). Webhooks answered with a 4xx come first: Alertmanager does not
# retry them, so each one is a notification that reached nobody.
WebhookRefusal = Literal[
    "unauthorized",
    "unsupported_media_type",
    "invalid_json",
    "invalid_payload",
    "too_large",
    "not_found",
    "body_timeout",
]
IngestError = Literal[WebhookRefusal, "incomplete_body", "store_unavailable", "internal"]
WorkerError = Literal["store_unavailable", "worker", "pipeline", "outbox", "delivery_failed"]
ErrorKind = Literal[IngestError, WorkerError]
WEBHOOK_REFUSALS: tuple[WebhookRefusal, ...] = get_args(WebhookRefusal)
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)
# Which process exports what (`Metrics(side=...)`); "all" is one process running both sides.
Side = Literal["all", "ingest", "worker"]
_ERROR_KINDS_OF: dict[Side, tuple[ErrorKind, ...]] = {
    "all": ERROR_KINDS,
    "ingest": get_args(IngestError),
    "worker": get_args(WorkerError),
}
DeliveryOutcome = Literal["delivered", "retry", "held", "failed"]
DELIVERY_RESULTS: tuple[DeliveryOutcome, ...] = get_args(DeliveryOutcome)
ALERT_STATUSES = ("firing", "resolved")
INCIDENT_JOINS = ("opened", "host", "alertname")
INCIDENT_ANALYSIS_TRIGGERS = ("opened", "grew", "settled")
# `graphs_total{result}`: a picture drawn, or the message sent without one (drawing failed, too slow, upload failed).
GraphResult = Literal["rendered", "failed", "timeout", "upload_failed"]
GRAPH_RESULTS: tuple[GraphResult, ...] = get_args(GraphResult)
REMEDIATION_OUTCOMES = (
    "requested",
    "approved",
    "refused",
    "dry-run",
    "done",
    "failed",
    "verified",
    "escalated",
    "expired",
)

# The *_created series double the output and nobody alerts on them.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, side: Side = "all") -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # Where each metric is exported: a metric of the other side is kept out of this process's registry.
        ingest = r if side != "worker" else None
        worker = r if side != "ingest" else None
        self.notifications_received = Counter(
            f"{_PREFIX}_notifications_received", "Webhook notifications durably accepted.", registry=ingest
        )
        self.duplicates_dropped = Counter(
            f"{_PREFIX}_duplicate_notifications",
            "Notifications dropped as copies (HA replica, retry).",
            registry=ingest,
        )
        self.alerts_received = Counter(
            f"{_PREFIX}_alerts_received",
            "Alerts carried by accepted notifications, by status.",
            ["status"],
            registry=ingest,
        )
        self.alerts_current = Gauge(
            f"{_PREFIX}_alerts", "Alert episodes in the store, by current status.", ["status"], registry=worker
        )
        self.ingest_latency = Histogram(
            f"{_PREFIX}_ingest_duration_seconds",
            "Time from request to acknowledgement of a webhook, durable write included.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=ingest,
        )
        self.queue_depth = Gauge(
            f"{_PREFIX}_queue_depth", "Work waiting in the store, by queue.", ["queue"], registry=worker
        )
        self.failed_work = Gauge(
            f"{_PREFIX}_failed_work",
            "Work set aside after it kept failing (notifications, events, deliveries), by queue; see the log.",
            ["queue"],
            registry=worker,
        )
        self.errors = Counter(f"{_PREFIX}_errors", "Errors, by kind.", ["kind"], registry=r)
        for kind in _ERROR_KINDS_OF[side]:
            self.errors.labels(kind)
        for status in ALERT_STATUSES:
            self.alerts_received.labels(status)
        self.unknown_payload_versions = Counter(
            f"{_PREFIX}_unknown_payload_version",
            "Webhooks with a payload version other than 4, accepted because their fields validated.",
            ["version"],
            registry=ingest,
        )
        self.events = Counter(
            f"{_PREFIX}_events", "Events that went through the pipeline, by kind.", ["kind"], registry=worker
        )
        for event_kind in EventKind:
            self.events.labels(event_kind.value)
        self.incidents_opened = Counter(
            f"{_PREFIX}_incidents_opened", "Incidents opened (alerts told as one).", registry=worker
        )
        self.incident_joins = Counter(
            f"{_PREFIX}_incident_joins",
            "New alerts that became an incident's, by how: counted to open it (opened), on one of its hosts (host), "
            "of an alertname it gathers on a new host (alertname).",
            ["via"],
            registry=worker,
        )
        for via in INCIDENT_JOINS:
            self.incident_joins.labels(via)
        self.incident_analyses = Counter(
            f"{_PREFIX}_incident_analyses",
            "Incident analyses run, by what made them: it opened, its hosts grew by half, it settled.",
            ["trigger"],
            registry=worker,
        )
        for trigger in INCIDENT_ANALYSIS_TRIGGERS:
            self.incident_analyses.labels(trigger)
        self.incident_analysis_queries = Counter(
            f"{_PREFIX}_incident_analysis_queries",
            "Prometheus queries sent by incident analyses (4 an analysis, per source).",
            registry=worker,
        )
        self.incident_analysis_duration = Histogram(
            f"{_PREFIX}_incident_analysis_duration_seconds",
            "Time of each incident analysis, its queries sent together.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10),
            registry=worker,
        )
        self.incident_versions = Counter(
            f"{_PREFIX}_incident_versions",
            "Incident versions queued for a receiver, by receiver (the outbox sends the newest of those pending).",
            ["receiver"],
            registry=worker,
        )
        self.deliveries = Counter(
            f"{_PREFIX}_deliveries",
            "Delivery attempts, by receiver and result.",
            ["receiver", "result"],
            registry=worker,
        )
        self.delivery_duration = Histogram(
            f"{_PREFIX}_delivery_duration_seconds",
            "Time of each delivery attempt by the receiver's sink, whatever its result (Alertmanager: "
            "notification_latency_seconds), by receiver.",
            ["receiver"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20),
            registry=worker,
        )
        self.delivery_failures = Counter(
            f"{_PREFIX}_delivery_failures",
            "Deliveries given up for good, by receiver and reason.",
            ["receiver", "reason"],
            registry=worker,
        )
        self.graphs = Counter(
            f"{_PREFIX}_graphs",
            "Pictures of an alert's history (or an incident's heat map), by result: rendered, or failed, timeout, "
            "upload_failed (the message went as text alone).",
            ["result"],
            registry=worker,
        )
        for graph_result in GRAPH_RESULTS:
            self.graphs.labels(graph_result)
        self.enrichment_duration = Histogram(
            f"{_PREFIX}_enrichment_duration_seconds",
            "Time spent by each enricher.",
            ["enricher"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5),
            registry=worker,
        )
        self.gpu_history_duration = Histogram(
            f"{_PREFIX}_gpu_history_duration_seconds",
            "Time an alert's GPU history took in the store (recorded and read with its batch's, the wait for the "
            "batch's turn included).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 2.5, 3, 5),
            registry=worker,
        )
        self.enrichment_results = Counter(
            f"{_PREFIX}_enrichment_results",
            "Enricher outcomes, by enricher and status.",
            ["enricher", "status"],
            registry=worker,
        )
        self.source_requests = Counter(
            f"{_PREFIX}_source_requests",
            "Queries sent to each replica of an enrichment source (Prometheus per site), by result: ok, failed, or "
            "cancelled (another replica answered first).",
            ["source", "replica", "result"],
            registry=worker,
        )
        self.source_replica_skipped = Gauge(
            f"{_PREFIX}_source_replica_skipped",
            "1 while a replica of an enrichment source is skipped (asked only once the others failed) after failing "
            "again and again.",
            ["source", "replica"],
            registry=worker,
        )
        self.watchdog_age = Gauge(
            f"{_PREFIX}_watchdog_age_seconds",
            "Seconds since the Watchdog last arrived, by Alertmanager replica (externalURL; `any`: from any).",
            ["replica"],
            registry=ingest,
        )
        self.deadman_alerting = Gauge(
            f"{_PREFIX}_deadman_alerting",
            "1 while the dead man's switch says the Watchdog is missing, by replica; 0 otherwise.",
            ["replica"],
            registry=ingest,
        )
        self.deadman_armed = Gauge(
            f"{_PREFIX}_deadman_armed",
            "1 once a Watchdog has arrived (the dead man's switch can page); 0 while it was never armed.",
            registry=ingest,
        )
        self.cluster_member = Gauge(
            f"{_PREFIX}_alertmanager_cluster_member",
            "1 while an Alertmanager seen clustered answers from its cluster, 0 while it is down or has left it.",
            ["replica"],
            registry=ingest,
        )
        self.remediation_steps = Counter(
            f"{_PREFIX}_remediation_steps",
            "Remediation steps, by action and outcome (requested, approved, refused, dry-run, done, failed, "
            "verified, escalated, expired).",
            ["action", "outcome"],
            registry=ingest,
        )
        self.remediation_breaker_open = Gauge(
            f"{_PREFIX}_remediation_breaker_open",
            "1 while the remediation circuit breaker stops automatic actions (an admin resets it).",
            registry=ingest,
        )

        self.replica_info = Gauge(
            f"{_PREFIX}_replica_info",
            "Always 1: this process's replica name (store.replica) and store backend, to tell replicas apart.",
            ["replica", "backend"],
            registry=r,
        )
        self.worker_restarts = Counter(
            f"{_PREFIX}_worker_restarts",
            "Times `serve --role all` restarted its worker process after it died.",
            registry=ingest,
        )

    def graph(self, result: GraphResult) -> None:
        self.graphs.labels(result).inc()

    def error(self, kind: ErrorKind) -> None:
        self.errors.labels(kind).inc()

    def init_remediation(self, actions: Iterable[str]) -> None:
        """Start each executable action's step counters at 0."""
        for action in actions:
            for outcome in REMEDIATION_OUTCOMES:
                self.remediation_steps.labels(action, outcome)

    def init_receivers(self, receivers: Iterable[str]) -> None:
        """Start each configured receiver's delivery counters at 0 (the failures are per reason: not known)."""
        for receiver in receivers:
            self.delivery_duration.labels(receiver)
            self.incident_versions.labels(receiver)
            for result in DELIVERY_RESULTS:
                self.deliveries.labels(receiver, result)
