"""Slurm: the scheduler, reached over SSH to scripts/slurm-node-actions.sh on a host whose scontrol reaches
slurmctld. Remediation (drain, resume) and enrichment (the jobs on a GPU) each name their own access, so the
enrichment's key can be one the script allows to read only (its VERBS setting)."""

from __future__ import annotations

from pydantic import Field

from bot.config.base import StrictModel
from bot.config.duration import Duration
from bot.config.ssh import SshExecutorConfig

# One Slurm node name: never a host list (no brackets, no commas), never an option.
SLURM_NODE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class SlurmConfig(StrictModel):
    """The account on the scheduler's host whose key forces scripts/slurm-node-actions.sh."""

    ssh: SshExecutorConfig


class SlurmEnrichmentConfig(SlurmConfig):
    """The jobs on an alert's GPU, asked of the scheduler (`squeue --json`, once for a batch of alerts)."""

    # Alert host -> Slurm node name, where they differ; otherwise the host's short name is the node's.
    host_map: dict[str, str] = Field(default_factory=dict)
    timeout: Duration = 2.0
    # Alerts within this long of an answer share it (the jobs of a storm's hosts are asked once).
    cache_ttl: Duration = 15.0
