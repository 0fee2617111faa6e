"""Did the action help? Checked from Prometheus until the action's `verify_within` has passed.

restart-dcgm-exporter helped when the exporter is scraped again (`up == 1`), reports every GPU it reported
during the history window (by UUID), and, for a stuck Xid gauge, that GPU's gauge is back to 0. The alert's
`instance` label goes into the queries only as an escaped string value."""

from __future__ import annotations

from dataclasses import dataclass

from bot.actions.policy import stale_xid_gauge
from bot.clock import Clock
from bot.config import PrometheusConfig
from bot.enrich.prometheus import PrometheusClient, RawSeries
from bot.enrich.queryapi import Deadline, QueryError
from bot.models import AlertState
from bot.querytemplate import quoted
from bot.storage.interface import ActionRun

GPU_SERIES = "DCGM_FI_DEV_GPU_TEMP"
XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
STUCK_XID_ALERT = "DCGMXidGaugeStuck"


class VerificationError(Exception):
    """Prometheus could not be asked (unreachable, error answer)."""


@dataclass(frozen=True)
class ExporterState:
    up: bool
    gpus: frozenset[str]
    stuck_xid: float | None

    def problems(self, expected: frozenset[str], watch_xid: bool) -> list[str]:
        found = []
        if not self.up:
            found.append("the exporter is not scraped (up != 1)")
        if not self.gpus:
            found.append("it reports no GPU")
        missing = expected - self.gpus
        if self.gpus and missing:
            found.append(f"{len(missing)} of the {len(expected)} GPUs it reported before are missing")
        if watch_xid and self.stuck_xid:
            found.append(f"the Xid gauge still reads {self.stuck_xid:g}")
        return found


class ExporterRestartCheck:
    def __init__(self, prometheus: PrometheusConfig, clock: Clock, poll_interval: float) -> None:
        self._config = prometheus
        self._clock = clock
        self._poll_interval = poll_interval

    async def __call__(self, run: ActionRun, alert: AlertState, within: float) -> tuple[bool, str]:
        instance = alert.labels.get("instance")
        if not instance:
            return False, "the alert has no instance label, so the exporter cannot be checked"
        watch_xid = alert.labels.get("alertname") == STUCK_XID_ALERT or stale_xid_gauge(alert)
        gpu = alert.labels.get("gpu")
        deadline = self._clock.monotonic() + within
        prometheus = PrometheusClient(self._config)
        try:
            expected = await self._gpus(
                prometheus,
                f"last_over_time({GPU_SERIES}{{instance={quoted(instance)}}}[{int(self._config.history)}s])",
            )
            while True:
                state = await self._state(prometheus, instance, gpu if watch_xid else None)
                problems = state.problems(expected, watch_xid)
                if not problems:
                    return True, f"the exporter is up and reports {len(state.gpus)} GPUs" + (
                        ", the Xid gauge is back to 0" if watch_xid else ""
                    )
                if self._clock.monotonic() >= deadline:
                    return False, "; ".join(problems)
                await self._clock.sleep(self._poll_interval)
        finally:
            await prometheus.close()

    async def _state(self, prometheus: PrometheusClient, instance: str, gpu: str | None) -> ExporterState:
        selector = f"instance={quoted(instance)}"
        up = await self._query(prometheus, f"up{{{selector}}}")
        gpus = await self._gpus(prometheus, f"{GPU_SERIES}{{{selector}}}")
        stuck = None
        if gpu is not None:
            xid = await self._query(prometheus, f"{XID_GAUGE}{{{selector}, gpu={quoted(gpu)}}}")
            stuck = max((series.samples[-1][1] for series in xid if series.samples), default=None)
        return ExporterState(any(series.samples[-1][1] == 1 for series in up if series.samples), gpus, stuck)

    async def _gpus(self, prometheus: PrometheusClient, query: str) -> frozenset[str]:
        series = await self._query(prometheus, query)
        return frozenset(item.labels.get("UUID") or item.labels.get("gpu", "") for item in series)

    async def _query(self, prometheus: PrometheusClient, query: str) -> list[RawSeries]:
        try:
            return await prometheus.query(query, None, Deadline(self._config.timeout))
        except QueryError as exc:
            raise VerificationError(f"Prometheus: {exc.detail}") from exc
