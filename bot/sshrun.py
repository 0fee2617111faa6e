"""One request to a forced command over SSH (the node actions script, the Slurm script): the remediation executor
and the Slurm access share it. The key, the known hosts and no agent or ssh_config: only what configuration says."""

from __future__ import annotations

from dataclasses import dataclass

from bot.config import SshExecutorConfig


class SshFailure(Exception):
    """The request did not run: the host key is not the known one, or the connection failed; the text says which."""


@dataclass(frozen=True)
class SshAnswer:
    exit_status: int
    stdout: str
    stderr: str


async def ssh_run(config: SshExecutorConfig, request: str, seconds: float) -> SshAnswer:
    """`request` sent to the forced command at `config.address` (it reads it as SSH_ORIGINAL_COMMAND), the
    connection and the run each within `seconds`."""
    # Imported here: a bot that never acts over SSH does not pay for loading it.
    import asyncssh

    try:
        async with asyncssh.connect(
            config.address,
            port=config.port,
            username=config.user,
            client_keys=[str(config.key_file)],
            known_hosts=str(config.known_hosts),
            connect_timeout=seconds,
            agent_path=None,
            config=[],
        ) as connection:
            result = await connection.run(request, check=False, timeout=seconds)
    except asyncssh.HostKeyNotVerifiable as exc:
        raise SshFailure(f"host key not verified against {config.known_hosts}: {exc}") from exc
    except (asyncssh.Error, OSError, TimeoutError) as exc:
        raise SshFailure(f"ssh failed: {type(exc).__name__}: {exc}") from exc
    return SshAnswer(result.exit_status or 0, _text(result.stdout), _text(result.stderr))


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
