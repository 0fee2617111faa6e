"""Loading playbooks: every problem with its file and line (the YAML itself: bot.yamldoc)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml
from pydantic import ValidationError

from bot.action_catalog import ACTIONS
from bot.config.wording import plain_error
from bot.gpu.xid_catalog import XidCatalog, XidCatalogError, load_catalog
from bot.playbooks.base import PlaybookError
from bot.playbooks.conditions import (
    AnyCondition,
    Judgement,
    LabelCondition,
    RelatedCondition,
    SeriesCondition,
    VerdictCondition,
)
from bot.playbooks.incident import SignalCondition
from bot.playbooks.schema import GENERIC, ActionChoice, Case, Playbook
from bot.playbooks.templating import text_template_problems
from bot.querytemplate import query_template_problems
from bot.yamldoc import Document, Loc, NotUtf8Error, duplicate_keys, read_document

NOT_PLAYBOOKS = frozenset({"xid_catalog.yaml", "xid74_registers.yaml"})
_QUERY_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_SAFETY_ORDER: dict[str, int] = {"safe": 0, "guarded": 1, "dangerous": 2}


def _loc_text(loc: Sequence[str | int]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, document: Document, loc: Sequence[str | int], message: str, line: int | None = None) -> None:
        where = _loc_text(loc)
        line = document.line(loc) if line is None else line
        self.items.append(f"{document.path}:{line}: {where + ': ' if where else ''}{message}")


def _validate(document: Document, problems: _Problems) -> Playbook | None:
    data = document.data
    if data is None:
        problems.add(document, (), "the file is empty")
        return None
    if not isinstance(data, dict):
        problems.add(document, (), "a playbook is a mapping of keys such as match, title, steps")
        return None
    if "name" in data:
        problems.add(document, ("name",), "unknown key: a playbook's name is its file name")
        return None
    try:
        playbook = Playbook.model_validate({**data, "name": document.path.stem})
    except ValidationError as exc:
        for error in exc.errors():
            extra, message = plain_error(error, unknown_key="unknown key")
            problems.add(document, (*error["loc"], *extra), message)
        return None
    for loc, message in _playbook_problems(playbook):
        problems.add(document, loc, message)
    return playbook


def _playbook_problems(playbook: Playbook) -> Iterator[tuple[Loc, str]]:
    if playbook.name == GENERIC and playbook.match is not None:
        yield ("match",), "the generic playbook takes every alert no other playbook matches: it has no match"
    if playbook.name != GENERIC and playbook.match is None:
        yield (), "a playbook needs `match: {alertname: ...}` (only generic.yaml has none)"
    yield from _text_problems(playbook)
    for name, template in playbook.queries.items():
        if not _QUERY_NAME.fullmatch(name):
            yield ("queries", name), "a query name is lower_snake_case, like gpu_util"
        for problem in query_template_problems(template):
            yield ("queries", name), f"bad query template: {problem}"
    yield from _judgement_problems(playbook)
    for index, choice in enumerate(playbook.actions):
        yield from _action_problems(index, choice)
    yield from _incident_problems(playbook)


def _text_problems(playbook: Playbook) -> Iterator[tuple[Loc, str]]:
    texts: list[tuple[Loc, str]] = [(("title",), playbook.title), (("meaning",), playbook.meaning)]
    texts += [(("escalate",), playbook.escalate)]
    texts += [(("causes", i), cause) for i, cause in enumerate(playbook.causes)]
    texts += [(("thresholds", i, "value"), t.value) for i, t in enumerate(playbook.thresholds)]
    texts += [(("thresholds", i, "why"), t.why) for i, t in enumerate(playbook.thresholds)]
    texts += [(("steps", i, "text"), s.text) for i, s in enumerate(playbook.steps)]
    texts += [(("steps", i, "command"), s.command) for i, s in enumerate(playbook.steps) if s.command]
    texts += [(("links", i, "url"), link.url) for i, link in enumerate(playbook.links)]
    texts += [(("judgements", i, "say"), j.say) for i, j in enumerate(playbook.judgements)]
    for i, case in enumerate(playbook.cases):
        texts += [(("cases", i, "say"), case.say), (("cases", i, "escalate"), case.escalate or "")]
        texts += [(("cases", i, "own_steps_if"), case.own_steps_if or "")]
        texts += [(("cases", i, "steps", j, "text"), s.text) for j, s in enumerate(case.steps)]
        texts += [(("cases", i, "steps", j, "command"), s.command) for j, s in enumerate(case.steps) if s.command]
    for loc, text in texts:
        for problem in text_template_problems(text):
            yield loc, problem


def _judgement_problems(playbook: Playbook) -> Iterator[tuple[Loc, str]]:
    related = {r.alert for r in playbook.related_alerts}
    conditional: list[tuple[str, int, Judgement | Case]] = [
        ("judgements", i, j) for i, j in enumerate(playbook.judgements)
    ]
    conditional += [("cases", i, c) for i, c in enumerate(playbook.cases)]
    for part, index, item in conditional:
        for key in ("when", "unless"):
            for position, condition in enumerate(getattr(item, key)):
                yield from _condition_problems(condition, (part, index, key, position), playbook, related)


def _condition_problems(
    condition: SeriesCondition | LabelCondition | RelatedCondition | VerdictCondition | AnyCondition,
    loc: Loc,
    playbook: Playbook,
    related: set[str],
) -> Iterator[tuple[Loc, str]]:
    if isinstance(condition, SeriesCondition) and condition.series not in playbook.queries:
        known = ", ".join(sorted(playbook.queries)) or "none"
        yield (*loc, "series"), f"no query named {condition.series!r} in this playbook (queries: {known})"
    elif isinstance(condition, RelatedCondition) and condition.related not in related:
        yield (*loc, "related"), f"{condition.related!r} is not in related_alerts, so it is never looked up"
    elif isinstance(condition, AnyCondition):
        for position, inner in enumerate(condition.any):
            yield from _condition_problems(inner, (*loc, "any", position), playbook, related)


def _action_problems(index: int, choice: ActionChoice) -> Iterator[tuple[Loc, str]]:
    spec = ACTIONS.get(choice.name)
    if spec is None:
        yield ("actions", index), f"unknown action {choice.name!r} (known: {', '.join(ACTIONS)})"
    elif choice.safety is not None and _SAFETY_ORDER[choice.safety] < _SAFETY_ORDER[spec.safety]:
        yield ("actions", index, "safety"), f"{choice.name} is {spec.safety}; a playbook cannot make it {choice.safety}"


def _incident_problems(playbook: Playbook) -> Iterator[tuple[Loc, str]]:
    section = playbook.incident
    if section is None:
        return
    for name, signal in section.signals.items():
        for problem in query_template_problems(signal.query):
            yield ("incident", "signals", name, "query"), f"bad query: {problem}"
        if re.search(r"\{[A-Za-z_]\w*\}", signal.query):
            yield ("incident", "signals", name, "query"), "a signal is fleet-wide: its query has no placeholder"
    for index, cause in enumerate(section.causes):
        loc: Loc = ("incident", "causes", index)
        for key in ("when", "unless"):
            for position, condition in enumerate(getattr(cause, key)):
                if isinstance(condition, SignalCondition) and condition.signal not in section.signals:
                    known = ", ".join(sorted(section.signals)) or "none"
                    yield (*loc, key, position, "signal"), f"no signal named {condition.signal!r} (signals: {known})"
        allowed = cause.placeholders()
        texts: list[tuple[Loc, str]] = [((*loc, "reason"), cause.reason), ((*loc, "title"), cause.title)]
        texts += [((*loc, "steps", i), step) for i, step in enumerate(cause.steps)]
        for text_loc, text in texts:
            for problem in text_template_problems(text):
                yield text_loc, problem
        for text_loc, text in texts[:1] + texts[2:]:
            for name in sorted(set(re.findall(r"(?<!\{)\{([A-Za-z_]\w*)\}", text)) - allowed):
                yield text_loc, f"{{{name}}} is not known here (known: {', '.join(sorted(allowed))})"
        for position, action in enumerate(cause.actions):
            if action not in ACTIONS:
                yield (*loc, "actions", position), f"unknown action {action!r} (known: {', '.join(ACTIONS)})"


def load_playbooks(directory: Path) -> tuple[list[Playbook], XidCatalog]:
    """Read and check every playbook and the Xid catalog beside them; raise PlaybookError with one
    `file:line: problem` per problem."""
    if not directory.is_dir():
        raise PlaybookError([f"{directory}: playbook directory not found"])
    problems = _Problems()
    loaded: list[tuple[Document, Playbook]] = []
    for path in sorted(directory.glob("*.yaml")):
        if path.name not in NOT_PLAYBOOKS:
            found = _load_one(path, problems)
            if found is not None:
                loaded.append(found)
    _overlap_problems(loaded, problems)
    _steps_from_problems(loaded, problems)
    try:
        catalog = load_catalog(directory)
    except XidCatalogError as exc:
        problems.items.extend(exc.problems)
    if problems.items:
        raise PlaybookError(problems.items)
    return [playbook for _, playbook in loaded], catalog


def _load_one(path: Path, problems: _Problems) -> tuple[Document, Playbook] | None:
    try:
        document = read_document(path)
    except OSError as exc:
        problems.items.append(f"{path}: {exc.strerror or exc}")
        return None
    except NotUtf8Error as exc:
        problems.items.append(f"{path}:{exc.line}: {exc}")
        return None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        problems.items.append(f"{path}{where}: {exc.problem or exc}")
        return None
    for line, loc, message in duplicate_keys(document.root):
        problems.add(document, loc, message, line)
    playbook = _validate(document, problems)
    return None if playbook is None else (document, playbook)


def _overlap_problems(loaded: Sequence[tuple[Document, Playbook]], problems: _Problems) -> None:
    """Two playbooks for the same alert name and the same matchers: which one applies would be arbitrary."""
    seen: dict[tuple[str, frozenset[str]], Path] = {}
    for document, playbook in loaded:
        if playbook.match is None:
            continue
        for name in playbook.match.alertnames:
            key = (name, frozenset(playbook.match.matchers))
            if key in seen:
                problems.add(document, ("match",), f"{seen[key].name} already matches {name} with the same matchers")
            seen.setdefault(key, document.path)


def _steps_from_problems(loaded: Sequence[tuple[Document, Playbook]], problems: _Problems) -> None:
    names = {playbook.name for _, playbook in loaded}
    for document, playbook in loaded:
        for index, case in enumerate(playbook.cases):
            if case.steps_from is not None and case.steps_from not in names:
                problems.add(document, ("cases", index, "steps_from"), f"no playbook named {case.steps_from!r}")
