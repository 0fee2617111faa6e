"""YAML files read with their line numbers, for problems that name `file:line`: the playbooks and the bot's
configuration. Duplicate keys are found here too, since YAML loaders keep the last of two equal keys silently."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Loc = tuple[str | int, ...]


class NotUtf8Error(ValueError):
    """A file that is not UTF-8 text; `line` is where the first undecodable byte is."""

    def __init__(self, line: int, byte: int) -> None:
        super().__init__(f"not UTF-8 text (byte 0x{byte:02x}); save the file as UTF-8")
        self.line = line


@dataclass
class Document:
    path: Path
    root: yaml.Node | None
    data: Any

    def line(self, loc: Sequence[str | int]) -> int:
        """Line of the deepest node `loc` reaches. Steps that are not in the file (pydantic's union tags) are
        skipped, so the line is always the closest one that exists."""
        node = self.root
        line = node.start_mark.line + 1 if node is not None else 1
        for part in loc:
            found = _child(node, part)
            if found is None:
                continue
            marker, node = found
            line = marker.start_mark.line + 1
        return line


def _child(node: yaml.Node | None, part: str | int) -> tuple[yaml.Node, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key, value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return node.value[part], node.value[part]
    return None


def read_document(path: Path) -> Document:
    """The file's YAML with its nodes. Raises OSError, NotUtf8Error or yaml.YAMLError."""
    loader = yaml.SafeLoader(utf8_text(path))
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return Document(path, root, data)


def utf8_text(path: Path) -> str:
    """The file's text; raises OSError, or NotUtf8Error naming the line of the first byte that is not UTF-8."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8Error(raw.count(b"\n", 0, exc.start) + 1, raw[exc.start]) from None


def duplicate_keys(node: yaml.Node | None, loc: Loc = ()) -> Iterator[tuple[int, Loc, str]]:
    """(line, key path, problem) of every key that appears twice in the same mapping; a duplicate is nearly
    always a mistake."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = str(key.value)
            if name in seen:
                yield key.start_mark.line + 1, (*loc, name), f"duplicate key {name!r}"
            seen.add(name)
            yield from duplicate_keys(value, (*loc, name))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from duplicate_keys(item, (*loc, index))
