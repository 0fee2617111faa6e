"""The `server` section: where the bot listens, webhook authentication, client limits, and the incident pages."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import Field, PlainValidator, model_validator

from bot.config.base import HOST_PORT, HttpUrlText, StrictModel, listen_address
from bot.config.duration import Duration
from bot.config.secrets import SecretFile

# Where oauth2-proxy, in front of the bot on the same host, connects from.
LOOPBACK_PROXIES = ("127.0.0.1/32", "::1/128")


class BasicAuthConfig(StrictModel):
    username: str = Field(min_length=1)
    password_file: SecretFile


class WebhookAuthConfig(StrictModel):
    bearer_token_file: SecretFile | None = None
    basic: BasicAuthConfig | None = None

    @property
    def enabled(self) -> bool:
        return self.bearer_token_file is not None or self.basic is not None


class ProxyAuthConfig(StrictModel):
    """A user named by a header that an authenticating reverse proxy (oauth2-proxy) sets, believed only from the
    proxy's own addresses: anyone else sending the header is refused like a request without a credential."""

    header: str = Field(default="X-Forwarded-Email", min_length=1, pattern=r"^[A-Za-z0-9-]+$")
    proxies: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = Field(
        default_factory=lambda: [ipaddress.ip_network(n) for n in LOOPBACK_PROXIES], min_length=1
    )


class PagesAuthConfig(WebhookAuthConfig):
    """Who may read the pages: a bearer token or basic credentials of their own, or a trusted proxy's header."""

    proxy: ProxyAuthConfig | None = None

    @property
    def enabled(self) -> bool:
        return super().enabled or self.proxy is not None


class PagesConfig(StrictModel):
    """The read-only incident and alert pages (docs/pages.md)."""

    enabled: bool = False
    auth: PagesAuthConfig = PagesAuthConfig()
    # How often an open page asks whether its incident changed (a small JSON answer; the table is read again only
    # when it did).
    refresh: Duration = Field(default=5.0, ge=1)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServerConfig(StrictModel):
    listen: Annotated[str, PlainValidator(listen_address)] = "127.0.0.1:9095"
    # The address people reach the bot's pages at (through a proxy, say): the link every message carries.
    public_url: HttpUrlText | None = None
    pages: PagesConfig = PagesConfig()
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    auth: WebhookAuthConfig = WebhookAuthConfig()
    # 0 would answer every webhook 503: the durable write always needs some time.
    ingest_timeout: Duration = Field(default=5.0, gt=0)
    # Hostile or broken clients (docs/hardening.md): how long each may hold a connection, and how many at once.
    header_timeout: Duration = Field(default=10.0, gt=0)
    body_timeout: Duration = Field(default=30.0, gt=0)
    idle_timeout: Duration = Field(default=60.0, gt=0)
    max_connections: int = Field(default=256, ge=1)
    # /readyz's budget for the store's answers, whatever the store does (a PostgreSQL down makes its pool wait
    # store.connect_timeout): the answer comes within 1 s, under the 3 s of config/docker-compose.ha.yml's check.
    ready_timeout: Duration = Field(default=0.8, gt=0)

    @model_validator(mode="after")
    def _pages_are_not_open_to_the_network(self) -> ServerConfig:
        if self.pages.enabled and not self.pages.auth.enabled and not is_loopback(self.host):
            raise ValueError(
                f"pages.auth: none set, so the pages would be open to anyone who reaches {self.listen}: set "
                "pages.auth (bearer_token_file, basic or proxy; docs/pages.md), or listen on loopback"
            )
        if self.public_url is not None and not self.pages.enabled:
            raise ValueError(
                "public_url: the links it makes lead to the pages, which are off: set pages.enabled to true, or "
                "leave public_url out"
            )
        return self

    @property
    def host(self) -> str:
        match = HOST_PORT.match(self.listen)
        assert match is not None
        return match.group("host").strip("[]")

    @property
    def port(self) -> int:
        match = HOST_PORT.match(self.listen)
        assert match is not None
        return int(match.group("port"))
