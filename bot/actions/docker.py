"""The Docker executor: restart a container the configuration names, through the Docker Engine API (a unix
socket when the bot runs on the GPU node, or TCP with mutual TLS). aiodocker negotiates the API version with
the engine; the call's timeout is longer than the stop grace period, since a restart answers only once the
container is back."""

from __future__ import annotations

import ssl

import aiodocker
import aiohttp

from bot.actions.executor import ExecResult, ExecutorError, RunContext
from bot.config import DOCKER_ACTIONS, DockerExecutorConfig

# The status aiodocker gives a DockerError when it got no answer at all (connection refused, TLS refused).
_NO_CONNECTION = 900


class DockerExecutor:
    kind = "docker"

    def __init__(self, host: str, config: DockerExecutorConfig) -> None:
        self._host = host
        self._config = config

    def actions(self) -> frozenset[str]:
        return frozenset(action for action in self._config.containers if action in DOCKER_ACTIONS)

    def describe(self, action: str, gpu: str | None) -> str:
        config = self._config
        return f"docker restart -t {config.stop_timeout} {config.containers[action]} via {config.url} ({self._host})"

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
        config = self._config
        name = config.containers[action]
        timeout = aiohttp.ClientTimeout(total=config.timeout)
        try:
            async with aiodocker.Docker(url=config.url, ssl_context=self._ssl_context(), timeout=timeout) as docker:
                await docker.containers.container(name).restart(t=config.stop_timeout, timeout=timeout)
        except aiodocker.DockerError as exc:
            if exc.status == _NO_CONNECTION:
                raise ExecutorError(f"{self._host}: Docker API unreachable: {exc.message}") from exc
            raise ExecutorError(f"{self._host}: Docker answered {exc.status}: {exc.message}") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ExecutorError(f"{self._host}: Docker API unreachable: {type(exc).__name__}: {exc}") from exc
        return ExecResult(ok=True, output=f"container {name} restarted on {self._host}")

    def _ssl_context(self) -> ssl.SSLContext | None:
        config = self._config
        if config.ca_file is None:
            return None
        context = ssl.create_default_context(cafile=str(config.ca_file))
        if config.cert_file is not None and config.key_file is not None:
            context.load_cert_chain(str(config.cert_file), str(config.key_file))
        return context
