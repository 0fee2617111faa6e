"""The YAML configuration file, validated by pydantic. Every key is documented in config/bot.example.yaml.

Secrets are never written in the file itself: keys ending in `_file` name a file whose content is the secret
(Docker/Kubernetes secrets), so nothing secret appears in the environment or `docker inspect`. Relative paths
are resolved against the directory of the configuration file, so the bot runs from any working directory.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import os
import re
import socket
import stat
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict
from pydantic import (
    AfterValidator,
    AnyHttpUrl,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bot.datafile import bundled_playbooks
from bot.models import DEFAULT_HOST_LABELS
from bot.yamldoc import NotUtf8Error, duplicate_keys, read_document

log = logging.getLogger("bot.config")

BUNDLED_PLAYBOOKS = bundled_playbooks()

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_LISTEN = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[^:\s]+):(?P<port>\d{1,5})$")
_DOUBLE_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_BOOL = TypeAdapter(bool)
# Alertmanager's matcher syntax (pkg/labels/parse.go): the value may be double-quoted or bare.
_MATCHER = re.compile(r"^\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?P<op>=~|!~|!=|=)\s*(?P<value>.*?)\s*\Z", re.DOTALL)


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Prometheus-style duration such as `90s`, `15m`, `1h30m`, `30d`."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 15m or 2h")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        parts = list(_DURATION_PART.finditer(text))
        if not parts or "".join(p.group(0) for p in parts) != text:
            raise ValueError(f"{value!r} is not a duration such as 30s, 15m or 2h")
        seconds = sum(float(p.group(1)) * _DURATION_UNITS[p.group(2)] for p in parts)
    else:
        raise ValueError("expected a duration such as 30s, 15m or 2h")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]

LISTEN_EXAMPLE = "127.0.0.1:9095 or 0.0.0.0:9095"


def host_port(value: Any, example: str, port_zero: bool = True) -> str:
    """`value` if it is a `HOST:PORT` text (an IPv6 host in brackets); the error names an example."""
    hint = f"expected HOST:PORT, for example {example}"
    if not isinstance(value, str):
        raise ValueError(f"{hint} (got {_yaml_kind(value)})")
    match = _LISTEN.match(value)
    if match is None or int(match.group("port")) > 65535 or (not port_zero and int(match.group("port")) == 0):
        raise ValueError(hint)
    return value


def listen_address(value: Any) -> str:
    """A `HOST:PORT` to listen on: `server.listen` and `serve --listen`."""
    return host_port(value, LISTEN_EXAMPLE, port_zero=False)


def split_listen(value: str) -> tuple[str, int]:
    """The host (IPv6 without brackets) and port of a checked `listen_address`."""
    match = _LISTEN.match(value)
    assert match is not None
    return match.group("host").strip("[]"), int(match.group("port"))


_HTTP_URL = TypeAdapter(AnyHttpUrl)


def http_url(value: str) -> str:
    """`value` unchanged if it is an http:// or https:// URL with a host: anything else would only fail at the
    first request, and be retried for a day."""
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError(f"{value!r} is not a URL: it contains spaces or control characters")
    try:
        _HTTP_URL.validate_python(value)
    except ValidationError as exc:
        reason = str(exc.errors()[0]["msg"]).removeprefix("Input should be a valid URL, ")
        raise ValueError(f"{value!r} is not an http:// or https:// URL with a host ({reason})") from None
    return value


HttpUrlText = Annotated[str, AfterValidator(http_url)]


def _smarthost(value: Any) -> str:
    return host_port(value, "smtp.example.com:587")


def _yaml_kind(value: Any) -> str:
    """What a YAML value that should have been text is, in the file's terms."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"the number {value}: a port alone, with no host"
    kinds = ((float, "a number"), (list, "a list"), (dict, "a mapping"))
    return next((kind for type_, kind in kinds if isinstance(value, type_)), type(value).__name__)


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir")
    path = value.expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    # config/../var/bot.db -> var/bot.db, without resolving symlinks the operator chose.
    return Path(os.path.normpath(path))


ConfigPath = Annotated[Path, AfterValidator(_resolve_path)]


