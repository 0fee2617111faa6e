"""The whole file as one model, the checks across its sections, and the secrets it holds."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, Field, model_validator

from bot.config.alertmanager import AlertmanagerConfig, DeadmanConfig
from bot.config.base import StrictModel
from bot.config.duration import parse_duration
from bot.config.enrichment import EnrichmentConfig, PlaybooksConfig
from bot.config.incidents import IncidentsConfig
from bot.config.interactivity import InteractivityConfig
from bot.config.receivers import ConsoleReceiver, Receiver
from bot.config.remediation import RemediationConfig
from bot.config.routing import RoutingConfig
from bot.config.secrets import Secret, bot_only_advice
from bot.config.server import ServerConfig
from bot.config.store import LoggingConfig, OutboxConfig, StoreConfig, WorkerConfig


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
    incidents: IncidentsConfig = IncidentsConfig()
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
        f"{secret.path}: secret file readable by every user of this host; {bot_only_advice()}"
        for secret in _secret_files(config)
        if secret.readable_by_everyone()
    ]


def role_warnings(config: BotConfig) -> list[str]:
    """Permissions nobody holds because their role is not configured: `check-config` and `serve` warn about
    each role, with what it locks."""
    section = config.interactivity
    if section is None or not section.enabled:
        return []
    configured = ", ".join(role.name for role in section.roles)
    return [
        f"interactivity.roles: no {role!r} role is configured (roles: {configured}), so nobody may use "
        f"{', '.join(permissions)} from Slack: a role that is not configured grants nothing; add the role, or "
        f"give these permissions to a configured one in interactivity.permissions"
        for role, permissions in section.unconfigured_roles(remediation=bool(config.remediation.hosts)).items()
    ]
