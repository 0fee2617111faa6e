"""The Prometheus HTTP API: instant and range queries, the alerting rules, and its error shapes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, Field, ValidationError

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import PrometheusSource
from bot.enrich.queryapi import Deadline, QueryError, bearer_auth, body_text
from bot.enrich.replicas import ReplicaSet
from bot.metrics import Metrics

TARGET_POINTS = 180
_M = TypeVar("_M", bound=BaseModel)


# Sample values are strings ("91", "1e+00", "NaN", "+Inf"): validated into floats.
class _MatrixSeries(BaseModel):
    metric: dict[str, str]
    values: list[tuple[float, float]] = []


class _Matrix(BaseModel):
    result_type: Literal["matrix"] = Field(alias="resultType")
    result: list[_MatrixSeries]


class _VectorSample(BaseModel):
    metric: dict[str, str]
    value: tuple[float, float]


class _Vector(BaseModel):
    result_type: Literal["vector"] = Field(alias="resultType")
    result: list[_VectorSample]


class _MatrixAnswer(BaseModel):
    status: Literal["success"]
    data: _Matrix


class _VectorAnswer(BaseModel):
    status: Literal["success"]
    data: _Vector


class _Rule(BaseModel):
    name: str
    query: str
    type: str
    labels: dict[str, str] = {}


class _RuleGroup(BaseModel):
    rules: list[_Rule]


class _Rules(BaseModel):
    groups: list[_RuleGroup]


@dataclass(frozen=True)
class RawSeries:
    labels: dict[str, str]
    samples: list[tuple[float, float]]
    # The replica of an HA pair whose answer this is (host:port); empty when the source has one URL.
    replica: str = ""


@dataclass(frozen=True)
class AlertRule:
    name: str
    query: str
    labels: dict[str, str]


class PrometheusClient:
    """The few Prometheus HTTP API calls enrichment needs (httpx; POST forms; retries within the deadline)."""

    def __init__(
        self,
        config: PrometheusSource,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        metrics: Metrics | None = None,
        name: str = "default",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        tenant = {"X-Scope-OrgID": config.tenant_id} if config.tenant_id else {}
        auth = bearer_auth(config.bearer_token_file)

        def client(url: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=url.rstrip("/"), headers=tenant, auth=auth, transport=transport)

        self._params = dict(config.params)
        self._paired = bool(config.replicas)
        self._replicas = ReplicaSet(
            name,
            [config.url, *config.replicas],
            client,
            clock,
            hedge_after=config.hedge_after,
            failures_to_skip=config.replica_failures,
            cooldown=config.replica_cooldown,
            metrics=metrics,
        )

    async def query_range(
        self, query: str, start: float, end: float, step: float, deadline: Deadline
    ) -> list[RawSeries]:
        form = {**self._params, "query": query, "start": _num(start), "end": _num(end), "step": _num(step)}
        response = await self._send("POST", "/api/v1/query_range", deadline, data=form)
        answer = _answer(_MatrixAnswer, response)
        matrix = answer.data if answer else _parse(_Matrix, _data(response), "a range query result")
        replica = self._answered_by(response)
        return [RawSeries(s.metric, s.values, replica) for s in matrix.result]

    async def query(self, query: str, at: float | None, deadline: Deadline) -> list[RawSeries]:
        """An instant query at `at`, or at Prometheus's own present when None."""
        form = {**self._params, "query": query} | ({} if at is None else {"time": _num(at)})
        response = await self._send("POST", "/api/v1/query", deadline, data=form)
        answer = _answer(_VectorAnswer, response)
        vector = answer.data if answer else _parse(_Vector, _data(response), "an instant vector")
        replica = self._answered_by(response)
        return [RawSeries(s.metric, [s.value], replica) for s in vector.result]

    async def alerting_rules(self, deadline: Deadline) -> list[AlertRule]:
        # 2.42 has no rule_name[] filter (2.45+): take all alerting rules and filter here.
        data = await self._call("GET", "/api/v1/rules", deadline, params={**self._params, "type": "alert"})
        groups = _parse(_Rules, data, "a rules list")
        return [AlertRule(r.name, r.query, r.labels) for g in groups.groups for r in g.rules if r.type == "alerting"]

    def _answered_by(self, response: httpx.Response) -> str:
        """Which replica of a pair answered (its host and port: no credentials); nothing with one URL."""
        return response.request.url.netloc.decode() if self._paired else ""

    async def _call(self, method: str, path: str, deadline: Deadline, **request: Any) -> Any:
        return _data(await self._send(method, path, deadline, **request))

    async def _send(self, method: str, path: str, deadline: Deadline, **request: Any) -> httpx.Response:
        return await self._replicas.send(
            method, path, deadline, service="Prometheus", error_text=api_error_text, **request
        )

    async def close(self) -> None:
        await self._replicas.close()


def _answer(model: type[_M], response: httpx.Response) -> _M | None:
    """A successful answer read straight from its bytes (one pass: a storm's answers are megabytes); None when it
    is anything else, which `_data` and `_parse` then explain."""
    try:
        return model.model_validate_json(response.content)
    except ValidationError:
        return None


def _data(response: httpx.Response) -> Any:
    """The `data` of a successful API envelope, or QueryError saying what came instead."""
    try:
        envelope = json.loads(response.content)
    except ValueError:
        detail = f"Prometheus answered something that is not JSON: {body_text(response)}"
        raise QueryError("malformed", detail) from None
    if not isinstance(envelope, dict) or envelope.get("status") != "success":
        raise QueryError("api_error", f"Prometheus: {_envelope_error(envelope) or body_text(response)}")
    return envelope.get("data")


def api_error_text(response: httpx.Response) -> str:
    """The API's `{"status":"error","errorType":..,"error":..}` envelope, or the plain text of other paths."""
    try:
        envelope = json.loads(response.content)
    except ValueError:
        return body_text(response)
    return _envelope_error(envelope) or body_text(response)


def _envelope_error(envelope: Any) -> str:
    if isinstance(envelope, dict) and isinstance(envelope.get("error"), str):
        kind = envelope.get("errorType")
        return f"{kind}: {envelope['error']}" if isinstance(kind, str) and kind else envelope["error"]
    return ""


def _parse(model: type[_M], data: Any, what: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError:
        raise QueryError("malformed", f"Prometheus did not answer {what}") from None


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def choose_step(start: float, end: float) -> float:
    """About TARGET_POINTS points whatever the window: far below Prometheus' 11,000 points per series."""
    return float(max(1, math.ceil((end - start) / TARGET_POINTS)))