class Secret:
    """A secret read from a file, and read again when the file changes, so a rotated token (a new file moved
    into place, a Kubernetes secret update) is used without a restart. Its repr and its serialised form show
    the file, never the value."""

    __slots__ = ("_stamp", "_value", "path")

    def __init__(self, path: Path, value: str) -> None:
        self.path = path
        self._value = value
        self._stamp = _file_stamp(path)

    @classmethod
    def read(cls, path: Path) -> Secret:
        stamp = _file_stamp(path)  # before reading: a change while reading is seen by the next get()
        secret = cls(path, _secret_text(path))
        secret._stamp = stamp
        return secret

    def get(self) -> str:
        stamp = _file_stamp(self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            self._read_again()
        return self._value

    def _read_again(self) -> None:
        try:
            self._value = _secret_text(self.path)
        except ValueError as exc:
            # Mid-rotation (the file gone, or truncated before its new content): the last good value still works.
            log.warning(
                "secret file changed and cannot be used: keeping its previous value", extra={"reason": str(exc)}
            )

    def readable_by_everyone(self) -> bool:
        try:
            return bool(self.path.stat().st_mode & stat.S_IROTH)
        except OSError:
            return False

    def __repr__(self) -> str:
        return f"Secret(file={str(self.path)!r})"


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is rewritten or replaced; None when it cannot be seen."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _secret_text(path: Path) -> str:
    try:
        content = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read secret file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"secret file {path} is not UTF-8 text") from None
    if not content:
        raise ValueError(f"secret file {path} is empty")
    return content


def _load_secret(value: Any, info: ValidationInfo) -> Secret:
    if isinstance(value, Secret):
        return value
    if not isinstance(value, str | Path) or not str(value).strip():
        raise ValueError("expected the path of a file holding the secret")
    return Secret.read(_resolve_path(Path(value), info))


SecretFile = Annotated[Secret, PlainValidator(_load_secret), PlainSerializer(lambda s: str(s.path))]


class StrictModel(BaseModel):
    """Unknown keys are errors, so a typo in the file is reported instead of silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_section_is_defaults(cls, value: Any) -> Any:
        # `auth:` followed only by comments is None in YAML: it means "all defaults".
        return {} if value is None else value


# --- server -------------------------------------------------------------------------------------------
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

    @property
    def host(self) -> str:
        match = _LISTEN.match(self.listen)
        assert match is not None
        return match.group("host").strip("[]")

    @property
    def port(self) -> int:
        match = _LISTEN.match(self.listen)
        assert match is not None
        return int(match.group("port"))


# --- store, worker, outbox, logging --------------------------------------------------------------------
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
            with contextlib.suppress(psycopg.ProgrammingError):
                password = conninfo_to_dict(self.dsn_file.get()).get("password")
                if isinstance(password, str) and password:
                    yield password


class WorkerConfig(StrictModel):
    concurrency: int = Field(default=16, ge=1, le=1024)
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


# --- enrichment ----------------------------------------------------------------------------------------
class LokiConfig(StrictModel):
    url: HttpUrlText
    tenant_id: str | None = None
    bearer_token_file: SecretFile | None = None
    # LogQL stream selector; {host} is replaced by the alert's host, escaped for a LogQL string.
    selector: str = '{job="syslog", host="{host}"}'
    line_filter: str = "NVRM:"
    # Alert labels that name the host, first present wins; the port of an `instance` is dropped.
    host_labels: list[str] = Field(default_factory=lambda: list(DEFAULT_HOST_LABELS))
    host_map: dict[str, str] = Field(default_factory=dict)
    before: Duration = 900.0
    after: Duration = 120.0
    limit: int = Field(default=1000, ge=1, le=5000)
    timeout: Duration = 2.0
    # Alerts for one host whose windows fit in a query sent after they started share it for this long.
    cache_ttl: Duration = 60.0
    # Newest lines shown in the message (all fetched lines stay in the stored enrichment).
    show_lines: int = Field(default=20, ge=0, le=200)

    @field_validator("selector")
    @classmethod
    def _has_host(cls, value: str) -> str:
        strings = _DOUBLE_QUOTED.findall(value)
        if "{host}" in _DOUBLE_QUOTED.sub('""', value) or not any("{host}" in s for s in strings):
            raise ValueError(
                'the selector must contain {host} inside a double-quoted value: {job="syslog", host="{host}"}'
            )
        return value


class PrometheusConfig(StrictModel):
    url: HttpUrlText
    bearer_token_file: SecretFile | None = None
    history: Duration = 1800.0
    timeout: Duration = 2.0


class EnrichmentConfig(StrictModel):
    budget: Duration = 3.0
    recurrence_window: Duration = 30 * 86400.0
    loki: LokiConfig | None = None
    prometheus: PrometheusConfig | None = None


def _http_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL such as http://alertmanager:9093")
    return value


class AlertmanagerConfig(StrictModel):
    """Alertmanager's API v2, for silences and the self-test. Several URLs: an HA pair, tried in order."""

    urls: list[Annotated[str, AfterValidator(_http_url)]] = Field(min_length=1)
    timeout: Duration = 5.0
    bearer_token_file: SecretFile | None = None


