"""``pretty_json``: the 2-space JSON that prompts and artifacts show, without the slow path when
it is not needed.

``json.dumps(value, indent=2)`` always runs the pure-Python encoder; for the values prompts
render most (no item, no guidance, an empty ``data``, a scalar) the indented text equals the
compact one, which the C encoder produces. The result is always exactly
``json.dumps(value, indent=2, ensure_ascii=False)``.
"""

from __future__ import annotations

import json
from typing import Any


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
