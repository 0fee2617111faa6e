"""The compose files: each one validated by Debian's docker-compose (`config -q`), and the bot's service of
config/docker-compose.yml brought up by podman-compose, healthy by its own healthcheck, then torn down."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.image.podman import output, podman, run, wait_for

REPO = Path(__file__).resolve().parents[2]
SERVICE = "gpu-alert-bot"
COMPOSE_IMAGE_LINE = "image: gpu-alert-bot:latest"
# What docker-compose.gpu-node.yml's comment has the user put in .env on each GPU server.
NODE_ENV = {"NODE_NAME": "k-ai-01.lan", "LOKI_URL": "http://monitoring-vm.lan:3100"}


def compose_files() -> list[Path]:
    return sorted((REPO / "config").glob("docker-compose*.yml"))


def check_compose_files() -> str:
    """`docker-compose config -q` on each file as it ships, with Debian's docker-compose (1.29): what a user of
    Debian's package runs. Version 1 predates the Compose specification's top-level `name:`, so a file that sets
    one fails here as it would for them."""
    files = compose_files()
    if not files:
        raise AssertionError("no config/docker-compose*.yml")
    problems = []
    for path in files:
        done = run("docker-compose", "--project-directory", path.parent, "-f", path, "config", "-q", env=NODE_ENV)
        if done.returncode != 0:
            problems.append(f"{path.name}: {output(done)}")
    if problems:
        raise AssertionError("; ".join(problems))
    return ", ".join(path.name for path in files) + " valid"


def _stack_copy(image: str, workdir: Path) -> Path:
    """config/ and playbooks/ copied beside each other (the compose file mounts ../playbooks), with the secret
    files its README has the user create, and the bot's image named as the one just built."""
    stack = workdir / "stack"
    shutil.copytree(REPO / "config", stack / "config", ignore=shutil.ignore_patterns("secrets"))
    shutil.copytree(REPO / "playbooks", stack / "playbooks")
    secrets = stack / "config" / "secrets"
    secrets.mkdir()
    for name, value in (("webhook_token", "compose-check-token"), ("grafana_pw.txt", "compose-check-password")):
        (secrets / name).write_text(value + "\n")
        (secrets / name).chmod(0o444)
    compose = stack / "config" / "docker-compose.yml"
    text = compose.read_text()
    if COMPOSE_IMAGE_LINE not in text:
        raise AssertionError(f"docker-compose.yml no longer has {COMPOSE_IMAGE_LINE!r} for the bot")
    compose.write_text(text.replace(COMPOSE_IMAGE_LINE, f"image: {image}"))
    return compose


def check_compose_service(image: str, workdir: Path) -> str:
    compose = _stack_copy(image, workdir)
    project = f"gpu-alert-bot-check-{os.getpid()}"
    base = ("podman-compose", "--project-name", project, "-f", compose)
    up = run(*base, "up", "--detach", "--no-build", SERVICE, timeout=180)
    try:
        if up.returncode != 0:
            raise AssertionError(f"podman-compose up: {output(up)[-1500:]}")
        listed = podman(
            "ps", "--all", "--filter", f"label=io.podman.compose.project={project}", "--format", "{{.Names}}"
        )
        names = listed.stdout.split()
        if len(names) != 1:
            raise AssertionError(f"expected the bot's container alone, got {names}: {output(up)[-1500:]}")
        name = names[0]

        def healthy() -> bool | None:
            return True if podman("healthcheck", "run", name).returncode == 0 else None

        try:
            wait_for(f"{name} healthy (its compose healthcheck, /readyz)", healthy, timeout=60, every=1.0)
        except TimeoutError:
            raise AssertionError(f"not healthy: {output(podman('logs', name))[-1500:]}") from None
    finally:
        down = run(*base, "down", "--volumes", timeout=120)
        _remove_networks(project)
    if down.returncode != 0:
        raise AssertionError(f"podman-compose down: {output(down)[-1500:]}")
    left = podman("ps", "--all", "--filter", f"label=io.podman.compose.project={project}", "--format", "{{.Names}}")
    if left.stdout.strip():
        raise AssertionError(f"left after down: {left.stdout.split()}")
    return f"{name} healthy (compose healthcheck), then down with its volume"


def _remove_networks(project: str) -> None:
    """podman-compose 1.0's `down` leaves the networks it created (labelled with the project)."""
    listed = podman("network", "ls", "--filter", f"label=io.podman.compose.project={project}", "--format", "{{.Name}}")
    for network in listed.stdout.split():
        podman("network", "rm", network)
