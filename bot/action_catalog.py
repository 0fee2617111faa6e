"""The actions a person may trigger from a message: their names, labels and safety classes. Playbooks name them,
the configuration enables them per target, and the remediation engine runs them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bot.message import Safety


@dataclass(frozen=True)
class ActionSpec:
    """An action a person may trigger from a message. Playbooks name them; a later stage executes them."""

    name: str
    label: str
    safety: Safety
    description: str
    # Acts on one GPU (the alert's `gpu` label) rather than on the whole host.
    per_gpu: bool = False


ACTIONS: Mapping[str, ActionSpec] = {
    spec.name: spec
    for spec in (
        ActionSpec("ack", "Acknowledge", "safe", "Mark the alert as being handled; repeats stop notifying."),
        ActionSpec("silence-1h", "Silence 1 h", "safe", "Alertmanager silence on this alert's labels for 1 h."),
        ActionSpec("silence-4h", "Silence 4 h", "safe", "Alertmanager silence on this alert's labels for 4 h."),
        ActionSpec(
            "silence-24h", "Silence 24 h", "guarded", "A day-long silence can hide a recurrence: asks for confirmation."
        ),
        ActionSpec(
            "collect-diagnostics",
            "Collect diagnostics",
            "safe",
            "Read-only: nvidia-smi -q, dcgmi health and the kernel's NVRM lines from the host, posted in the thread.",
            per_gpu=True,
        ),
        ActionSpec(
            "run-dcgm-diag",
            "Run DCGM diagnostic",
            "guarded",
            "dcgmi diag (-r 3 on datacenter GPUs, -r 1 on GeForce/RTX PRO) loads the GPU for minutes: only on a "
            "drained GPU, with nv-hostengine running.",
            per_gpu=True,
        ),
        ActionSpec(
            "restart-dcgm-exporter",
            "Restart dcgm-exporter",
            "guarded",
            "Restarts the exporter container on the host; GPU metrics have a gap of about a minute.",
        ),
        ActionSpec(
            "restart-inference-server",
            "Restart the inference server",
            "guarded",
            "Restarts the vLLM/NIM container: in-flight requests fail and the model reloads (minutes).",
        ),
        ActionSpec(
            "lower-power-limit",
            "Lower the GPU power limit",
            "guarded",
            "nvidia-smi -pl on this GPU: less heat and power at some throughput cost; reverts at reboot.",
            per_gpu=True,
        ),
        ActionSpec(
            "cordon-node", "Cordon node", "guarded", "No new work is scheduled on the host; running work continues."
        ),
        ActionSpec("uncordon-node", "Uncordon node", "guarded", "New work may be scheduled on the host again."),
        ActionSpec(
            "drain-node",
            "Drain node",
            "dangerous",
            "Kubernetes: evicts every pod from the host. Slurm: DRAIN with the alert's id as the reason; running "
            "jobs finish, no new one starts.",
        ),
        ActionSpec(
            "resume-node",
            "Resume node",
            "guarded",
            "Slurm: RESUME, the node takes jobs again (undoes a drain). Only for a node fixed or judged healthy.",
        ),
        ActionSpec(
            "reset-gpu",
            "Reset GPU",
            "dangerous",
            "nvidia-smi -r -i <UUID>: dcgm-exporter (and nv-hostengine) stopped first and no process left on the "
            "GPU, or the reset fails.",
            per_gpu=True,
        ),
        ActionSpec("reboot-node", "Reboot node", "dangerous", "Reboots the host: every job on it is lost."),
    )
}
