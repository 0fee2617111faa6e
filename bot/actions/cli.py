"""`gpu-alert-bot run ACTION --alert ID [--dry-run]`, `approve RUN`, `refuse RUN`, `reset-breaker`: ask the
running bot over its local admin endpoint (bot/actions/admin.py), with the token of
`remediation.admin_token_file`. The actor is `cli:<login name>`; approvals check it against
`remediation.approvers` / `admins`."""

from __future__ import annotations

import getpass
import sys
from typing import Any

import httpx

from bot.actions.admin import ADMIN_PREFIX
from bot.config import BotConfig

EXIT_OK, EXIT_REFUSED = 0, 1
_TIMEOUT = 30.0


def admin_url(config: BotConfig) -> str:
    host = config.server.host
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 (a listen-anywhere address: talk to ourselves on loopback)
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.server.port}"


def remediation_command(config: BotConfig, verb: str, payload: dict[str, Any], url: str | None) -> int:
    token = config.remediation.admin_token_file
    if token is None:
        print("remediation.admin_token_file is not set: the bot has no admin endpoint to ask", file=sys.stderr)
        return EXIT_REFUSED
    body = {"actor": getpass.getuser(), **payload}
    target = f"{(url or admin_url(config)).rstrip('/')}{ADMIN_PREFIX}/{verb}"
    try:
        response = httpx.post(target, json=body, headers={"Authorization": f"Bearer {token.get()}"}, timeout=_TIMEOUT)
    except httpx.HTTPError as exc:
        print(f"cannot reach the bot at {target}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        answer = response.json()
    except ValueError:
        answer = {"message": response.text[:300]}
    if response.status_code != 200:
        print(f"{verb} refused ({response.status_code}): {answer.get('message', answer)}", file=sys.stderr)
        return EXIT_REFUSED
    if "run" not in answer:
        print(f"circuit breaker {answer['breaker']}")
        return EXIT_OK
    run = answer["run"]
    where = run["target"] if run["gpu"] is None else f"{run['target']} gpu {run['gpu']}"
    detail = f": {run['detail']}" if run["detail"] else ""
    print(f"run #{run['id']} {run['action']} on {where}: {run['state']}{detail}")
    return EXIT_OK
