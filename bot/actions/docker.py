"""The Docker executor: restart a container the configuration names, through the Docker Engine API (a unix
socket when the bot runs on the GPU node, or TCP with mutual TLS; bot/dockerengine.py). aiodocker negotiates the
API version with the engine; the call's timeout is longer than the stop grace period, since a restart answers
only once the container is back."""

from __future__ import annotations

import aiodocker
import aiohttp

from bot.actions.executor import ExecResult, ExecutorError, RunContext
from bot.config import DOCKER_ACTIONS, DockerExecutorConfig
from bot.dockerengine import engine, engine_error


class DockerExecutor:
    kind = "docker"

    def __init__(self, host: str, config: DockerExecutorConfig) -> None:
        self._host = host
        self._config = config

    def actions(self) -> frozenset[str]:
        return frozenset(action for action in self._config.containers if action in DOCKER_ACTIONS)

    def describe(self, action: str, gpu: str | None, context: RunContext | None = None) -> str:
        config = self._config
        return f"docker restart -t {config.stop_timeout} {config.containers[action]} via {config.url} ({self._host})"

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
        config = self._config
        name = config.containers[action]
        timeout = aiohttp.ClientTimeout(total=config.timeout)
        try:
            async with engine(config, timeout) as docker:
                await docker.containers.container(name).restart(t=config.stop_timeout, timeout=timeout)
        except (aiodocker.DockerError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ExecutorError(str(engine_error(self._host, exc))) from exc
        return ExecResult(ok=True, output=f"container {name} restarted on {self._host}")
