"""The YAML data files that live beside the playbooks (the Xid catalog, the Xid 74 register table): where one
is found and how it is read and checked against its model, every problem naming the file."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from bot.yamldoc import NotUtf8Error, utf8_text

# libyaml's loader when PyYAML has it: ten times faster on the 172-code catalog.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class XidCatalogError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class DataModel(BaseModel):
    """A part of a data file: unknown keys are errors, and what was read is not changed afterwards."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_Loaded = TypeVar("_Loaded", bound=BaseModel)


def bundled_playbooks() -> Path:
    """The playbook directory shipped inside the package: package data in a wheel; in a checkout, the link
    bot/bundled_playbooks resolved to the repository's playbooks/, the directory operators read and edit."""
    return _bundled_directory("bundled_playbooks")


def bundled_rules() -> Path:
    """The shipped Prometheus rule files (config/rules/ in the repository, through the link bot/bundled_rules),
    which the self-test expects Prometheus to have loaded."""
    return _bundled_directory("bundled_rules")


def _bundled_directory(name: str) -> Path:
    directory = resources.files("bot").joinpath(name)
    # Loaders list a directory, so the package must be files on disk (pip installs it so).
    if not isinstance(directory, Path):
        raise RuntimeError(f"gpu-alert-bot cannot run from an archive: {directory} is not a directory on disk")
    return directory.resolve()


def data_file(location: Path | None, name: str, bundled: Path) -> Path:
    """`location` itself for a file, `name` in it for a directory that has one, else the `bundled` file."""
    if location is None:
        return bundled
    if location.is_dir():
        return location / name if (location / name).is_file() else bundled
    return location


def load_model(path: Path, model: type[_Loaded]) -> _Loaded:
    """A YAML data file checked by its model; every problem names the file."""
    try:
        data = yaml.load(utf8_text(path), Loader=_YAML_LOADER)  # noqa: S506 (a safe loader)
    except OSError as exc:
        raise XidCatalogError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except NotUtf8Error as exc:
        raise XidCatalogError([f"{path}:{exc.line}: {exc}"]) from None
    except yaml.YAMLError as exc:
        raise XidCatalogError([f"{path}: not valid YAML: {exc}"]) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise XidCatalogError([f"{path}: {_where(err['loc'])}{err['msg']}" for err in exc.errors()]) from None


def _where(location: Sequence[int | str]) -> str:
    return f"{'.'.join(str(part) for part in location)}: " if location else ""
