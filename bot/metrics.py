"""The bot's own Prometheus metrics, on a registry per application so tests can run several side by side.

Labelled counters whose label values are known in advance start at 0: a series that appears with its first
increment is invisible to increase() and rate(), so the first burst of errors would never alert.
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
ErrorKind = Literal[
    WebhookRefusal,
    "incomplete_body",
    "store_unavailable",
    "internal",
    "worker",
    "pipeline",
    "outbox",
    "delivery_failed",
]
WEBHOOK_REFUSALS: tuple[WebhookRefusal, ...] = get_args(WebhookRefusal)
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)
DeliveryOutcome = Literal["delivered", "retry", "failed"]
DELIVERY_RESULTS: tuple[DeliveryOutcome, ...] = get_args(DeliveryOutcome)
ALERT_STATUSES = ("firing", "resolved")
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
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.notifications_received = Counter(
            f"{_PREFIX}_notifications_received", "Webhook notifications durably accepted.", registry=r
        )
        self.duplicates_dropped = Counter(
            f"{_PREFIX}_duplicate_notifications", "Notifications dropped as copies (HA replica, retry).", registry=r
        )
        self.alerts_received = Counter(
            f"{_PREFIX}_alerts_received", "Alerts carried by accepted notifications, by status.", ["status"], registry=r
        )
        self.alerts_current = Gauge(
            f"{_PREFIX}_alerts", "Alert episodes in the store, by current status.", ["status"], registry=r
        )
        self.ingest_latency = Histogram(
            f"{_PREFIX}_ingest_duration_seconds",
            "Time from request to acknowledgement of a webhook, durable write included.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.queue_depth = Gauge(
            f"{_PREFIX}_queue_depth", "Work waiting in the store, by queue.", ["queue"], registry=r
        )
        self.failed_work = Gauge(
            f"{_PREFIX}_failed_work",
            "Work set aside after it kept failing (notifications, events, deliveries), by queue; see the log.",
            ["queue"],
            registry=r,
        )
        self.errors = Counter(f"{_PREFIX}_errors", "Errors, by kind.", ["kind"], registry=r)
        for kind in ERROR_KINDS:
            self.errors.labels(kind)
        for status in ALERT_STATUSES:
            self.alerts_received.labels(status)
        self.unknown_payload_versions = Counter(
            f"{_PREFIX}_unknown_payload_version",
            "Webhooks with a payload version other than 4, accepted because their fields validated.",
            ["version"],
            registry=r,
        )
        self.events = Counter(
            f"{_PREFIX}_events", "Events that went through the pipeline, by kind.", ["kind"], registry=r
        )
        for event_kind in EventKind:
            self.events.labels(event_kind.value)
        self.deliveries = Counter(
            f"{_PREFIX}_deliveries", "Delivery attempts, by receiver and result.", ["receiver", "result"], registry=r
        )
        self.delivery_duration = Histogram(
            f"{_PREFIX}_delivery_duration_seconds",
            "Time of each delivery attempt by the receiver's sink, whatever its result (Alertmanager: "
            "notification_latency_seconds), by receiver.",
            ["receiver"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20),
            registry=r,
        )
        self.delivery_failures = Counter(
            f"{_PREFIX}_delivery_failures",
            "Deliveries given up for good, by receiver and reason.",
            ["receiver", "reason"],
            registry=r,
        )
        self.graphs = Counter(
            f"{_PREFIX}_graphs",
            "Pictures of an alert's history (or an incident's heat map), by result: rendered, or failed, timeout, "
            "upload_failed (the message went as text alone).",
            ["result"],
            registry=r,
        )
        for graph_result in GRAPH_RESULTS:
            self.graphs.labels(graph_result)
        self.enrichment_duration = Histogram(
            f"{_PREFIX}_enrichment_duration_seconds",
            "Time spent by each enricher.",
            ["enricher"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5),
            registry=r,
        )
        self.enrichment_results = Counter(
            f"{_PREFIX}_enrichment_results",
            "Enricher outcomes, by enricher and status.",
            ["enricher", "status"],
            registry=r,
        )
        self.watchdog_age = Gauge(
            f"{_PREFIX}_watchdog_age_seconds",
            "Seconds since the Watchdog last arrived, by Alertmanager replica (externalURL; `any`: from any).",
            ["replica"],
            registry=r,
        )
        self.deadman_alerting = Gauge(
            f"{_PREFIX}_deadman_alerting",
            "1 while the dead man's switch says the Watchdog is missing, by replica; 0 otherwise.",
            ["replica"],
            registry=r,
        )
        self.deadman_armed = Gauge(
            f"{_PREFIX}_deadman_armed",
            "1 once a Watchdog has arrived (the dead man's switch can page); 0 while it was never armed.",
            registry=r,
        )
        self.cluster_member = Gauge(
            f"{_PREFIX}_alertmanager_cluster_member",
            "1 while an Alertmanager seen clustered answers from its cluster, 0 while it is down or has left it.",
            ["replica"],
            registry=r,
        )
        self.remediation_steps = Counter(
            f"{_PREFIX}_remediation_steps",
            "Remediation steps, by action and outcome (requested, approved, refused, dry-run, done, failed, "
            "verified, escalated, expired).",
            ["action", "outcome"],
            registry=r,
        )
        self.remediation_breaker_open = Gauge(
            f"{_PREFIX}_remediation_breaker_open",
            "1 while the remediation circuit breaker stops automatic actions (an admin resets it).",
            registry=r,
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
            registry=r,
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
            for result in DELIVERY_RESULTS:
                self.deliveries.labels(receiver, result)
