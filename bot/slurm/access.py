"""The scheduler over SSH: one connection per request to an account whose key forces
scripts/slurm-node-actions.sh. A request is a fixed verb, a node name from the configuration (checked again by the
script) and, for a drain, a reason the bot composes; the host key is pinned by the configured known_hosts file."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.config import SshExecutorConfig
from bot.config.slurm import SLURM_NODE
from bot.sshrun import SshFailure, ssh_run

NODE_NAME = re.compile(SLURM_NODE)
# What the script accepts in a reason; anything else is left out before it is sent.
_REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 _.:#/-]")


class SchedulerError(Exception):
    """The scheduler could not be asked (connection refused, host key mismatch, timeout)."""


@dataclass(frozen=True)
class Answer:
    status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def text(self) -> str:
        """What the scheduler said: its error when it failed, else its output."""
        said = (self.stderr.strip() if not self.ok else "") or self.stdout.strip()
        return said or f"exit status {self.status}"


def reason_text(words: str, limit: int = 200) -> str:
    """Words safe to send as a drain reason: the script's alphabet, one line, at most `limit` characters."""
    return " ".join(_REASON_UNSAFE.sub(" ", words).split())[:limit].strip()


class SlurmAccess:
    def __init__(self, config: SshExecutorConfig, timeout: float | None = None) -> None:
        self.config = config
        self._timeout = config.timeout if timeout is None else timeout

    def where(self) -> str:
        return f"{self.config.user}@{self.config.address}:{self.config.port}"

    async def ask(self, verb: str, node: str | None = None, reason: str = "") -> Answer:
        words = [verb]
        if node is not None:
            if not NODE_NAME.fullmatch(node):
                raise SchedulerError(f"{node!r} is not a Slurm node name")
            words.append(node)
        if reason:
            words.append(reason_text(reason))
        config = self.config
        try:
            answer = await ssh_run(config, " ".join(words), self._timeout)
        except SshFailure as exc:
            raise SchedulerError(f"{self.where()}: {exc}") from exc
        return Answer(answer.exit_status, answer.stdout, answer.stderr)
