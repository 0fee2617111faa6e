"""Who may read the pages: a bearer token or basic credentials of their own (compared in constant time, read from
their files at each request), or the user an authenticating reverse proxy (oauth2-proxy) names in a header,
believed only from the proxy's addresses. With none configured the bot listens on loopback (the configuration
refuses anything else), and the pages are open to whoever is on this host."""

from __future__ import annotations

import ipaddress

from aiohttp import web

from bot.auth import WebhookAuth
from bot.config import PagesAuthConfig


class PageAuth:
    def __init__(self, config: PagesAuthConfig) -> None:
        self._credentials = WebhookAuth(config)
        self._proxy = config.proxy
        self._open = not config.enabled

    @property
    def challenge(self) -> str | None:
        """What a 401 asks the browser for: basic credentials make it prompt for them."""
        return self._credentials.challenge if self._credentials.enabled else None

    def reader(self, request: web.Request) -> str | None:
        """Who reads (for the log), or None when the request carries no credential the pages accept."""
        if self._open:
            return "loopback"
        if self._credentials.enabled and request.headers.get("Authorization"):
            return "credentials" if self._credentials.allows(request.headers["Authorization"]) else None
        if self._proxy is not None and self._from_proxy(request.remote):
            user = request.headers.get(self._proxy.header, "").strip()
            return user or None
        return None

    def _from_proxy(self, peer: str | None) -> bool:
        assert self._proxy is not None
        try:
            address = ipaddress.ip_address((peer or "").split("%", 1)[0])
        except ValueError:
            return False
        return any(address in network for network in self._proxy.proxies)
