"""The bot with its pages on (basic credentials of their own, a public address on its own port), and incidents posted
to it as Alertmanager sends them, for the page tests."""

from __future__ import annotations

import base64
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.storage.interface import Store
from tests.support.bot import RunningBot, eventually
from tests.support.incidents import COOLING, INLET, ROW_C
from tests.support.payloads import am_alert, webhook
from tests.support.processes import free_port

USER, PASSWORD = "oncall", "correct-horse-battery-staple"
CREDENTIALS = {"username": USER, "password": PASSWORD}
GPUS = 8
# What the analysis found, stored as the analyser stores it: what the card and the page say.
ANALYSIS: dict[str, Any] = {
    "traits": [ROW_C.model_dump()],
    "signals": [INLET.model_dump()],
    "companions": [{"alertname": "InletTemperatureHigh", "hosts": 12}],
    "cause": COOLING.model_dump(),
    "fleet_hosts": 1000,
    "fleet_gpus": 8000,
}


def basic_header() -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}


def pages_config(tmp_path: Path, **server: Any) -> dict[str, Any]:
    """The bot on a port of its own, its pages behind basic credentials and linked from its messages."""
    port = free_port()
    secret = tmp_path / "pages_password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    auth = {"basic": {"username": USER, "password_file": str(secret)}}
    return {
        "server": {
            "listen": f"127.0.0.1:{port}",
            "public_url": f"http://127.0.0.1:{port}",
            "pages": {"enabled": True, "refresh": "1s", "auth": auth},
            **server,
        },
        "outbox": {"initial_backoff": "50ms", "max_backoff": "200ms"},
    }


def host_alerts(host: int, started: datetime, status: str = "firing", **labels: str) -> dict[str, Any]:
    """One host's GPUs over their critical temperature, as one notification; rows A to D by host."""
    alerts = [
        am_alert(
            "GPUTempCritical",
            status=status,
            starts_at=started,
            instance=f"k-ai-{host:03d}:9400",
            gpu=str(gpu),
            row="ABCD"[host % 4],
            annotations={"summary": f"GPU {gpu} thermal critical ({90 + (host + gpu) % 7} °C)"},
            **labels,
        )
        for gpu in range(GPUS)
    ]
    return webhook(alerts, group_key=f'{{}}:{{alertname="GPUTempCritical", instance="k-ai-{host:03d}:9400"}}')


async def post(bot: RunningBot, payload: dict[str, Any]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=bot.url) as client:
        answer = await client.post("/alertmanager", json=payload)
        assert answer.status_code == 200, answer.text


async def the_incident(store: Store, alerts: int) -> str:
    """The id of the one incident, once it holds `alerts` alerts."""

    async def holding() -> str | None:
        heads = await store.incident_heads(10)
        return heads[0].id if len(heads) == 1 and heads[0].alerts == alerts else None

    found: str = await eventually(holding, timeout=60)
    return found
