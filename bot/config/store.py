"""The `store`, `worker`, `outbox` and `logging` sections."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PlainValidator, model_validator

from bot.config.base import ConfigPath, StrictModel, listen_address
from bot.config.duration import Duration
from bot.config.secrets import SecretFile


class StoreConfig(StrictModel):
    backend: Literal["sqlite", "postgresql"] = "sqlite"
    path: ConfigPath = Field(default=Path("gpu-alert-bot.db"), validate_default=True)
    synchronous: Literal["full", "normal"] = "full"
    dedup_window: Duration = 600.0
    late_copy_window: Duration = 60.0
    retention: Duration = 30 * 86400.0
    # PostgreSQL only: the DSN (it holds the password) comes from a file, like every secret.
    dsn_file: SecretFile | None = None
    pool_size: int = Field(default=8, ge=2, le=256)
    connect_timeout: Duration = 5.0
    # How long a dead replica keeps its receivers before another takes them over.
    receiver_lease: Duration = 30.0
    # This replica's name in logs, metrics and leases (default: the host name).
    replica: str = Field(default_factory=socket.gethostname, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _postgresql_needs_a_dsn(self) -> StoreConfig:
        if self.backend == "postgresql" and self.dsn_file is None:
            raise ValueError("backend postgresql needs dsn_file (a file holding the connection string)")
        return self

    def dsn_password(self) -> Iterator[str]:
        """The password inside the DSN, a secret of its own: a driver's error may quote it without the rest."""
        if self.dsn_file is not None:
            # Imported here: psycopg costs every process tens of MB, and only a PostgreSQL store needs it.
            import psycopg
            from psycopg.conninfo import conninfo_to_dict

            with contextlib.suppress(psycopg.ProgrammingError):
                password = conninfo_to_dict(self.dsn_file.get()).get("password")
                if isinstance(password, str) and password:
                    yield password


class WorkerConfig(StrictModel):
    # Events in flight at once, over all batches.
    concurrency: int = Field(default=2048, ge=1, le=8192)
    # Events taken and enriched together at most: their shared queries are sent once. A fleet incident stored
    # before the worker gets to it (1,200 GPUs on 150 hosts) fits in one batch, so it costs each query once.
    batch_size: int = Field(default=2048, ge=1, le=8192)
    event_lease: Duration = 60.0
    max_event_attempts: int = Field(default=5, ge=1)
    # Wait before retrying an event after a pipeline error; doubles with each attempt, at most 5 minutes.
    retry_backoff: Duration = 2.0
    poll_interval: Duration = 1.0
    # Where a worker process (serve --role all|worker) serves its /metrics; default: server.listen's host (on
    # loopback without server.auth) with the port after server.listen's.
    metrics_listen: Annotated[str, PlainValidator(listen_address)] | None = None


class OutboxConfig(StrictModel):
    initial_backoff: Duration = 1.0
    max_backoff: Duration = 300.0
    give_up_after: Duration = 86400.0
    attempt_timeout: Duration = 30.0


class LoggingConfig(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
