"""The Slurm pieces without a scheduler: the forced command's refusals (a stub scontrol records that nothing
ran), the drain reason, the configuration's node names, the job list of Slurm 22.05 and later releases, the
counts an incident takes from its alerts' workload evidence, how long a resumed node is read until it settles, and
how the node read back decides what an update came to."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.actions.executor import RunContext
from bot.actions.slurm import DRAIN, RESUME, SETTLE_WITHIN, drain_reason, outcome, read_settled
from bot.config import RemediationConfig
from bot.evidence import PodFound, SlurmJobFound, WorkloadEvidence
from bot.evidence.workload import affected_work
from bot.slurm.access import Answer, reason_text
from bot.slurm.jobs import expand_hostlist, parse_jobs
from bot.slurm.nodes import NodeState, parse_nodes
from tests.support.clock import FakeClock, running
from tests.support.slurm import SLURM_NODE_ACTIONS


def forced(tmp_path: Path, request: str, settings: str = "") -> tuple[int, str, list[str]]:
    """Run the shipped script as sshd would, with stub tools that record their arguments."""
    calls = tmp_path / "calls"
    for tool in ("scontrol", "sinfo", "squeue"):
        stub = tmp_path / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
        stub.chmod(0o755)
    config = tmp_path / "slurm-node-actions.conf"
    config.write_text(
        f"SCONTROL={tmp_path}/scontrol\nSINFO={tmp_path}/sinfo\nSQUEUE={tmp_path}/squeue\n"
        f"LOG_FILE={tmp_path}/log\n{settings}"
    )
    done = subprocess.run(
        [str(SLURM_NODE_ACTIONS), str(config)],
        env={**os.environ, "SSH_ORIGINAL_COMMAND": request},
        capture_output=True,
        text=True,
        check=False,
    )
    ran = calls.read_text().splitlines() if calls.exists() else []
    return done.returncode, done.stderr, ran


@pytest.mark.parametrize(
    ("request_", "settings", "refusal"),
    [
        ("drain n[1-2] gpu-alert-bot x", "", "drain needs one node name, got 'n[1-2]'"),
        ("drain n1,n2 gpu-alert-bot x", "", "drain needs one node name"),
        ("drain -h gpu-alert-bot x", "", "drain needs one node name"),
        ("drain n1 $(reboot)", "", "drain needs a reason of letters"),
        ('drain n1 x";scancel -u root', "", "drain needs a reason of letters"),
        ("drain n1", "", "drain needs a reason"),
        ("drain n2 gpu-alert-bot x", 'NODES="n1"\n', "node 'n2' is not one this key may change"),
        ("drain n1 gpu-alert-bot x", 'VERBS="jobs node nodes"\n', "verb 'drain' is not allowed to this key"),
        ("resume n1 now", "", "resume takes only a node name"),
        ("jobs --all", "", "jobs takes no argument"),
        ("cancel 12", "", "unknown verb 'cancel'"),
        ("drain n1 a\nresume n2", "", "a request is one line"),
    ],
)
def test_the_forced_command_refuses_what_it_was_not_made_for_and_runs_nothing(
    tmp_path: Path, request_: str, settings: str, refusal: str
) -> None:
    status, stderr, ran = forced(tmp_path, request_, settings)
    assert status == 64 and refusal in stderr
    assert ran == []


def test_the_forced_command_maps_each_request_to_its_one_command(tmp_path: Path) -> None:
    assert forced(tmp_path, "drain n1 gpu-alert-bot GPUXIDError alert k3x9m2p run 12")[0] == 0
    assert forced(tmp_path, "resume n1")[0] == 0
    assert forced(tmp_path, "node n1")[0] == 0
    assert forced(tmp_path, "nodes")[0] == 0
    _, _, ran = forced(tmp_path, "jobs")
    assert ran == [
        "scontrol update NodeName=n1 State=DRAIN Reason=gpu-alert-bot GPUXIDError alert k3x9m2p run 12",
        "scontrol update NodeName=n1 State=RESUME",
        "sinfo -h -N -n n1 -o %N|%T|%E",
        "sinfo -h -N -o %N|%T|%E",
        "squeue --json",
    ]


def test_the_drain_reason_names_the_alert_and_its_id_and_leaves_out_a_hostile_name() -> None:
    assert drain_reason(RunContext(12, "k3x9m2p", "GPUXIDError")) == "gpu-alert-bot GPUXIDError alert k3x9m2p run 12"
    hostile = 'X"; scontrol update NodeName=n2 State=DOWN'
    assert drain_reason(RunContext(3, "abc1234", hostile)) == "gpu-alert-bot alert alert abc1234 run 3"
    # Before the run exists (a dry run) the alert is known, the run's number not yet.
    before = drain_reason(RunContext(None, "k3x9m2p", "GPUXIDError"))
    assert before == "gpu-alert-bot GPUXIDError alert k3x9m2p run <number>"
    assert reason_text("a\nb $(c) `d`") == "a b c d"


@pytest.mark.parametrize("node", ["n[1-2]", "n1,n2", "-n1", "n1;reboot", "n 1", ""])
def test_a_slurm_node_in_the_configuration_is_one_plain_name(node: str) -> None:
    with pytest.raises(ValidationError, match="slurm_node"):
        RemediationConfig.model_validate({"hosts": {"k-ai-01": {"slurm_node": node}}, "slurm": {"ssh": _ssh_files()}})


def test_a_slurm_node_needs_the_schedulers_access() -> None:
    with pytest.raises(ValidationError, match=r"name a slurm_node: set remediation\.slurm"):
        RemediationConfig.model_validate({"hosts": {"k-ai-01": {"slurm_node": "n1"}}})


def _ssh_files() -> dict[str, str]:
    key = Path(__file__)  # any existing file: the key files are only checked to exist
    return {"address": "127.0.0.1", "user": "bot", "key_file": str(key), "known_hosts": str(key)}


def test_jobs_of_slurm_22_05_and_of_later_releases_are_read_alike() -> None:
    answer = {
        "jobs": [
            {
                "job_id": 2,
                "user_name": "nobody",
                "name": "eval-b",
                "job_state": "RUNNING",
                "start_time": 1796178357,
                "nodes": "n1",
                "gres_detail": ["gpu:1(IDX:1)"],
            },
            {
                "job_id": 9,
                "array_job_id": {"set": True, "number": 7},
                "array_task_id": {"set": True, "number": 3},
                "user_name": "alice",
                "name": "sweep",
                "job_state": ["RUNNING"],
                "start_time": {"set": True, "number": 1796178400},
                "nodes": "gpu[07-08]",
                "gres_detail": ["gpu:a100:2(IDX:0-1)", "gpu:a100:1(IDX:3)"],
            },
            {"job_id": 3, "job_state": "COMPLETED", "nodes": "n1", "gres_detail": []},
        ]
    }
    first, second = parse_jobs(json.dumps(answer))
    assert (first.id, first.user, first.name, dict(first.gpus)) == ("2", "nobody", "eval-b", {"n1": (1,)})
    assert first.holds("n1", 1) and not first.holds("n1", 0) and not first.holds("n2", 1)
    assert second.id == "7_3" and dict(second.gpus) == {"gpu07": (0, 1), "gpu08": (3,)}
    assert second.start is not None and second.start.timestamp() == 1796178400
    assert expand_hostlist("n[1-3,07],gpu9") == ["n1", "n2", "n3", "n07", "gpu9"]


def test_node_states_keep_the_first_partitions_line_and_their_flags() -> None:
    nodes = parse_nodes("n1|draining|gpu-alert-bot x\nn1|draining|another partition\nn2|idle*|none\n")
    assert nodes["n1"].drained and nodes["n1"].text() == "draining, reason: gpu-alert-bot x"
    assert not nodes["n2"].drained and nodes["n2"].text() == "idle (not responding)"


def test_an_incident_counts_distinct_jobs_users_and_pods_and_those_likely_lost() -> None:
    lost = WorkloadEvidence(
        jobs=[SlurmJobFound(id="1", user="alice"), SlurmJobFound(id="2", user="bob")], likely_lost=True
    )
    again = WorkloadEvidence(jobs=[SlurmJobFound(id="1", user="alice")], likely_lost=False)
    pods = WorkloadEvidence(pods=[PodFound(namespace="ml", pod="trainer-0")], likely_lost=None)
    counted = affected_work([lost, again, pods, None])
    assert (counted.jobs, counted.users, counted.pods, counted.likely_lost) == (2, 2, 1, 2)
    assert counted.text() == "2 Slurm jobs of 2 users, 1 pod (2 likely lost)"
    assert affected_work([]).text() == ""


class Reads:
    """What successive reads of a node give (sinfo's line for it), the last one again once they run out."""

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)
        self.count = 0

    async def __call__(self) -> NodeState | None:
        line = self.lines[min(self.count, len(self.lines) - 1)]
        self.count += 1
        return parse_nodes(line).get("n1")


