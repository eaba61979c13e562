"""Text someone else chose, as castor shows it: on one line, its control characters as escapes.

A loadout name, a model's error text or a request may hold a line break or a terminal escape; shown
raw, a line break starts a line that reads as castor's own and an ESC drives the user's terminal.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (line breaks, tabs, ESC, other controls)
    shown as its Python escape (``\\n``, ``\\x1b``); printable text, any script, is kept as it is."""
    if text.isprintable():  # the common case, one C call
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for ch in text)


def clipped(text: str, limit: int = 200) -> str:
    """:func:`one_line` of ``text``'s first ``limit`` characters, and how long it was when it was
    longer: what an answer echoes of a name someone sent (a method, an id), whatever its size."""
    if len(text) <= limit:
        return one_line(text)
    return f"{one_line(text[:limit])}... ({len(text)} characters)"


def lines_kept(text: str) -> str:
    """:func:`one_line` for each line of ``text``: its line breaks kept, everything else escaped."""
    return "\n".join(one_line(line) for line in text.split("\n"))
