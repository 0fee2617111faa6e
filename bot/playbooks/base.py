"""What every part of a playbook file shares: the strict model base, and the error that lists problems."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class PlaybookError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class FileModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