class DeadmanConfig(StrictModel):
    """The dead man's switch: the bot alerts through its own sinks when Alertmanager's always-firing Watchdog
    stops arriving (bot/deadman.py)."""

    enabled: bool = True
    alertname: str = Field(default="Watchdog", min_length=1)
    # Alertmanager's repeat_interval on the Watchdog's route (config/alertmanager.example.yml sets 1m).
    repeat_interval: Duration = Field(default=60.0, gt=0)
    # Silence longer than this raises WatchdogMissing; by default 3 x repeat_interval.
    timeout: Duration | None = None
    check_interval: Duration = Field(default=15.0, gt=0)

    @model_validator(mode="after")
    def _timeout_spans_a_repeat(self) -> DeadmanConfig:
        if self.timeout is not None and self.timeout <= self.repeat_interval:
            raise ValueError(
                "timeout must be longer than repeat_interval (3 x is the default): a Watchdog that is merely "
                "on time would raise WatchdogMissing"
            )
        return self

    @property
    def effective_timeout(self) -> float:
        return self.timeout if self.timeout is not None else 3 * self.repeat_interval


class PlaybooksConfig(StrictModel):
    dir: ConfigPath = BUNDLED_PLAYBOOKS
    # Values for link templates in playbooks, for example grafana_url.
    vars: dict[str, str] = Field(default_factory=dict)


# --- remediation ---------------------------------------------------------------------------------------
class SshExecutorConfig(StrictModel):
    """SSH to a forced command (scripts/gpu-node-actions.sh): the bot sends only a fixed verb."""

    address: str = Field(min_length=1)
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(min_length=1)
    key_file: ConfigPath
    known_hosts: ConfigPath
    timeout: Duration = 120.0

    @field_validator("key_file", "known_hosts")
    @classmethod
    def _file_exists(cls, value: Path) -> Path:
        if not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value


# What the Docker and Kubernetes executors can do: restart a named container or delete a node's pod.
DOCKER_ACTIONS = frozenset({"restart-dcgm-exporter", "restart-inference-server"})


class DockerExecutorConfig(StrictModel):
    """The Docker Engine API: a unix socket on the GPU node itself, or TCP with mutual TLS."""

    url: str = "unix:///var/run/docker.sock"
    ca_file: ConfigPath | None = None
    cert_file: ConfigPath | None = None
    key_file: ConfigPath | None = None
    # action -> container name, for example {restart-dcgm-exporter: dcgm-exporter}
    containers: dict[str, str] = Field(default_factory=dict)
    stop_timeout: int = Field(default=10, ge=0, le=600)
    timeout: Duration = 60.0

    @field_validator("containers")
    @classmethod
    def _restart_actions(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - DOCKER_ACTIONS)
        if unknown:
            raise ValueError(f"Docker can run only {', '.join(sorted(DOCKER_ACTIONS))}, not {', '.join(unknown)}")
        return value

    @model_validator(mode="after")
    def _timeout_covers_stop(self) -> DockerExecutorConfig:
        # A restart answers only once the container stopped (up to stop_timeout) and started again.
        if self.timeout <= self.stop_timeout:
            raise ValueError("timeout must be longer than stop_timeout: a restart blocks until the container is back")
        return self


class RemediationHost(StrictModel):
    ssh: SshExecutorConfig | None = None
    docker: DockerExecutorConfig | None = None
    # The host's node name in Kubernetes, when remediation.kubernetes is set.
    kubernetes_node: str | None = None


