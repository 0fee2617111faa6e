"""The YAML configuration file, validated by pydantic. Every key is documented in config/bot.example.yaml.

Secrets are never written in the file itself: keys ending in `_file` name a file whose content is the secret
(Docker/Kubernetes secrets), so nothing secret appears in the environment or `docker inspect`. Relative paths
are resolved against the directory of the configuration file, so the bot runs from any working directory.
"""

from __future__ import annotations

from bot.config.alertmanager import AlertmanagerConfig, DeadmanConfig
from bot.config.base import (
    LISTEN_EXAMPLE,
    ConfigPath,
    HttpUrlText,
    StrictModel,
    host_port,
    http_url,
    listen_address,
    split_listen,
)
from bot.config.duration import Duration, parse_duration
from bot.config.enrichment import (
    BUNDLED_PLAYBOOKS,
    EnrichmentConfig,
    LokiConfig,
    LokiSource,
    PlaybooksConfig,
    PrometheusConfig,
    PrometheusSource,
    SiteMatch,
)
from bot.config.incidents import IncidentsConfig
from bot.config.interactivity import DEFAULT_PERMISSIONS, InteractivityConfig, SlackRole
from bot.config.loading import ConfigError, load_config, located
from bot.config.receivers import (
    ConsoleReceiver,
    EmailReceiver,
    PagerDutyReceiver,
    PagerDutySeverity,
    Receiver,
    SlackReceiver,
    email_problems,
)
from bot.config.remediation import (
    DOCKER_ACTIONS,
    ActionPolicyConfig,
    CircuitBreakerConfig,
    DockerExecutorConfig,
    KubernetesExecutorConfig,
    RemediationConfig,
    RemediationHost,
)
from bot.config.root import BotConfig, cross_section_problems, role_warnings, secret_file_warnings
from bot.config.routing import Matcher, RouteRule, RoutingConfig
from bot.config.secrets import Secret, SecretFile
from bot.config.server import (
    BasicAuthConfig,
    PagesAuthConfig,
    PagesConfig,
    ProxyAuthConfig,
    ServerConfig,
    WebhookAuthConfig,
    is_loopback,
)
from bot.config.slurm import SlurmConfig, SlurmEnrichmentConfig
from bot.config.ssh import SshExecutorConfig
from bot.config.store import LoggingConfig, OutboxConfig, StoreConfig, WorkerConfig

__all__ = [
    "BUNDLED_PLAYBOOKS",
    "DEFAULT_PERMISSIONS",
    "DOCKER_ACTIONS",
    "LISTEN_EXAMPLE",
    "ActionPolicyConfig",
    "AlertmanagerConfig",
    "BasicAuthConfig",
    "BotConfig",
    "CircuitBreakerConfig",
    "ConfigError",
    "ConfigPath",
    "ConsoleReceiver",
    "DeadmanConfig",
    "DockerExecutorConfig",
    "Duration",
    "EmailReceiver",
    "EnrichmentConfig",
    "HttpUrlText",
    "IncidentsConfig",
    "InteractivityConfig",
    "KubernetesExecutorConfig",
    "LoggingConfig",
    "LokiConfig",
    "LokiSource",
    "Matcher",
    "OutboxConfig",
    "PagerDutyReceiver",
    "PagerDutySeverity",
    "PagesAuthConfig",
    "PagesConfig",
    "PlaybooksConfig",
    "PrometheusConfig",
    "PrometheusSource",
    "ProxyAuthConfig",
    "Receiver",
    "RemediationConfig",
    "RemediationHost",
    "RouteRule",
    "RoutingConfig",
    "Secret",
    "SecretFile",
    "ServerConfig",
    "SiteMatch",
    "SlackReceiver",
    "SlackRole",
    "SlurmConfig",
    "SlurmEnrichmentConfig",
    "SshExecutorConfig",
    "StoreConfig",
    "StrictModel",
    "WebhookAuthConfig",
    "WorkerConfig",
    "cross_section_problems",
    "email_problems",
    "host_port",
    "http_url",
    "is_loopback",
    "listen_address",
    "load_config",
    "located",
    "parse_duration",
    "role_warnings",
    "secret_file_warnings",
    "split_listen",
]
