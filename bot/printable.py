"""Text from alerts and from other services shown on a terminal or in a message: only what prints.

Label values and error bodies are data: an ESC (clear screen, OSC 8 links), a C1 control, a bidi override or
a raw line separator in them must be shown, not acted on by the terminal or the chat client. What does not
print is whatever `str.isprintable()` refuses: controls, format characters, separators other than the space.
"""

from __future__ import annotations


def printable(text: str, keep: str = "") -> str:
    """`text` with each character that does not print written as its Python escape (`\\x1b`, `\\u202e`);
    the characters in `keep` (e.g. a newline) stay as they are."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else ch.encode("unicode_escape").decode("ascii") for ch in text)


def printable_json(document: str) -> str:
    """A JSON document (from json.dumps) with each character that does not print inside its strings written
    as a JSON escape (`\\u001b`): the same JSON value, safe on a terminal. Newlines outside strings stay."""
    if document.isprintable():
        return document
    return "".join(ch if ch.isprintable() or ch == "\n" else _json_escape(ch) for ch in document)


def _json_escape(ch: str) -> str:
    units = ch.encode("utf-16-be")
    return "".join(f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2))
