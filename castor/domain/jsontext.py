"""JSON text: reading it safely from outside (``loads_strict``, ``well_formed``) and writing
it for people (``pretty_json``).

``loads_strict``: ``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity`` (Python
accepts them; JSON and every other reader do not), raising ``ValueError`` like any bad JSON.

``well_formed``: a value whose strings can be written as UTF-8.

A JSON escape such as ``"\\ud800"`` (in a model's answer, a utility's or a memory backend's
output, a config or settings file) or an undecodable byte in a command-line argument
(``surrogateescape``) puts a *lone surrogate* code point into a Python string. UTF-8 cannot
encode it, so nothing holding it could be written to a file or sent as msgpack, and every
retry would fail the same way. Each lone surrogate becomes U+FFFD (what a UTF-8 decoder shows
for a broken sequence); everything else is returned unchanged, as the same object.

``pretty_json``: the 2-space JSON that prompts and artifacts show, without the slow path when
it is not needed. ``json.dumps(value, indent=2)`` always runs the pure-Python encoder; for the
values prompts render most (no item, no guidance, an empty ``data``, a scalar) the indented text
equals the compact one, which the C encoder produces. The result is always exactly
``json.dumps(value, indent=2, ensure_ascii=False)``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from castor.shown import clipped

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


#: JavaScript's whitespace: what its ``\s`` matches and ``String.prototype.trim`` removes. Python's
#: ``\s`` and ``str.strip()`` differ (they take U+001C..U+001F and U+0085, and not U+FEFF).
JS_WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_WHITESPACE_RUN = re.compile(f"[{JS_WHITESPACE}]+")
_JS_TRIM = re.compile(f"^[{JS_WHITESPACE}]+|[{JS_WHITESPACE}]+$")


def js_trim(text: str) -> str:
    """``text.trim()`` as JavaScript trims."""
    return _JS_TRIM.sub("", text)


def js_collapse_whitespace(text: str) -> str:
    r"""``text.replace(/\s+/g, " ").trim()``: every run of JavaScript whitespace one space, then trimmed."""
    return _JS_WHITESPACE_RUN.sub(" ", text).strip(" ")


def js_slice(text: str, units: int) -> str:
    """``text.slice(0, units)`` as JavaScript slices: by UTF-16 code units. A surrogate pair cut in
    half leaves a lone surrogate in JavaScript; castor writes U+FFFD for it (see :func:`well_formed`)."""
    if len(text) <= units // 2:  # fewer characters than half the units: nothing to cut
        return text
    encoded = text.encode("utf-16-le", "surrogatepass")
    if len(encoded) <= 2 * units:
        return text
    return encoded[: 2 * units].decode("utf-16-le", "replace")


def well_formed(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys and nested values too) replaced
    by U+FFFD; the very same object when there is none (see the module doc)."""
    kind = type(value)
    if kind is str:
        if value.isascii() or not _LONE_SURROGATE.search(value):  # isascii: the common case, in C
            return value
        return _LONE_SURROGATE.sub("\ufffd", value)
    if kind is dict:
        for key, item in value.items():  # the common case first: ASCII text and scalars only
            if (type(key) is not str or not key.isascii() or type(item) in _NESTED
                    or (type(item) is str and not item.isascii())):
                return _well_formed_dict(value)
        return value
    if kind is list or kind is tuple:
        items = [well_formed(item) for item in value]
        return value if all(a is b for a, b in zip(value, items, strict=True)) else kind(items)
    return value


_NESTED = frozenset((dict, list, tuple))


