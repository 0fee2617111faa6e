"""What every section shares: strict models, paths relative to the file, host:port and URL values."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)

HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[^:\s]+):(?P<port>\d{1,5})$")
LISTEN_EXAMPLE = "127.0.0.1:9095 or 0.0.0.0:9095"


def host_port(value: Any, example: str, port_zero: bool = True) -> str:
    """`value` if it is a `HOST:PORT` text (an IPv6 host in brackets); the error names an example."""
    hint = f"expected HOST:PORT, for example {example}"
    if not isinstance(value, str):
        raise ValueError(f"{hint} (got {_yaml_kind(value)})")
    match = HOST_PORT.match(value)
    if match is None or int(match.group("port")) > 65535 or (not port_zero and int(match.group("port")) == 0):
        raise ValueError(hint)
    return value


def listen_address(value: Any) -> str:
    """A `HOST:PORT` to listen on: `server.listen` and `serve --listen`."""
    return host_port(value, LISTEN_EXAMPLE, port_zero=False)


def split_listen(value: str) -> tuple[str, int]:
    """The host (IPv6 without brackets) and port of a checked `listen_address`."""
    match = HOST_PORT.match(value)
    assert match is not None
    return match.group("host").strip("[]"), int(match.group("port"))


_HTTP_URL = TypeAdapter(AnyHttpUrl)


def http_url(value: str) -> str:
    """`value` unchanged if it is an http:// or https:// URL with a host: anything else would only fail at the
    first request, and be retried for a day."""
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError(f"{value!r} is not a URL: it contains spaces or control characters")
    try:
        _HTTP_URL.validate_python(value)
    except ValidationError as exc:
        reason = str(exc.errors()[0]["msg"]).removeprefix("Input should be a valid URL, ")
        raise ValueError(f"{value!r} is not an http:// or https:// URL with a host ({reason})") from None
    return value


HttpUrlText = Annotated[str, AfterValidator(http_url)]


def _yaml_kind(value: Any) -> str:
    """What a YAML value that should have been text is, in the file's terms."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"the number {value}: a port alone, with no host"
    kinds = ((float, "a number"), (list, "a list"), (dict, "a mapping"))
    return next((kind for type_, kind in kinds if isinstance(value, type_)), type(value).__name__)


def resolve_path(value: Path, info: ValidationInfo) -> Path:
    """`value` relative to the configuration file's directory (the validation context's `base_dir`)."""
    base = (info.context or {}).get("base_dir")
    path = value.expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    # config/../var/bot.db -> var/bot.db, without resolving symlinks the operator chose.
    return Path(os.path.normpath(path))


ConfigPath = Annotated[Path, AfterValidator(resolve_path)]


class StrictModel(BaseModel):
    """Unknown keys are errors, so a typo in the file is reported instead of silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_section_is_defaults(cls, value: Any) -> Any:
        # `auth:` followed only by comments is None in YAML: it means "all defaults".
        return {} if value is None else value
