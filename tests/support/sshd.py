"""A real OpenSSH server (Debian's openssh-server) on a loopback port, with throwaway host and user keys and an
`authorized_keys` entry whose forced command is the shipped scripts/gpu-node-actions.sh. The script's `docker`
is a stub that records its arguments, and the script's own log records each verb it got. `command` gives
another forced command instead (scripts/slurm-node-actions.sh with its config file)."""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from pathlib import Path

from tests.support.processes import REPO, ManagedProcess, free_port

SSHD = "/usr/sbin/sshd"
NODE_ACTIONS = REPO / "scripts" / "gpu-node-actions.sh"


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


class Sshd(ManagedProcess):
    def __init__(self, workdir: Path, command: str | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = free_port()
        self.user = getpass.getuser()
        host_public = _keygen(workdir / "host_key")
        other_public = _keygen(workdir / "other_host_key")
        user_public = _keygen(workdir / "user_key")
        self.key_file = workdir / "user_key"
        self.known_hosts = workdir / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {_key_only(host_public)}\n")
        self.wrong_known_hosts = workdir / "wrong_known_hosts"
        self.wrong_known_hosts.write_text(f"[127.0.0.1]:{self.port} {_key_only(other_public)}\n")
        self.verbs_log = workdir / "verbs.log"
        self.docker_log = workdir / "docker.log"
        docker = workdir / "docker"
        docker.write_text(f'#!/bin/sh\necho "$*" >> {self.docker_log}\necho "docker $*"\n')
        docker.chmod(0o755)
        node_config = workdir / "gpu-node-actions.conf"
        node_config.write_text(f"DOCKER={docker}\nLOG_FILE={self.verbs_log}\nDCGM_EXPORTER_CONTAINER=dcgm-exporter\n")
        authorized = workdir / "authorized_keys"
        forced = command or f"{NODE_ACTIONS} {node_config}"
        authorized.write_text(f'restrict,command="{forced}" {user_public}\n')
        config = workdir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {workdir / 'host_key'}",
                    f"AuthorizedKeysFile {authorized}",
                    f"PidFile {workdir / 'sshd.pid'}",
                    f"AllowUsers {self.user}",
                    "StrictModes no",  # the throwaway files live in a temporary directory
                    "UsePAM no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin forced-commands-only",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        super().__init__([SSHD, "-D", "-e", "-f", str(config)], cwd=workdir)
        self._wait_listening()

    def _wait_listening(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {''.join(self.stderr.snapshot())}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"sshd did not listen on {self.port}")

    def verbs(self) -> list[str]:
        """The verbs the forced command got, in order."""
        if not self.verbs_log.exists():
            return []
        return [line.split(" ", 2)[2] for line in self.verbs_log.read_text().splitlines() if " verb: " in line]

    def docker_calls(self) -> list[str]:
        return self.docker_log.read_text().splitlines() if self.docker_log.exists() else []


def _key_only(public: str) -> str:
    kind, key, *_ = public.split()
    return f"{kind} {key}"
