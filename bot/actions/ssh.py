"""The SSH executor: one connection per action to a configured host, whose `authorized_keys` entry forces
scripts/gpu-node-actions.sh. The bot sends only a fixed verb (and a checked GPU index); the script maps it to
the command. The host key is pinned by the configured known_hosts file."""

from __future__ import annotations

from bot.actions.executor import ExecResult, ExecutorError, RunContext
from bot.config import SshExecutorConfig
from bot.sshrun import SshFailure, ssh_run

# The verbs scripts/gpu-node-actions.sh knows, and whether each takes the GPU index.
SSH_VERBS: dict[str, bool] = {
    "collect-diagnostics": True,
    "restart-dcgm-exporter": False,
    "restart-inference-server": False,
    "run-dcgm-diag": True,
    "lower-power-limit": True,
    "reset-gpu": True,
    "reboot-node": False,
}


class SshExecutor:
    kind = "ssh"

    def __init__(self, host: str, config: SshExecutorConfig) -> None:
        self._host = host
        self._config = config

    def actions(self) -> frozenset[str]:
        return frozenset(SSH_VERBS)

    def command(self, action: str, gpu: str | None) -> str:
        if action not in SSH_VERBS:
            raise ExecutorError(f"the SSH executor has no verb for {action}")
        if SSH_VERBS[action]:
            if gpu is None:
                raise ExecutorError(f"{action} needs the alert's gpu label")
            return f"{action} {gpu}"
        return action

    def describe(self, action: str, gpu: str | None, context: RunContext | None = None) -> str:
        config = self._config
        verb = self.command(action, gpu)
        return f"ssh {config.user}@{config.address}:{config.port} ({self._host}) with verb {verb!r}"

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
        command = self.command(action, gpu)
        try:
            answer = await ssh_run(self._config, command, self._config.timeout)
        except SshFailure as exc:
            raise ExecutorError(f"{self._host}: {exc}") from exc
        output = answer.stdout + answer.stderr
        return ExecResult(ok=answer.exit_status == 0, output=output or f"exit status {answer.exit_status}")
