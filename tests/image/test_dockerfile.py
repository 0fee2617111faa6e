"""Cheap checks of the Dockerfile, in the suite (scripts/test-image builds and runs it): the mistakes that would
otherwise show only in a built image. The wheel stage must copy every directory the package data comes from (a
missing one builds a wheel without playbooks or rules, silently), and the HEALTHCHECK must ask the bot through the
configuration `serve` runs with (a port written in the HEALTHCHECK would be a second place to change)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

from tests.support.processes import REPO

DOCKERFILE = REPO / "Dockerfile"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments left out."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _stages(text: str) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions(text):
        if instruction[0] == "FROM":
            stages.append([])
        if stages:  # an ARG before the first FROM belongs to no stage
            stages[-1].append(instruction)
    return stages


def copied_sources(text: str) -> set[Path]:
    """What the first (wheel) stage copies from the build context."""
    copied = set()
    for keyword, arguments in _stages(text)[0]:
        if keyword == "COPY" and not arguments.startswith("--from"):
            *sources, _destination = arguments.split()
            copied.update(Path(source) for source in sources)
    return copied


def package_data_sources() -> set[Path]:
    """The repository directories the package data is read from, through the links under bot/."""
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["bot"]
    directories = {(REPO / "bot" / pattern.split("/")[0]) for pattern in package_data}
    return {directory.resolve().relative_to(REPO) for directory in directories}


def _exec_form(text: str, keyword: str) -> list[str]:
    [arguments] = [arguments for found, arguments in _instructions(text) if found == keyword]
    if keyword == "HEALTHCHECK":
        arguments = arguments[arguments.index("CMD") + len("CMD") :]
    command: list[str] = json.loads(arguments)
    return command


def wheel_stage_problems(text: str) -> list[str]:
    missing = ({Path("pyproject.toml"), Path("bot")} | package_data_sources()) - copied_sources(text)
    return [f"the wheel stage does not copy {path}" for path in sorted(missing)]


def healthcheck_problems(text: str) -> list[str]:
    serve, health = _exec_form(text, "CMD"), _exec_form(text, "HEALTHCHECK")
    if health[:2] != ["gpu-alert-bot", "healthcheck"] or "--config" not in health:
        return [f"HEALTHCHECK does not run `gpu-alert-bot healthcheck --config ...`: {health}"]
    problems = []
    if health[health.index("--config") + 1] != serve[serve.index("--config") + 1]:
        problems.append(f"HEALTHCHECK reads another configuration than CMD: {health} / {serve}")
    problems.extend(f"HEALTHCHECK names a port of its own: {arg}" for arg in health if re.search(r":\d+", arg))
    return problems


def test_the_wheel_stage_copies_every_directory_the_package_data_comes_from() -> None:
    assert package_data_sources() == {Path("playbooks"), Path("config/rules")}
    assert wheel_stage_problems(DOCKERFILE.read_text()) == []


def test_a_wheel_stage_without_the_rules_is_caught() -> None:
    broken = DOCKERFILE.read_text().replace("COPY config/rules ./config/rules\n", "")
    assert wheel_stage_problems(broken) == ["the wheel stage does not copy config/rules"]


def test_the_healthcheck_asks_the_bot_on_the_port_of_the_configuration_serve_runs_with() -> None:
    text = DOCKERFILE.read_text()
    assert _exec_form(text, "CMD")[:2] == ["gpu-alert-bot", "serve"]
    assert healthcheck_problems(text) == []


def test_a_healthcheck_on_a_port_of_its_own_is_caught() -> None:
    text = DOCKERFILE.read_text()
    [health] = [arguments for keyword, arguments in _instructions(text) if keyword == "HEALTHCHECK"]
    command = health[health.index("CMD") :]
    wrong_port = 'CMD ["python", "-c", "import urllib.request as u; u.urlopen(\'http://127.0.0.1:9099/healthz\')"]'
    other_config = command.replace("/etc/gpu-alert-bot/bot.yaml", "/etc/other.yaml")
    assert len(healthcheck_problems(_replaced(text, command, wrong_port))) == 1
    assert len(healthcheck_problems(_replaced(text, command, other_config))) == 1


def _replaced(text: str, command: str, replacement: str) -> str:
    """The Dockerfile with the HEALTHCHECK's CMD replaced (its continuation lines joined first)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    assert command in joined
    return joined.replace(command, replacement)


def test_the_bot_runs_as_uid_and_group_10001_which_the_compose_stacks_alertmanager_joins() -> None:
    """The secret-file advice (group 10001 and mode 0440, or owner 10001 and 0400) holds in the image: its user
    is uid 10001 in group 10001, and Alertmanager, which reads the same webhook token, is a member."""
    [run] = [arguments for keyword, arguments in _stages(DOCKERFILE.read_text())[-1] if "useradd" in arguments]
    assert "groupadd --system --gid 10001 gpu-alert-bot" in run
    assert "useradd --system --uid 10001 --gid 10001 " in run
    assert ("USER", "gpu-alert-bot") in _stages(DOCKERFILE.read_text())[-1]
    compose = yaml.safe_load((REPO / "config" / "docker-compose.yml").read_text())
    alertmanager = compose["services"]["alertmanager"]
    assert "webhook_token" in alertmanager["secrets"]
    assert alertmanager["group_add"] == ["10001"]