def _well_formed_dict(value: dict[Any, Any]) -> dict[Any, Any]:
    fixed = None
    for key, item in value.items():
        new_key = key if type(key) is str and key.isascii() else well_formed(key)
        item_kind = type(item)
        if item_kind is str:
            new_item = item if item.isascii() else well_formed(item)
        elif item_kind in _NESTED:
            new_item = well_formed(item)
        else:
            new_item = item  # what well_formed returns for anything else
        if fixed is None and (new_key is not key or new_item is not item):
            fixed = {}
            for done_key, done_item in value.items():  # the unchanged ones before this item
                if done_key is key:
                    break
                fixed[done_key] = done_item
        if fixed is not None:
            fixed[new_key] = new_item
    return value if fixed is None else fixed


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str | bytes) -> Any:
    """``json.loads`` without the non-standard constants (see the module doc)."""
    return json.loads(text, parse_constant=_reject_constant)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects or arrays more than ``limit`` deep (level by level, no
    recursion: any depth is safe to ask about)."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
    return False


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words, for an error about a file's value
    (``null``, ``a boolean``, ``a number``, ``a string``, ``an array``, ``an object``), never a
    Python type name (``NoneType``, ``list``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "an object"


def json_shown(value: Any, limit: int = 120) -> str:
    """A decoded JSON value as JSON text (``null``, ``true``, ``"yaml"``, ``3``), for an error
    that quotes a file's value back: never a Python spelling (``None``, ``True``, ``'yaml'``).
    Text longer than ``limit`` characters is cut and says how long it was; line breaks and other
    controls are JSON escapes, so the value stays on one line."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = json_kind(value)
    return clipped(text, limit)


def json_problem(exc: BaseException) -> str:
    """Why a JSON text could not be read, in a few words, for an error naming the file.

    Python's reader fails on valid-looking text in two ways that are not ``JSONDecodeError``: a
    value nested deeper than the interpreter's recursion limit (``RecursionError``) and an integer
    of more than 4,300 digits (a plain ``ValueError``). A reader of a file from outside catches
    ``(ValueError, RecursionError)`` and says this, never a traceback or Python's own advice."""
    if isinstance(exc, RecursionError):
        return "a value is nested too deeply"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if "integer string conversion" in str(exc):
        return "an integer has more than 4300 digits"
    return str(exc)


def pretty_json(value: Any) -> str:
    """``json.dumps(value, indent=2, ensure_ascii=False)``, by the C encoder when that gives the
    same text (see the module doc), with a small number written as JavaScript writes it
    (``1.5e-7``, ``0.00001``, not Python's ``1.5e-07``, ``1e-05``)."""
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        if not value:
            return "{}" if isinstance(value, dict) else "[]"
        text = json.dumps(value, indent=2, ensure_ascii=False)
    elif isinstance(value, (str, int, float)):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = json.dumps(value, indent=2, ensure_ascii=False)
    # Only a float below 1e-4 is written with a negative exponent (Python's repr), and only those
    # differ from JavaScript's text (integral floats are ints once read: js_float). A C-speed scan
    # of the text decides; a string that merely looks like one costs a second encoding, no more.
    if _NEGATIVE_EXPONENT.search(text) is None:
        return text
    return _with_js_small_numbers(value)


_NEGATIVE_EXPONENT = re.compile(r"\de-\d")


def map_scalars(value: Any, change: Callable[[Any], Any]) -> Any:
    """``value`` (JSON-shaped: dicts, lists, tuples as lists) with ``change`` applied to every
    value that is neither a dict nor a list; keys unchanged."""
    if isinstance(value, dict):
        return {k: map_scalars(v, change) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_scalars(v, change) for v in value]
    return change(value)


def _with_js_small_numbers(value: Any) -> str:
    return _with_js_numbers(value, indent=2, marked=lambda item: item != 0 and abs(item) < 1e-4)


def js_stringify(value: Any) -> str:
    """``JSON.stringify(value)``: no spaces, text as it is (``café``, not ``caf\\u00e9``), every
    number as JavaScript writes it (``1`` for ``1.0``; NaN and Infinity as ``null``)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return _with_js_numbers(value, indent=None, marked=lambda _item: True)


def _with_js_numbers(value: Any, *, indent: int | None, marked: Callable[[float], bool]) -> str:
    marks: dict[str, str] = {}
    nonce = f"\x00castor-number-{id(marks)}-"

    def mark(item: Any) -> Any:
        if isinstance(item, float) and marked(item):
            key = f"{nonce}{len(marks)}"
            marks[key] = js_number_text(item) if math.isfinite(item) else "null"
            return key
        return item

    text = json.dumps(map_scalars(value, mark), indent=indent, separators=None if indent else (",", ":"),
                      ensure_ascii=False)
    for key, number in marks.items():
        text = text.replace(json.dumps(key, ensure_ascii=False), number, 1)
    return text


# JavaScript's view of numbers and text. pi-materia is JavaScript: a JSON number has one type
# there, so ``1.0`` in a model's reply *is* ``1`` and is written back as ``1``, and an item id is
# turned into text by ``String(...)``. castor reads numbers the same way and turns ids into text
# the same way, so artifact names, item keys and rendered prompts are the ones pi-materia makes.

_JS_INTEGER_LIMIT = 1e21  # from here on JavaScript writes numbers with an exponent


def js_float(text: str) -> int | float | None:
    """A JSON number literal with a fraction or exponent, as JavaScript holds it: an integral value
    below 1e21 as an ``int`` with the digits ``JSON.stringify`` writes (``"1.0"`` → ``1``,
    ``"1e3"`` → ``1000``), else a float; out of range (``1e999``) → ``None``, the ``null``
    ``JSON.stringify`` writes for it. For ``json`` decoders' ``parse_float``."""
    value = float(text)
    if value in (math.inf, -math.inf):
        return None
    if value.is_integer() and abs(value) < _JS_INTEGER_LIMIT:
        # the shortest digits that read back as this float, as JavaScript prints them (beyond 2**53
        # the float's exact binary value has other trailing digits)
        return int(Decimal(repr(value)))
    return value


def js_int(text: str) -> int | float | None:
    """A JSON integer literal as JavaScript holds it: exact up to 2**53, beyond that the nearest
    double (written with its shortest digits, as :func:`js_float`). For ``parse_int``."""
    value = int(text)
    return value if -_JS_SAFE <= value <= _JS_SAFE else js_float(text)


_JS_SAFE = 2**53


def js_string(value: Any) -> str:
    """JavaScript's ``String(value)`` of a JSON value: ``true``, ``1`` (for ``1.0``), ``1.5``,
    ``null``, arrays joined by commas (``null`` as empty), an object ``[object Object]``."""
    if isinstance(value, str):
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return js_number_text(value)
    if isinstance(value, (list, tuple)):
        return ",".join("" if item is None else js_string(item) for item in value)
    if isinstance(value, dict):
        return "[object Object]"
    return str(value)


def js_number_text(value: float) -> str:
    """JavaScript's text for a number (``Number.prototype.toString``): integral values without a
    fraction, exponents from 1e21 up and below 1e-6, written ``1e+21`` / ``1.5e-7``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    digits_tuple = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digits_tuple.digits))
    exponent = int(digits_tuple.exponent)
    k, n = len(digits), exponent + len(digits)  # digits × 10^(n-k)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    power = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{mantissa}e{'+' if power > 0 else '-'}{abs(power)}"


_MSGPACK_INT_MIN, _MSGPACK_INT_MAX = -(2**63), 2**64 - 1


def wide_integers_as_floats(value: Any) -> Any:
    """``value`` with every integer outside msgpack's 64-bit range as the nearest double (as
    JavaScript holds it; past the double's range ``None``, what ``JSON.stringify`` writes for it);
    the rest unchanged. For a result that cannot be sent as it is: it walks the whole value."""
    return map_scalars(value, _wide_integer_as_float)


def _wide_integer_as_float(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or _MSGPACK_INT_MIN <= value <= _MSGPACK_INT_MAX:
        return value
    try:
        return float(value)
    except OverflowError:
        return None
