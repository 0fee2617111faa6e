"""Reading the YAML file: one `key.path: problem` line per error, every problem at once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from bot.config.receivers import email_problems
from bot.config.root import BotConfig, cross_section_problems
from bot.config.wording import key_path, plain_error
from bot.yamldoc import Document, NotUtf8Error, duplicate_keys, read_document


class Problem(str):
    """One problem, `key.path: what is wrong`, and where the file says it (`bot.yaml:12`) when known. A str, so a
    problem compares equal to its text; `located` gives both, as check-config prints it."""

    where: str

    def __new__(cls, text: str, where: str = "") -> Problem:
        problem = super().__new__(cls, text)
        problem.where = where
        return problem


def located(problem: str) -> str:
    """`file:line: key.path: what is wrong` where the line is known, else the problem as it is."""
    return f"{problem.where}: {problem}" if isinstance(problem, Problem) and problem.where else problem


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> BotConfig:
    """Read and validate the configuration; raise ConfigError with one line per problem."""
    data: dict[str, Any] = {}
    duplicates: list[str] = []
    document: Document | None = None
    base_dir = Path.cwd()
    if path is not None:
        base_dir = path.resolve().parent
        document, duplicates = _read_yaml(path)
        data = document.data or {}
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        config = BotConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        errors = exc.errors()
        problems: list[str] = [*duplicates, *(line for error in errors for line in _describe(error, data, document))]
        problems += [_located(problem, document) for problem in _checks_not_run(data, [e["loc"] for e in errors])]
        raise ConfigError(problems) from None
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
            problems += [f"receivers.{i}: {problem}" for problem in email_problems(receiver)]
    if () not in failed:
        problems += cross_section_problems(data)
    return problems


def _read_yaml(path: Path) -> tuple[Document, list[str]]:
    """The file's document (a mapping, or nothing), and a `file:line: key.path: problem` line for each key written
    twice in one mapping (YAML would keep the last one silently)."""
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
    if document.data is None:
        return document, []
    if not isinstance(document.data, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of sections (server, store, ...)"])
    duplicates = [
        f"{path}:{line}: {'.'.join(str(part) for part in loc)}: {problem}; YAML would keep only the last one"
        for line, loc, problem in duplicate_keys(document.root)
    ]
    return document, duplicates


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


def _describe(error: ErrorDetails, data: Mapping[str, Any], document: Document | None) -> list[Problem]:
    """`key.path: problem` lines for one pydantic error, in words, each with the line of the file it is about;
    checks across sections already name their keys."""
    extra, message = plain_error(error)
    if not error["loc"]:
        return [_located(line, document) for line in message.splitlines()]
    loc = (*key_path(error, data), *extra)
    where = "" if document is None else f"{document.path}:{document.line(loc)}"
    key = ".".join(str(part) for part in loc)
    return [Problem(f"{key}: {line}", where) for line in message.splitlines()]


def _located(problem: str, document: Document | None) -> Problem:
    """A check across sections says its key path first (`routing.default.1: ...`): the line is that key's."""
    key = problem.split(": ", 1)[0]
    loc = tuple(int(part) if part.isdigit() else part for part in key.split("."))
    if document is None or " " in key or not isinstance(document.data, Mapping) or loc[0] not in document.data:
        return Problem(problem)
    return Problem(problem, f"{document.path}:{document.line(loc)}")
