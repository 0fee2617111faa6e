"""Reading the YAML file: one `key.path: problem` line per error, every problem at once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bot.config.receivers import email_problems
from bot.config.root import BotConfig, cross_section_problems
from bot.yamldoc import NotUtf8Error, duplicate_keys, read_document


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


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
