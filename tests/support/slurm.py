"""A real Slurm cluster on loopback (Debian's slurmctld, slurmd, slurm-client and munge): a private munged, a
slurmctld and one slurmd for node n1 with two fake GPUs (gres `File=` links to /dev/null), on free ports in a
temporary directory. n2 is defined in slurm.conf without a slurmd of its own. Jobs are started with sbatch;
`scontrol`, `sinfo` and `squeue` here are the ones the shipped scripts/slurm-node-actions.sh runs too.

Without cgroups in a container, `proctrack/linuxproc` and `task/none`; no accounting daemon."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.processes import REPO, ManagedProcess, free_port
from tests.support.sshd import Sshd

SLURMCTLD = "/usr/sbin/slurmctld"
SLURM_INSTALLED = all(shutil.which(tool) for tool in (SLURMCTLD, "/usr/sbin/slurmd", "scontrol", "/usr/sbin/munged"))
NODE = "n1"
SLURM_NODE_ACTIONS = REPO / "scripts" / "slurm-node-actions.sh"


def _until(done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout} s")


class SlurmCluster:
    def __init__(self) -> None:
        # munged needs o+x on every parent directory; pytest's temporary directories are private to their user.
        self.dir = Path(tempfile.mkdtemp(prefix="gpu-alert-bot-slurm-"))
        self.dir.chmod(0o711)
        self._processes: list[ManagedProcess] = []
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        d = self.dir
        for sub in ("munge", "etc", "state", "log", "run", "spool/n1", "dev", "jobs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge").chmod(0o755)
        (d / "jobs").chmod(0o777)
        for index in (0, 1):
            (d / "dev" / f"nvidia{index}").symlink_to("/dev/null")
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        socket = d / "munge" / "munge.socket"
        self._processes.append(
            ManagedProcess(
                [
                    "/usr/sbin/munged",
                    "-F",
                    "-S",
                    str(socket),
                    f"--key-file={key}",
                    f"--pid-file={d / 'munge' / 'munged.pid'}",
                    f"--seed-file={d / 'munge' / 'munged.seed'}",
                ],
                cwd=d,
            )
        )
        _until(socket.exists, "munged did not create its socket")
        self.ctld_port, node_port, other_port = free_port(), free_port(), free_port()
        self.conf = d / "etc" / "slurm.conf"
        self.conf.write_text(
            f"""ClusterName=gpubot
SlurmctldHost=localhost
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=1
SlurmdTimeout=300
MpiDefault=none
MailProg=/bin/true
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={node_port} CPUs=2 RealMemory=100 Gres=gpu:2 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={other_port} CPUs=2 RealMemory=100 Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        (d / "etc" / "gres.conf").write_text(f"AutoDetect=off\nNodeName=n[1-2] Name=gpu File={d}/dev/nvidia[0-1]\n")
        (d / "etc").chmod(0o755)
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._processes.append(ManagedProcess([SLURMCTLD, "-D"], cwd=d, env=self.env))
        _until(lambda: "UP" in self.run("scontrol", "ping", check=False).stdout, "slurmctld did not answer")
        self._slurmd = ManagedProcess(["/usr/sbin/slurmd", "-D", "-N", NODE], cwd=d, env=self.env)
        self._processes.append(self._slurmd)
        _until(lambda: self.state(NODE) == "idle", "n1 did not become idle")

    def run(self, *args: str, check: bool = True, user: str | None = None) -> subprocess.CompletedProcess[str]:
        command = ["runuser", "-u", user, "--", *args] if user else list(args)
        return subprocess.run(command, env=self.env, capture_output=True, text=True, check=check, timeout=60)

    def state(self, node: str) -> str:
        """sinfo's long state of the node (idle, allocated, mixed, draining, drained, ...), `*` dropped."""
        found = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T", check=False).stdout.split()
        return found[0].rstrip("*") if found else ""

    def reason(self, node: str) -> str:
        return self.run("sinfo", "-h", "-N", "-n", node, "-o", "%E").stdout.strip()

    def submit(self, name: str, gpus: int = 1, user: str | None = None) -> str:
        """A job holding `gpus` GPUs of n1 until it is cancelled; its id, once it runs."""
        job = self.run(
            "sbatch",
            "--parsable",
            "-w",
            NODE,
            f"--gres=gpu:{gpus}",
            "-J",
            name,
            "-D",
            str(self.dir / "jobs"),
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
            user=user,
        ).stdout.strip()
        _until(lambda: self.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING", f"job {job}")
        return job

    def pause_slurmd(self) -> None:
        """Stop n1's slurmd (SIGSTOP): the controller's pings to it wait for an answer until `continue_slurmd`."""
        os.kill(self._slurmd.process.pid, signal.SIGSTOP)

    def continue_slurmd(self) -> None:
        os.kill(self._slurmd.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Jobs first: their slurmstepd is no child of slurmd, so it would outlive the daemons."""
        if len(self._processes) > 1 and self._processes[1].process.poll() is None:
            self.run("scancel", "-p", "gpu", check=False)
            with contextlib.suppress(TimeoutError):
                _until(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), "jobs did not end", 20)
        for process in reversed(self._processes):
            process.stop(timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)


def slurm_sshd(workdir: Path, cluster: SlurmCluster, settings: str = "") -> Sshd:
    """A real sshd whose key forces the shipped scripts/slurm-node-actions.sh with a config file as
    docs/remediation.md writes it (SLURM_CONF, NODES, VERBS...); the script logs each request it got."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "slurm-node-actions.conf"
    config.write_text(f"SLURM_CONF={cluster.conf}\nLOG_FILE={workdir / 'verbs.log'}\n{settings}")
    return Sshd(workdir, command=f"{SLURM_NODE_ACTIONS} {config}")
