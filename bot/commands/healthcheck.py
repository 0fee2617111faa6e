"""`gpu-alert-bot healthcheck`: is the bot alive (or ready) on the port its configuration names? For container
probes (the Dockerfile's HEALTHCHECK, the compose file's healthcheck), so the port is never written twice."""

from __future__ import annotations

import ipaddress
import sys

import httpx

from bot.failure import what_failed

ALIVE_PATH = "/healthz"
READY_PATH = "/readyz"


def probe_url(host: str, port: int, path: str = ALIVE_PATH) -> str:
    """The URL of `path` on a bot listening on `host`: a wildcard address is reached on its loopback."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"http://{host}:{port}{path}"
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{shown}:{port}{path}"


def probe(host: str, port: int, timeout: float, path: str = ALIVE_PATH) -> bool:
    """True when `path` answers 200; otherwise the reason goes to standard error."""
    url = probe_url(host, port, path)
    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        print(f"{url}: {what_failed(exc)}", file=sys.stderr)
        return False
    if response.status_code != 200:
        print(f"{url}: HTTP {response.status_code}", file=sys.stderr)
        return False
    print(f"{url}: {'ready' if path == READY_PATH else 'alive'}")
    return True