async def test_a_resumed_node_is_read_until_its_slurmd_answered_the_controllers_ping() -> None:
    clock = FakeClock()
    reads = Reads("n1|idle*|none", "n1|idle*|none", "n1|mixed|none")
    async with running(clock):
        state = await read_settled(reads, clock)
    assert state is not None and state.text() == "mixed" and reads.count == 3
    assert clock.monotonic() == 2.0


async def test_a_slurmd_that_never_answers_is_said_not_responding_once_the_wait_is_over() -> None:
    clock = FakeClock()
    reads = Reads("n1|idle*|none")
    async with running(clock):
        state = await read_settled(reads, clock)
    assert state is not None and not state.responding
    assert clock.monotonic() == SETTLE_WITHIN and reads.count == SETTLE_WITHIN + 1
    said = outcome(RESUME, "n1", Answer(0, "", ""), state)
    assert said.ok and said.output == (
        f"Slurm node n1 is idle (not responding): its slurmd did not answer the controller within "
        f"{SETTLE_WITHIN:g} s of the resume"
    )


async def test_a_node_still_drained_or_already_answering_is_read_once() -> None:
    clock = FakeClock()
    for line in ("n1|drained*|gpu-alert-bot x", "n1|idle|none"):
        reads = Reads(line)
        assert await read_settled(reads, clock) is not None
        assert reads.count == 1 and clock.monotonic() == 0.0


