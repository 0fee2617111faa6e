"""Secrets read from files (`*_file` keys), read again when the file is rotated."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator, ValidationInfo

from bot.config.base import resolve_path

log = logging.getLogger("bot.config")


class Secret:
    """A secret read from a file, and read again when the file changes, so a rotated token (a new file moved
    into place, a Kubernetes secret update) is used without a restart. Its repr and its serialised form show
    the file, never the value."""

    __slots__ = ("_stamp", "_value", "path")

    def __init__(self, path: Path, value: str) -> None:
        self.path = path
        self._value = value
        self._stamp = _file_stamp(path)

    @classmethod
    def read(cls, path: Path) -> Secret:
        stamp = _file_stamp(path)  # before reading: a change while reading is seen by the next get()
        secret = cls(path, _secret_text(path))
        secret._stamp = stamp
        return secret

    def get(self) -> str:
        stamp = _file_stamp(self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            self._read_again()
        return self._value

    def _read_again(self) -> None:
        try:
            self._value = _secret_text(self.path)
        except ValueError as exc:
            # Mid-rotation (the file gone, or truncated before its new content): the last good value still works.
            log.warning(
                "secret file changed and cannot be used: keeping its previous value", extra={"reason": str(exc)}
            )

    def readable_by_everyone(self) -> bool:
        try:
            return bool(self.path.stat().st_mode & stat.S_IROTH)
        except OSError:
            return False

    def __repr__(self) -> str:
        return f"Secret(file={str(self.path)!r})"


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is rewritten or replaced; None when it cannot be seen."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _secret_text(path: Path) -> str:
    try:
        content = path.read_text(encoding="utf-8").strip()
    except PermissionError as exc:
        raise ValueError(f"cannot read secret file {path}: {exc.strerror or exc}: {_permission_hint(path)}") from None
    except OSError as exc:
        raise ValueError(f"cannot read secret file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"secret file {path} is not UTF-8 text") from None
    if not content:
        raise ValueError(f"secret file {path} is empty")
    return content


def _permission_hint(path: Path) -> str:
    """What to change so that this process may read the file: which uid it runs as, and the directory it cannot
    enter or the modes the file needs."""
    uid = os.geteuid()
    absolute = path.absolute()
    for directory in reversed(absolute.parents):
        if not os.access(directory, os.X_OK):
            return (
                f"the bot runs as uid {uid} and cannot enter {directory} ({_owner_and_mode(directory)}): let uid "
                f"{uid} search it (chmod o+x, or chown it to uid {uid}), or mount the secret files themselves, "
                "not their directory (as compose's `secrets:` does)"
            )
    return f"the bot runs as uid {uid} and the file is {_owner_and_mode(absolute)}: {bot_only_advice()}"


def bot_only_advice() -> str:
    """How to make a secret file readable by the bot and by no other user of the host, which is what it reads
    without a word: for the user and group this process runs as (uid 10001, group 10001 in the image)."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        return "chmod o-r it (root reads it whatever its mode)"
    return f"give it to the bot's user alone: chgrp {gid} and chmod 0440, or chown {uid} and chmod 0400"


def _owner_and_mode(path: Path) -> str:
    try:
        info = path.stat()
    except OSError:
        return "not visible to it"
    return f"mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}"


def _load_secret(value: Any, info: ValidationInfo) -> Secret:
    if isinstance(value, Secret):
        return value
    if not isinstance(value, str | Path) or not str(value).strip():
        raise ValueError("expected the path of a file holding the secret")
    return Secret.read(resolve_path(Path(value), info))


SecretFile = Annotated[Secret, PlainValidator(_load_secret), PlainSerializer(lambda s: str(s.path))]