class KubernetesExecutorConfig(StrictModel):
    kubeconfig: ConfigPath | None = None  # None: in-cluster, from the service account
    namespace: str = "gpu-operator"
    # action -> label selector of the pod to delete on the alert's node (its DaemonSet/Deployment recreates it)
    pods: dict[str, str] = Field(default_factory=lambda: {"restart-dcgm-exporter": "app=nvidia-dcgm-exporter"})
    timeout: Duration = 30.0

    @field_validator("pods")
    @classmethod
    def _restart_actions(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - DOCKER_ACTIONS)
        if unknown:
            raise ValueError(f"pods restart for {', '.join(sorted(DOCKER_ACTIONS))}, not {', '.join(unknown)}")
        return value


class ActionPolicyConfig(StrictModel):
    enabled: bool | None = None  # None: on, except for dangerous actions
    approval: bool = False  # dangerous actions always need one
    dry_run: bool = False
    cooldown: Duration = 1800.0
    automatic: bool = False
    verify_within: Duration = 180.0


class CircuitBreakerConfig(StrictModel):
    max_hosts: int = Field(default=3, ge=1)
    window: Duration = 600.0


class RemediationConfig(StrictModel):
    dry_run: bool = False
    approvers: list[str] = Field(default_factory=list)
    admins: list[str] = Field(default_factory=list)
    second_approver: bool = False
    approval_ttl: Duration = 900.0
    max_concurrent: int = Field(default=2, ge=1)
    host_labels: list[str] = Field(default_factory=lambda: list(DEFAULT_HOST_LABELS))
    hosts: dict[str, RemediationHost] = Field(default_factory=dict)
    kubernetes: KubernetesExecutorConfig | None = None
    actions: dict[str, ActionPolicyConfig] = Field(default_factory=dict)
    circuit_breaker: CircuitBreakerConfig = CircuitBreakerConfig()
    prometheus: PrometheusConfig | None = None  # for verification; default: enrichment.prometheus
    poll_interval: Duration = 5.0
    # Bearer token of the local admin endpoint that `gpu-alert-bot run|approve|refuse` call; unset: off.
    admin_token_file: SecretFile | None = None

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, value: dict[str, ActionPolicyConfig]) -> dict[str, ActionPolicyConfig]:
        from bot.playbooks import ACTIONS  # bot.playbooks imports this module

        unknown = sorted(set(value) - set(ACTIONS))
        if unknown:
            raise ValueError(f"unknown actions {', '.join(unknown)} (known: {', '.join(ACTIONS)})")
        return value


# --- receivers -----------------------------------------------------------------------------------------
class ConsoleReceiver(StrictModel):
    type: Literal["console"]
    name: str = Field(min_length=1)


class SlackReceiver(StrictModel):
    type: Literal["slack"]
    name: str = Field(min_length=1)
    channel: str = Field(min_length=1)
    token_file: SecretFile
    api_url: HttpUrlText = "https://slack.com/api/"
    timeout: Duration = 10.0
    messages_per_second: float = Field(default=1.0, gt=0)
    # More than storm_threshold new alerts in storm_window: one summary message, details in its thread.
    storm_threshold: int = Field(default=5, ge=1)
    storm_window: Duration = 60.0


class EmailReceiver(StrictModel):
    type: Literal["email"]
    name: str = Field(min_length=1)
    to: list[str] = Field(min_length=1)
    sender: str = Field(alias="from", min_length=3)
    smarthost: Annotated[str, PlainValidator(_smarthost)]
    security: Literal["starttls", "tls", "none"] = "starttls"
    # Sending without TLS is refused unless this is set, for a relay on the same host or network.
    allow_plaintext: bool = False
    username: str | None = None
    password_file: SecretFile | None = None
    ca_file: ConfigPath | None = None
    timeout: Duration = 30.0

    @model_validator(mode="after")
    def _plaintext_is_explicit(self) -> EmailReceiver:
        problems = email_problems(self.model_dump(by_alias=True))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @field_validator("to")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            _check_address(address)
        return value

    @field_validator("sender")
    @classmethod
    def _sender_address(cls, value: str) -> str:
        _check_address(value)
        return value

    @field_validator("ca_file")
    @classmethod
    def _ca_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"CA file {value} not found")
        return value


