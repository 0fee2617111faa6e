"""A secret file the bot's user cannot read: `check-config` run as the image's unprivileged uid and group (10001)
says which uid it runs as and what to change, for a 0700 directory mounted whole (the Dockerfile's old example)
and for a file only its owner may read; set up as it advises, the file is read without a warning."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.processes import REPO

BOT_UID = 10001  # the Dockerfile's user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to run as another uid"
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory uid 10001 can enter (pytest's own tmp_path is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gpu-alert-bot-secrets-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def check_config_as_bot_user(config: Path) -> subprocess.CompletedProcess[str]:
    command = ["setpriv", f"--reuid={BOT_UID}", f"--regid={BOT_UID}", "--clear-groups"]
    return subprocess.run(
        [*command, sys.executable, "-m", "bot", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


def config_with_token(directory: Path, token: Path) -> Path:
    path = directory / "bot.yaml"
    path.write_text(yaml.safe_dump({"server": {"auth": {"bearer_token_file": str(token)}}}))
    path.chmod(0o644)
    return path


def refused(shared_dir: Path, token: Path, mode: int) -> str:
    """What check-config, run as the bot's user, says as it refuses a configuration whose token file has this
    mode (exit 2)."""
    token.write_text("0123456789abcdef\n")
    token.chmod(mode)
    done = check_config_as_bot_user(config_with_token(shared_dir, token))
    assert done.returncode == 2, done.stderr
    return done.stderr


def test_a_0700_secrets_directory_is_refused_with_the_uid_and_the_fix(shared_dir: Path) -> None:
    secrets = shared_dir / "secrets"
    secrets.mkdir(mode=0o700)
    token = secrets / "webhook_token"
    said = refused(shared_dir, token, 0o444)
    assert f"cannot read secret file {token}: Permission denied: the bot runs as uid {BOT_UID}" in said
    assert f"cannot enter {secrets} (mode 0700, owner uid 0)" in said
    assert "mount the secret files themselves, not their directory" in said


ADVICE = f"give it to the bot's user alone: chgrp {BOT_UID} and chmod 0440, or chown {BOT_UID} and chmod 0400"


def test_a_file_only_its_owner_reads_is_refused_with_the_modes_that_work(shared_dir: Path) -> None:
    token = shared_dir / "webhook_token"
    said = refused(shared_dir, token, 0o600)
    assert f"the file is mode 0600, owner uid 0: {ADVICE}" in said


@pytest.mark.parametrize(("owner", "group", "mode"), [(0, BOT_UID, 0o440), (BOT_UID, 0, 0o400)])
def test_the_modes_the_bot_advises_are_read_without_a_word(shared_dir: Path, owner: int, group: int, mode: int) -> None:
    """The refusal and the warning give the same advice, and a file set up as it says gets neither."""
    token = shared_dir / "webhook_token"
    token.write_text("0123456789abcdef\n")
    config = config_with_token(shared_dir, token)
    os.chown(token, owner, group)
    token.chmod(mode)
    quiet = check_config_as_bot_user(config)
    assert (quiet.returncode, quiet.stderr) == (0, "")
    token.chmod(0o444)  # readable, by every user of the host too
    warned = check_config_as_bot_user(config)
    assert warned.returncode == 0
    assert warned.stderr == f"warning: {token}: secret file readable by every user of this host; {ADVICE}\n"
