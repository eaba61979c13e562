"""JSON text helpers.

``pretty_json``: the 2-space JSON that prompts and artifacts show, without the slow path when
it is not needed.

``json.dumps(value, indent=2)`` always runs the pure-Python encoder; for the values prompts
render most (no item, no guidance, an empty ``data``, a scalar) the indented text equals the
compact one, which the C encoder produces. The result is always exactly
``json.dumps(value, indent=2, ensure_ascii=False)``.

``well_formed``: a value whose strings can be written as UTF-8. A JSON escape such as
``"\\ud800"`` (in a model's answer, a utility's output, a config file) or an undecodable byte in
a command-line argument (``surrogateescape``) puts a *lone surrogate* code point into a Python
string; UTF-8 cannot encode it, so the cast's state, events and artifacts could not be written
and every retry would fail the same way. Each lone surrogate becomes U+FFFD (what a UTF-8
decoder shows for a broken sequence); everything else is returned unchanged, as the same object.
"""

from __future__ import annotations

import json
import re
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def pretty_json(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        if not value:
            return "{}" if isinstance(value, dict) else "[]"
        return json.dumps(value, indent=2, ensure_ascii=False)
    if isinstance(value, (str, int, float)):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, indent=2, ensure_ascii=False)


def well_formed(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys and nested values too) replaced
    by U+FFFD; the very same object when there is none (see the module doc)."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value) if _LONE_SURROGATE.search(value) else value
    if isinstance(value, dict):
        fixed = {well_formed(k): well_formed(v) for k, v in value.items()}
        same = all(a is b and c is d for (a, c), (b, d) in zip(value.items(), fixed.items()))
        return value if same and len(fixed) == len(value) else fixed
    if isinstance(value, (list, tuple)):
        items = [well_formed(v) for v in value]
        return value if all(a is b for a, b in zip(value, items)) else type(value)(items)
    return value