def email_problems(receiver: Mapping[str, Any]) -> list[str]:
    """Checks across an email receiver's keys, on the receiver as a mapping: the validated one, or the file's
    when one of its keys is invalid (so these are reported with that key's error). What cannot be told from
    invalid values is not checked."""
    security = receiver.get("security", "starttls")
    try:
        plaintext = _BOOL.validate_python(receiver.get("allow_plaintext", False))
    except ValidationError:
        return []
    if security not in ("starttls", "tls", "none"):
        return []
    username, password = receiver.get("username") is not None, receiver.get("password_file") is not None
    problems = []
    if security == "none" and not plaintext:
        problems.append("security: none sends mail in clear text; set allow_plaintext: true to accept that")
    if security != "none" and plaintext:
        problems.append(
            f"allow_plaintext only applies to security: none; with {security} a server without TLS is refused"
        )
    if username != password:
        problems.append("username and password_file go together")
    if security == "none" and username:
        problems.append("SMTP AUTH without TLS would send the password in clear text; use starttls or tls")
    return problems


def _check_address(value: str) -> None:
    """An address such as `oncall@example.com` or `GPU alerts <oncall@example.com>`."""
    _display, address = email.utils.parseaddr(value)
    local, at, domain = address.rpartition("@")
    if not (local and at and domain) or any(c.isspace() for c in address):
        raise ValueError(f"{value!r} is not an email address such as oncall@example.com")


PagerDutySeverity = Literal["critical", "error", "warning", "info"]


def _default_severity_map() -> dict[str, PagerDutySeverity]:
    return {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}


class PagerDutyReceiver(StrictModel):
    type: Literal["pagerduty"]
    name: str = Field(min_length=1)
    routing_key_file: SecretFile
    url: HttpUrlText = "https://events.pagerduty.com/v2/enqueue"
    timeout: Duration = 10.0
    client: str = "gpu-alert-bot"
    client_url: HttpUrlText | None = None
    # Alert `severity` label (any case) -> PagerDuty severity; labels missing from the map get default_severity.
    severity_map: dict[str, PagerDutySeverity] = Field(default_factory=_default_severity_map)
    default_severity: PagerDutySeverity = "error"
    # Wait after a 429 before the next attempt; PagerDuty asks for a backoff of minutes rather than seconds.
    rate_limit_delay: Duration = 60.0
    # Page with the severity a verdict lowered the message to (a stale Xid gauge: info) instead of the alert's own.
    downgrade_on_verdict: bool = False

    @field_validator("routing_key_file")
    @classmethod
    def _integration_key(cls, value: Secret) -> Secret:
        if len(value.get()) != 32:
            raise ValueError(f"{value.path} must hold a 32-character Events API v2 integration key")
        return value

    @field_validator("severity_map")
    @classmethod
    def _case_insensitive(cls, value: dict[str, PagerDutySeverity]) -> dict[str, PagerDutySeverity]:
        return {label.lower(): severity for label, severity in value.items()}


Receiver = Annotated[ConsoleReceiver | SlackReceiver | EmailReceiver | PagerDutyReceiver, Field(discriminator="type")]


# --- routing -------------------------------------------------------------------------------------------
def _check_matcher(value: str) -> str:
    _name, op, pattern = parse_matcher(value)
    if op in ("=~", "!~"):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{value!r}: bad regular expression: {exc}") from None
    return value


Matcher = Annotated[str, AfterValidator(_check_matcher)]


def parse_matcher(value: str) -> tuple[str, str, str]:
    """(label, operator, value) of an Alertmanager-style matcher such as `severity="critical"`.

    Like Alertmanager, the value may be bare or double-quoted; inside it `\\"`, `\\\\` and `\\n` are escapes and any
    other backslash stays literal, so `host=~"gpu\\d+"` keeps its regex escape.
    """
    match = _MATCHER.match(value)
    if match is None:
        raise ValueError(f'{value!r} is not a matcher such as severity="critical" or alertname=~"GPU.*"')
    return match.group("name"), match.group("op"), _unescape_matcher_value(value, match.group("value"))