REFUSED_STATE = Answer(1, "", "slurm_update error: Invalid node state specified\n")
TIMED_OUT = Answer(1, "", "slurm_update error: Socket timed out on send/recv operation\n")


@pytest.mark.parametrize(
    ("verb", "answer", "line", "ok", "said"),
    [
        (RESUME, Answer(0, "", ""), "n1|idle|none", True, "Slurm node n1 is idle"),
        # A second click on a node that takes jobs: nothing was left to resume.
        (RESUME, REFUSED_STATE, "n1|mixed|none", True, "Slurm node n1 is mixed: already taking jobs"),
        # Applied by a controller that answered an error all the same: the read-back decides.
        (RESUME, TIMED_OUT, "n1|idle|none", True,
         'Slurm node n1 is idle (the scheduler answered "slurm_update error: Socket timed out on send/recv '
         'operation", but reads the node resumed)'),
        (DRAIN, TIMED_OUT, "n1|draining|gpu-alert-bot x", True,
         'Slurm node n1 is draining, reason: gpu-alert-bot x (the scheduler answered "slurm_update error: Socket '
         'timed out on send/recv operation", but reads the node drained)'),
        (RESUME, TIMED_OUT, "n1|drained|gpu-alert-bot x", False,
         "the scheduler refused to resume n1: slurm_update error: Socket timed out on send/recv operation; it "
         "shows n1 drained, reason: gpu-alert-bot x"),
        # Refused, and the node is down: it takes no job, so the resume did not happen.
        (RESUME, REFUSED_STATE, "n1|down*|Not responding", False,
         "the scheduler refused to resume n1: slurm_update error: Invalid node state specified; it shows n1 down "
         "(not responding), reason: Not responding"),
        (DRAIN, Answer(0, "", ""), "n1|idle|none", False, "after the drain the scheduler shows n1 idle"),
        (DRAIN, Answer(1, "", "slurm_update error: Invalid node name specified"), "", False,
         "the scheduler refused to drain n1: slurm_update error: Invalid node name specified"),
    ],
)  # fmt: skip
def test_the_node_read_back_decides_what_an_update_came_to(
    verb: str, answer: Answer, line: str, ok: bool, said: str
) -> None:
    result = outcome(verb, "n1", answer, parse_nodes(line).get("n1"))
    assert (result.ok, result.output) == (ok, said)
