"""bot/ stays a set of modules of one job each: none grows past about 400 lines unless README's architecture
section names it and says why."""

from __future__ import annotations

import re
from pathlib import Path

import bot

PACKAGE = Path(bot.__file__).parent
README = PACKAGE.parent / "README.md"
LIMIT = 400


def explained_long_modules() -> set[str]:
    """The `bot/...py` paths README's "Longer modules" paragraph names."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    paragraph = section.split("Longer modules", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`(bot/[\w/]+\.py)`", paragraph))


def line_counts() -> dict[str, int]:
    return {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }


def test_no_module_is_long_unless_readme_says_why() -> None:
    explained = explained_long_modules()
    unexplained = {path: lines for path, lines in line_counts().items() if lines > LIMIT and path not in explained}
    assert unexplained == {}, f"split these modules or say in README's architecture section why not: {unexplained}"


def test_readme_explains_only_modules_that_are_long() -> None:
    counts = line_counts()
    stale = {path for path in explained_long_modules() if counts.get(path, 0) <= LIMIT}
    assert stale == set(), f"README names these as longer modules, but they are not (any more): {stale}"