def _unescape_matcher_value(matcher: str, raw: str) -> str:
    if raw.startswith('"'):
        if len(raw) < 2 or not raw.endswith('"') or _ends_with_escape(raw[1:-1]):
            raise ValueError(f"{matcher!r}: the value's closing double quote is missing")
        raw = raw[1:-1]
    value: list[str] = []
    chars = iter(raw)
    for char in chars:
        if char == '"':
            raise ValueError(f'{matcher!r}: a double quote inside the value must be escaped as \\"')
        if char != "\\":
            value.append(char)
            continue
        following = next(chars, "")
        value.append({"n": "\n", '"': '"', "\\": "\\"}.get(following, "\\" + following))
    return "".join(value)


def _ends_with_escape(text: str) -> bool:
    """True when the text ends with an odd number of backslashes, so a quote after it would be escaped."""
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


class RouteRule(StrictModel):
    matchers: list[Matcher] = Field(default_factory=list)
    # An empty list records the alert and notifies nobody (e.g. the always-firing Watchdog).
    receivers: list[str]
    continue_: bool = Field(default=False, alias="continue")


class RoutingConfig(StrictModel):
    rules: list[RouteRule] = Field(default_factory=list)
    default: list[str] = Field(default_factory=lambda: ["console"])


# --- Slack interactivity ----------------------------------------------------------------------------------
_SLACK_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,}$")
_SLACK_GROUP_ID = re.compile(r"^S[A-Z0-9]{2,}$")
# Who may use each command (and the buttons that do the same) unless `permissions` says otherwise.
DEFAULT_PERMISSIONS: Mapping[str, str] = {
    "list": "viewer",
    "silences": "viewer",
    "status": "viewer",
    "ack": "responder",
    "unack": "responder",
    "silence": "responder",
    "unsilence": "responder",
}


def _slack_ids(pattern: re.Pattern[str], example: str) -> Any:
    def check(values: list[str]) -> list[str]:
        for value in values:
            if not pattern.match(value):
                raise ValueError(f"{value!r} is not a Slack id such as {example} (a name is not an id)")
        return values

    return AfterValidator(check)


class SlackRole(StrictModel):
    name: str = Field(min_length=1)
    users: Annotated[list[str], _slack_ids(_SLACK_USER_ID, "U024BE7LH")] = Field(default_factory=list)
    groups: Annotated[list[str], _slack_ids(_SLACK_GROUP_ID, "S0614TZR7")] = Field(default_factory=list)


class InteractivityConfig(StrictModel):
    """Slack commands and buttons. Roles are listed from least to most powerful: each may do what those before it
    may. `permissions` names, per command, the least role that may use it."""

    enabled: bool = True
    # The Slack receiver whose messages carry the buttons; its bot token answers and reads user groups.
    receiver: str = Field(min_length=1)
    signing_secret_file: SecretFile | None = None
    socket_mode: bool = False
    app_token_file: SecretFile | None = None
    # Where delayed answers may be posted: Slack's response_url must start with this.
    response_url_prefix: str = "https://hooks.slack.com/"
    timeout: Duration = 10.0
    roles: list[SlackRole] = Field(min_length=1)
    permissions: dict[str, str] = Field(default_factory=dict)
    silence_labels: list[str] = Field(default_factory=lambda: ["alertname", "host", "instance", "gpu"], min_length=1)
    max_silence: Duration = 7 * 86400.0
    silence_check_interval: Duration = 60.0
    group_cache: Duration = 300.0

    @model_validator(mode="after")
    def _consistent(self) -> InteractivityConfig:
        problems = []
        if self.socket_mode and self.app_token_file is None:
            problems.append("app_token_file: Socket Mode needs the app-level token (xapp-...) from a file")
        if not self.socket_mode and self.signing_secret_file is None:
            problems.append("signing_secret_file: Slack's requests are verified with the app's signing secret")
        names = [role.name for role in self.roles]
        if len(set(names)) != len(names):
            problems.append("roles: a role name is used twice")
        for command, role in self.effective_permissions.items():
            if role not in names:
                problems.append(f"permissions.{command}: {role!r} is not a configured role (roles: {', '.join(names)})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def effective_permissions(self) -> dict[str, str]:
        return {**DEFAULT_PERMISSIONS, **self.permissions}


def _default_receivers() -> list[Receiver]:
    return [ConsoleReceiver(type="console", name="console")]


class BotConfig(StrictModel):
    server: ServerConfig = ServerConfig()
    store: StoreConfig = StoreConfig()
    worker: WorkerConfig = WorkerConfig()
    outbox: OutboxConfig = OutboxConfig()
    logging: LoggingConfig = LoggingConfig()
    enrichment: EnrichmentConfig = EnrichmentConfig()
    playbooks: PlaybooksConfig = PlaybooksConfig()
    receivers: list[Receiver] = Field(default_factory=_default_receivers)
    routing: RoutingConfig = RoutingConfig()
    alertmanager: AlertmanagerConfig | None = None
    interactivity: InteractivityConfig | None = None
    deadman: DeadmanConfig = DeadmanConfig()
    remediation: RemediationConfig = RemediationConfig()

    @model_validator(mode="after")
    def _receivers_exist(self) -> BotConfig:
        problems = cross_section_problems(self.model_dump(by_alias=True))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="after")
    def _automatic_remediation_is_verified(self) -> BotConfig:
        automatic = sorted(name for name, policy in self.remediation.actions.items() if policy.automatic)
        if automatic and self.remediation.prometheus is None and self.enrichment.prometheus is None:
            raise ValueError(
                f"remediation.actions: {', '.join(automatic)} automatic needs Prometheus to verify it: set "
                "remediation.prometheus or enrichment.prometheus"
            )
        return self

    def secrets(self) -> Iterator[str]:
        """Every secret value in the configuration, so the log filter can mask them wherever they appear."""
        yield from _secrets_in(self)
        yield from self.store.dsn_password()


