"""The `server` section: where the bot listens, webhook authentication and client limits."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PlainValidator

from bot.config.base import HOST_PORT, StrictModel, listen_address
from bot.config.duration import Duration
from bot.config.secrets import SecretFile


class BasicAuthConfig(StrictModel):
    username: str = Field(min_length=1)
    password_file: SecretFile


class WebhookAuthConfig(StrictModel):
    bearer_token_file: SecretFile | None = None
    basic: BasicAuthConfig | None = None

    @property
    def enabled(self) -> bool:
        return self.bearer_token_file is not None or self.basic is not None


class ServerConfig(StrictModel):
    listen: Annotated[str, PlainValidator(listen_address)] = "127.0.0.1:9095"
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
