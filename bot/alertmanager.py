"""A small typed client of Alertmanager's API v2: status, alerts and silences.

With several URLs (an HA pair), a call that cannot reach one replica, or gets a 5xx from it, goes to the next:
silences gossip between peers, so any replica will do. A 4xx is the request's fault and is not tried elsewhere.
Works against 0.25 (Debian bookworm) and 0.27+: the differences that matter (DELETE of an unknown silence answers
500 on 0.25, 404 later) are handled here, not by callers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.config import AlertmanagerConfig
from bot.enrich.queryapi import MAX_ANSWER_BYTES, AnswerTooLarge, bearer_auth, body_text, read_capped
from bot.failure import what_failed

API = "/api/v2"
_Model = TypeVar("_Model", bound=BaseModel)
_NOT_FOUND_0_25 = "silence not found"


class AlertmanagerError(Exception):
    """`reason` is a short stable code (`connect`, `timeout`, `http_400`, `bad_answer`); `detail` is for people."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class SilenceNotFound(AlertmanagerError):
    def __init__(self, silence_id: str) -> None:
        super().__init__("not_found", f"no silence {silence_id} in Alertmanager")


class _ApiModel(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")


class SilenceMatcher(_ApiModel):
    name: str
    value: str
    is_regex: bool = Field(default=False, alias="isRegex")
    is_equal: bool = Field(default=True, alias="isEqual")

    def __str__(self) -> str:
        operator = {(False, True): "=", (False, False): "!=", (True, True): "=~", (True, False): "!~"}
        return f"{self.name}{operator[(self.is_regex, self.is_equal)]}{json.dumps(self.value)}"


class SilenceState(StrEnum):
    ACTIVE = "active"
    PENDING = "pending"
    EXPIRED = "expired"


class _SilenceStatus(_ApiModel):
    state: SilenceState


class Silence(_ApiModel):
    id: str
    matchers: list[SilenceMatcher]
    starts_at: datetime = Field(alias="startsAt")
    ends_at: datetime = Field(alias="endsAt")
    created_by: str = Field(alias="createdBy")
    comment: str
    status: _SilenceStatus

    @property
    def state(self) -> SilenceState:
        return self.status.state


class _VersionInfo(_ApiModel):
    version: str


class _Peer(_ApiModel):
    name: str
    address: str


class _Cluster(_ApiModel):
    status: str
    name: str = ""  # this member's peer name
    peers: list[_Peer] = Field(default_factory=list)


class _ConfigText(_ApiModel):
    original: str = ""


class AmStatus(_ApiModel):
    """`url` says which replica answered; `config.original` is its configuration file as loaded."""

    url: str = ""
    version_info: _VersionInfo = Field(alias="versionInfo")
    cluster: _Cluster
    uptime: datetime
    config: _ConfigText = _ConfigText()

    @property
    def version(self) -> str:
        return self.version_info.version


class _AlertStatus(_ApiModel):
    state: str
    silenced_by: list[str] = Field(default_factory=list, alias="silencedBy")
    inhibited_by: list[str] = Field(default_factory=list, alias="inhibitedBy")


class _ReceiverName(_ApiModel):
    name: str


class AmApiAlert(_ApiModel):
    """An alert as `GET /api/v2/alerts` shows it."""

    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime = Field(alias="startsAt")
    ends_at: datetime = Field(alias="endsAt")
    fingerprint: str
    receivers: list[_ReceiverName] = Field(default_factory=list)
    status: _AlertStatus


class PostableAlert(_ApiModel):
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime | None = Field(default=None, alias="startsAt")
    ends_at: datetime | None = Field(default=None, alias="endsAt")
    generator_url: str | None = Field(default=None, alias="generatorURL")


class AlertmanagerClient:
    """Calls go to `urls` in order until one answers. `http` is injectable (a transport in tests); by default
    the client owns one, closed by `close()`. An answer is read up to `max_answer_bytes`, refused beyond."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout: float = 5.0,
        auth: httpx.Auth | None = None,
        http: httpx.AsyncClient | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        if not urls:
            raise ValueError("at least one Alertmanager URL is needed")
        self.urls = [url.rstrip("/") for url in urls]
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout, auth=auth)
        self._timeout = timeout
        self._max_answer_bytes = max_answer_bytes

    @classmethod
    def from_config(cls, config: AlertmanagerConfig, http: httpx.AsyncClient | None = None) -> AlertmanagerClient:
        return cls(config.urls, timeout=config.timeout, auth=bearer_auth(config.bearer_token_file), http=http)

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    # --- status and alerts ---------------------------------------------------------------------------
    async def status(self) -> AmStatus:
        url, answer = await self._call("GET", "/status")
        return _parse(AmStatus, {**_object(answer), "url": url})

    async def alerts(self, filters: Sequence[str] = (), *, silenced: bool = True) -> list[AmApiAlert]:
        params = [("filter", f) for f in filters] + [("silenced", str(silenced).lower())]
        _, answer = await self._call("GET", "/alerts", params=params)
        return [_parse(AmApiAlert, item) for item in _array(answer)]

    async def post_alerts(self, alerts: Sequence[PostableAlert]) -> None:
        body = [alert.model_dump(mode="json", by_alias=True, exclude_none=True) for alert in alerts]
        await self._call("POST", "/alerts", json=body)

    # --- silences ------------------------------------------------------------------------------------
    async def create_silence(
        self,
        matchers: Sequence[SilenceMatcher],
        *,
        starts_at: datetime,
        ends_at: datetime,
        created_by: str,
        comment: str,
    ) -> str:
        """The new silence's id."""
        body = {
            "matchers": [m.model_dump(by_alias=True) for m in matchers],
            "startsAt": starts_at.isoformat(),
            "endsAt": ends_at.isoformat(),
            "createdBy": created_by,
            "comment": comment,
        }
        _, answer = await self._call("POST", "/silences", json=body)
        silence_id = _object(answer).get("silenceID")
        if not isinstance(silence_id, str) or not silence_id:
            raise AlertmanagerError("bad_answer", "Alertmanager created a silence but sent no silenceID")
        return silence_id

    async def silences(self, filters: Sequence[str] = ()) -> list[Silence]:
        _, answer = await self._call("GET", "/silences", params=[("filter", f) for f in filters])
        return [_parse(Silence, item) for item in _array(answer)]

    async def silence(self, silence_id: str) -> Silence:
        try:
            _, answer = await self._call("GET", f"/silence/{silence_id}")
        except AlertmanagerError as exc:
            if exc.reason in ("http_404", "http_422"):
                raise SilenceNotFound(silence_id) from None
            raise
        return _parse(Silence, answer)

    async def expire_silence(self, silence_id: str) -> None:
        """Expire a silence; expiring an expired one is fine. Raises SilenceNotFound for an unknown id."""
        try:
            await self._call("DELETE", f"/silence/{silence_id}", not_found_is_final=True)
        except AlertmanagerError as exc:
            if exc.reason in ("http_404", "http_422", "not_found"):
                raise SilenceNotFound(silence_id) from None
            raise

    # --- transport -----------------------------------------------------------------------------------
    async def _call(
        self, method: str, path: str, *, not_found_is_final: bool = False, **request: Any
    ) -> tuple[str, Any]:
        """(the URL that answered, its JSON answer); the next URL on a transport error or a 5xx."""
        failures: list[AlertmanagerError] = []
        for base in self.urls:
            try:
                return base, await self._call_one(base, method, path, not_found_is_final, request)
            except _TryNext as exc:
                failures.append(exc.error)
        if len(failures) == 1:
            raise failures[0]
        details = "; ".join(f.detail for f in failures)
        raise AlertmanagerError(failures[-1].reason, f"no Alertmanager answered: {details}")

    async def _call_one(
        self, base: str, method: str, path: str, not_found_is_final: bool, request: dict[str, Any]
    ) -> Any:
        try:
            # asyncio's timeout bounds the whole exchange (a replica trickling bytes), httpx's each read.
            async with asyncio.timeout(self._timeout):
                built = self._http.build_request(method, f"{base}{API}{path}", timeout=self._timeout, **request)
                response = await read_capped(await self._http.send(built, stream=True), self._max_answer_bytes)
        except (httpx.TimeoutException, TimeoutError):
            raise _TryNext(AlertmanagerError("timeout", f"no answer from {base} within {self._timeout:g} s")) from None
        except AnswerTooLarge as exc:
            raise _TryNext(AlertmanagerError("too_large", f"{base}: {exc.detail}")) from None
        except httpx.TransportError as exc:
            raise _TryNext(AlertmanagerError("connect", f"cannot reach {base}: {what_failed(exc)}")) from None
        if response.status_code >= 500:
            text = body_text(response)
            if not_found_is_final and _NOT_FOUND_0_25 in text:
                raise AlertmanagerError("not_found", text)
            raise _TryNext(AlertmanagerError(f"http_{response.status_code}", f"{base} answered: {text}"))
        if not response.is_success:
            raise AlertmanagerError(
                f"http_{response.status_code}", f"Alertmanager refused the request: {body_text(response)}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise AlertmanagerError("bad_answer", f"{base} answered with something that is not JSON") from None


class _TryNext(Exception):
    def __init__(self, error: AlertmanagerError) -> None:
        super().__init__(error.detail)
        self.error = error


def _object(answer: Any) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise AlertmanagerError("bad_answer", "Alertmanager's answer is not a JSON object")
    return answer


def _array(answer: Any) -> list[Any]:
    if not isinstance(answer, list):
        raise AlertmanagerError("bad_answer", "Alertmanager's answer is not a JSON array")
    return answer


def _parse(model: type[_Model], data: Any) -> _Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise AlertmanagerError(
            "bad_answer", f"unexpected answer from Alertmanager: {exc.errors()[0]['msg']}"
        ) from None