def cross_section_problems(config: Mapping[str, Any]) -> list[str]:
    """Checks across sections, one `key.path: problem` line each, on the configuration as a mapping: the
    validated one, or the file's when some key is invalid (so these are reported with the key errors). A value
    too broken to tell (receivers that are not a list, a duration that does not parse) is not checked."""
    names = _receiver_names(config)
    problems = [] if names is None else _receiver_problems(names, _section(config, "routing"))
    retention = _duration_or_none(_section(config, "store"), "retention", _default(StoreConfig, "retention"))
    window = _duration_or_none(
        _section(config, "enrichment"), "recurrence_window", _default(EnrichmentConfig, "recurrence_window")
    )
    problems += _interactivity_problems(config, names)
    if retention is not None and window is not None and retention < window:
        problems.append(
            "store.retention: shorter than enrichment.recurrence_window; the GPU history that recurrence "
            "counts would be pruned before the window ends"
        )
    return problems


def _interactivity_problems(config: Mapping[str, Any], names: list[tuple[int, str]] | None) -> list[str]:
    """The interactivity section needs a Slack receiver to act through and Alertmanager for silences."""
    section = _section(config, "interactivity")
    if not section:
        return []
    problems = []
    receiver = section.get("receiver")
    receivers = config.get("receivers")
    slack = (
        [r.get("name") for r in receivers if isinstance(r, Mapping) and r.get("type") == "slack"]
        if isinstance(receivers, list)
        else []
    )
    if names is not None and isinstance(receiver, str) and receiver not in slack:
        problems.append(f"interactivity.receiver: {receiver!r} is not a configured Slack receiver")
    if not _section(config, "alertmanager"):
        problems.append("interactivity: silences need the alertmanager section (its API URLs)")
    return problems


def _receiver_names(config: Mapping[str, Any]) -> list[tuple[int, str]] | None:
    """(position, name) of each receiver that has a name; None when the receivers are not a list."""
    if "receivers" not in config:
        return list(enumerate(r.name for r in _default_receivers()))
    receivers = config["receivers"]
    if not isinstance(receivers, list):
        return None
    return [
        (i, receiver["name"])
        for i, receiver in enumerate(receivers)
        if isinstance(receiver, Mapping) and isinstance(receiver.get("name"), str)
    ]


def _receiver_problems(names: list[tuple[int, str]], routing: Mapping[str, Any]) -> list[str]:
    """Receiver names used twice, and routes to receivers that do not exist."""
    seen: set[str] = set()
    problems = []
    for i, name in names:
        if name in seen:
            problems.append(f"receivers.{i}.name: {name!r} is used by more than one receiver; names must be unique")
        seen.add(name)
    configured = ", ".join(dict.fromkeys(name for _, name in names)) or "none"
    problems += [
        f"{where}: {name!r} is not a configured receiver (configured: {configured})"
        for where, name in _routes(routing)
        if name not in seen
    ]
    return problems


