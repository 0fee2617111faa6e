"""The bot's local admin endpoint for remediation, used by `gpu-alert-bot run|approve|refuse`: operators
without Slack ask the running bot, which owns the store and the executors. Every call needs the bearer token
of `remediation.admin_token_file` (compared in constant time); without that key the endpoint is off (404)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.actions.build import RemediationService
from bot.actions.runs import ActionRefused
from bot.ingest import json_error
from bot.storage.interface import ActionRun, StoreUnavailable

ADMIN_PREFIX = "/admin/remediation"
ACTOR_PREFIX = "cli:"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    actor: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.@-]+$")


class RunBody(_Body):
    action: str = Field(min_length=1, max_length=100)
    alert: str = Field(min_length=1, max_length=200)
    dry_run: bool = False


class DecisionBody(_Body):
    run: int = Field(ge=1)


def run_json(run: ActionRun) -> dict[str, Any]:
    fields = dataclasses.asdict(run)
    fields["requested_at"] = run.requested_at.isoformat()
    fields["updated_at"] = run.updated_at.isoformat()
    return fields


ServiceGetter = Callable[[web.Request], RemediationService | None]


def add_admin_routes(app: web.Application, token: str | None, service: ServiceGetter) -> None:
    def handler(
        work: Callable[[RemediationService, Any], Awaitable[dict[str, Any]]], body: type[_Body]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            running = service(request)
            if token is None or running is None:
                return json_error(404, "not_found", "the remediation admin endpoint is off: set admin_token_file")
            presented = request.headers.get("Authorization", "")
            if not _same_secret(presented, f"Bearer {token}"):
                return json_error(401, "unauthorized", "missing or wrong admin token")
            try:
                parsed = body.model_validate_json(await request.read())
            except ValidationError as exc:
                return json_error(400, "bad_request", "; ".join(_problem(e) for e in exc.errors()))
            try:
                answer = await work(running, parsed)
            except ActionRefused as exc:
                return json_error(409, "refused", str(exc))
            except StoreUnavailable as exc:
                return json_error(503, "store_unavailable", str(exc))
            return web.json_response(answer)

        return handle

    async def request_run(running: RemediationService, body: RunBody) -> dict[str, Any]:
        run = await running.engine.request(body.action, body.alert, ACTOR_PREFIX + body.actor, body.dry_run)
        return {"run": run_json(run)}

    async def approve(running: RemediationService, body: DecisionBody) -> dict[str, Any]:
        return {"run": run_json(await running.engine.approve(body.run, ACTOR_PREFIX + body.actor))}

    async def refuse(running: RemediationService, body: DecisionBody) -> dict[str, Any]:
        return {"run": run_json(await running.engine.refuse(body.run, ACTOR_PREFIX + body.actor))}

    async def reset_breaker(running: RemediationService, body: _Body) -> dict[str, Any]:
        await running.engine.reset_breaker(ACTOR_PREFIX + body.actor)
        return {"breaker": "closed"}

    app.router.add_post(f"{ADMIN_PREFIX}/run", handler(request_run, RunBody))
    app.router.add_post(f"{ADMIN_PREFIX}/approve", handler(approve, DecisionBody))
    app.router.add_post(f"{ADMIN_PREFIX}/refuse", handler(refuse, DecisionBody))
    app.router.add_post(f"{ADMIN_PREFIX}/reset-breaker", handler(reset_breaker, _Body))


def _same_secret(presented: str, expected: str) -> bool:
    """Constant time; comparing digests hides the expected length too."""
    presented_digest = hashlib.sha256(presented.encode(errors="surrogateescape")).digest()
    return hmac.compare_digest(presented_digest, hashlib.sha256(expected.encode()).digest())


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]
