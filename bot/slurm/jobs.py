"""The jobs the scheduler runs, from `squeue --json` (Slurm 22.05 and later; the same job objects as slurmrestd's
`/jobs`): which node each runs on and which GPUs it holds there. Slurm 22.05's `--json` ignores squeue's filters,
so the answer is every job the controller still remembers; only the running ones are kept."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

# A Slurm job id as dcgm-exporter's hpc_job label carries it: 1234, or an array task 1234_7.
JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")
_GPU_IDX = re.compile(r"gpu[^(,]*\(IDX:([0-9,-]+)\)")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
# A host list expands to at most this many names (a job on more nodes is not about one GPU anyway).
_MAX_NODES = 4096


class JobsUnreadable(Exception):
    """The scheduler's answer is not the job list (not JSON, or not its shape)."""


@dataclass(frozen=True)
class SlurmJob:
    id: str
    user: str
    name: str
    start: datetime | None
    # Per node the job runs on, the indices of the GPUs it holds there (empty: none, or not said).
    gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def holds(self, node: str, gpu: int | None) -> bool:
        """Whether it runs on `node` and holds that GPU (any GPU of it, for a host-level question)."""
        if node not in self.gpus:
            return False
        return gpu is None or gpu in self.gpus[node]


def parse_jobs(text: str) -> list[SlurmJob]:
    try:
        answer = json.loads(text)
    except ValueError as exc:
        raise JobsUnreadable(f"the job list is not JSON: {exc}") from exc
    jobs = answer.get("jobs") if isinstance(answer, dict) else None
    if not isinstance(jobs, list):
        raise JobsUnreadable("the answer has no job list")
    return [job for job in (_job(raw) for raw in jobs if isinstance(raw, dict)) if job is not None]


def _job(raw: Mapping[str, Any]) -> SlurmJob | None:
    state = raw.get("job_state")
    states = state if isinstance(state, list) else [state]
    if "RUNNING" not in states:
        return None
    job_id = str(_number(raw.get("job_id")) or "")
    array, task = _number(raw.get("array_job_id")), _number(raw.get("array_task_id"))
    if array and task is not None and array != _number(raw.get("job_id")):
        job_id = f"{array}_{task}"
    nodes = expand_hostlist(str(raw.get("nodes") or ""))
    detail = raw.get("gres_detail")
    details: list[Any] = detail if isinstance(detail, list) else []
    gpus = {node: _indices(str(details[i])) if i < len(details) else () for i, node in enumerate(nodes)}
    start = _number(raw.get("start_time"))
    return SlurmJob(
        id=job_id,
        user=str(raw.get("user_name") or raw.get("user_id") or ""),
        name=str(raw.get("name") or ""),
        start=datetime.fromtimestamp(start, UTC) if start else None,
        gpus=gpus,
    )


def _number(value: Any) -> int | None:
    """A number as 22.05 writes it (42), or as later releases do ({"set": true, "number": 42})."""
    if isinstance(value, dict):
        return _number(value.get("number")) if value.get("set", True) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _indices(detail: str) -> tuple[int, ...]:
    found: list[int] = []
    for group in _GPU_IDX.findall(detail):
        for part in group.split(","):
            bounds = _RANGE.fullmatch(part)
            if bounds is None:
                continue
            low = int(bounds.group(1))
            high = int(bounds.group(2) or low)
            found.extend(range(low, min(high, low + 64) + 1))
    return tuple(sorted(set(found)))


def expand_hostlist(text: str) -> list[str]:
    """`n[1-3,07],gpu9` -> n1, n2, n3, n07, gpu9 (zero padding kept); at most a few thousand names."""
    names: list[str] = []
    for item in _top_level(text):
        names.extend(_expand(item))
        if len(names) > _MAX_NODES:
            return names[:_MAX_NODES]
    return names


def _top_level(text: str) -> Iterable[str]:
    depth, start = 0, 0
    for i, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    if text[start:]:
        yield text[start:]


def _expand(item: str) -> list[str]:
    opening = item.find("[")
    closing = item.find("]", opening)
    if opening < 0 or closing < 0:
        return [item] if item else []
    prefix, ranges, rest = item[:opening], item[opening + 1 : closing], item[closing + 1 :]
    tails = _expand(rest) if "[" in rest else [rest]
    names: list[str] = []
    for part in ranges.split(","):
        bounds = _RANGE.fullmatch(part)
        if bounds is None:
            continue
        width = len(bounds.group(1))
        low, high = int(bounds.group(1)), int(bounds.group(2) or bounds.group(1))
        for number in range(low, min(high, low + _MAX_NODES) + 1):
            names.extend(f"{prefix}{number:0{width}d}{tail}" for tail in tails)
    return names