def _routes(routing: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key path, receiver name) of every receiver the routing names."""
    lists = [("routing.default", routing.get("default", _default(RoutingConfig, "default")))]
    rules = routing.get("rules", [])
    if isinstance(rules, list):
        lists += [
            (f"routing.rules.{r}.receivers", rule.get("receivers"))
            for r, rule in enumerate(rules)
            if isinstance(rule, Mapping)
        ]
    return [
        (f"{where}.{i}", name)
        for where, names in lists
        if isinstance(names, list)
        for i, name in enumerate(names)
        if isinstance(name, str)
    ]


def _section(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A section as a mapping: an absent or empty one (`routing:` with only comments) is {}, its defaults; one
    that is not a mapping is {} too, since its own error is reported."""
    value = config.get(key)
    return value if isinstance(value, Mapping) else {}


def _default(model: type[BaseModel], key: str) -> Any:
    return model.model_fields[key].get_default(call_default_factory=True)


def _duration_or_none(section: Mapping[str, Any], key: str, default: float) -> float | None:
    if key not in section:
        return default
    try:
        return parse_duration(section[key])
    except ValueError:
        return None


def _secrets_in(model: BaseModel) -> Iterator[str]:
    return (secret.get() for secret in _secret_files(model))


def _secret_files(model: BaseModel) -> Iterator[Secret]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, Secret):
                yield item
            elif isinstance(item, BaseModel):
                yield from _secret_files(item)


def secret_file_warnings(config: BotConfig) -> list[str]:
    """Secret files that every user of the host can read: `check-config` and `serve` warn about each."""
    return [
        f"{secret.path}: secret file readable by every user of this host; chmod o-r it"
        for secret in _secret_files(config)
        if secret.readable_by_everyone()
    ]


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> BotConfig:
    """Read and validate the configuration; raise ConfigError with one line per problem."""
    data: dict[str, Any] = {}
    duplicates: list[str] = []
    base_dir = Path.cwd()
    if path is not None:
        base_dir = path.resolve().parent
        data, duplicates = _read_yaml(path)
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        config = BotConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        errors = exc.errors()
        problems = [line for error in errors for line in _describe(error)]
        raise ConfigError(duplicates + problems + _checks_not_run(data, [error["loc"] for error in errors])) from None
    if duplicates:
        raise ConfigError(duplicates)
    return config


def _checks_not_run(data: Mapping[str, Any], failed: list[tuple[int | str, ...]]) -> list[str]:
    """The checks across keys that pydantic skipped because a key they read was invalid (a model validator runs
    only once every field is valid), run on the file's values so every problem shows at once. A check that did
    run and found something has its own error at its model's location."""
    problems = []
    receivers = data.get("receivers")
    for i, receiver in enumerate(receivers if isinstance(receivers, list) else []):
        where = ("receivers", i, "email")
        if isinstance(receiver, Mapping) and receiver.get("type") == "email" and where not in failed:
            problems += [f"receivers.{i}.email: {problem}" for problem in email_problems(receiver)]
    if () not in failed:
        problems += cross_section_problems(data)
    return problems


def _read_yaml(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The file's mapping, and a `file:line: key.path: problem` line for each key written twice in one mapping
    (YAML would keep the last one silently)."""
    try:
        document = read_document(path)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except NotUtf8Error as exc:
        raise ConfigError([f"{path}:{exc.line}: {exc}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError([f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from None
    data = document.data
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of sections (server, store, ...)"])
    duplicates = [
        f"{path}:{line}: {'.'.join(str(part) for part in loc)}: {problem}; YAML would keep only the last one"
        for line, loc, problem in duplicate_keys(document.root)
    ]
    return data, duplicates


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value


def _describe(error: Any) -> list[str]:
    """`key.path: problem` lines for one pydantic error; checks across sections already name their keys."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:
        return message.splitlines()
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        message = "unknown key (check the spelling against config/bot.example.yaml)"
    return [f"{where}: {line}" for line in message.splitlines()]
