"""Value expressions, assignment paths and conditions.

Expressions (used by ``assign`` sources, ``advance.items``, ``foreach.items``, conditions):

| expression | reads |
|---|---|
| ``$`` / ``$.a.b`` | the parsed output of the socket |
| ``state`` / ``state.a.b`` | ``state.data`` |
| ``item`` / ``item.x`` | ``state.data.item`` |
| ``lastJson`` / ``lastJson.x`` | the last parsed JSON output |
| ``lastOutput`` | the last raw output text |
| anything else | a path into ``state.data`` |

A step into a missing key, ``None`` or a primitive yields :data:`MISSING` (the reference's
``undefined``); a key that holds ``None`` reads ``None`` (``null``), and conditions keep the two
apart as ``===`` does: ``exists`` is true of a stored ``null``, ``null`` equals only ``null``.
Numeric segments index lists, and ``length`` reads a list's length (an array is an object).
Nothing here raises except :class:`ConditionError` for an unsupported condition and
:class:`AssignError` for an empty target or a step into a list that is no index of it. A path
holds dotted keys only: JSONPath's brackets (``$['x']``, ``$.items[0]``), wildcards (``*``),
recursive descent (``$..x``) and filters read nothing (pi-materia reads them as keys, and finds
none); :func:`unreadable_path` says why, and the
dotted path that reads what was meant, so the config's loading can warn about them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from castor.domain.jsontext import js_float
from castor.messages.errors import CastorError, ErrorCode


class _Missing:
    _instance = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


class ConditionError(CastorError):
    code = ErrorCode.INVALID_CONFIG


class AssignError(CastorError):
    code = ErrorCode.INVALID_CONFIG


@dataclass
class Scope:
    """What an expression can see."""

    data: dict[str, Any]
    parsed: Any = MISSING
    last_json: Any = MISSING
    last_output: Any = MISSING
    extra: dict[str, Any] = field(default_factory=dict)


_MAX_INDEX_DIGITS = 18


def walk(value: Any, path: str) -> Any:
    """Follow a dotted path; :data:`MISSING` as soon as a step cannot be taken."""
    if path == "":
        return value
    for segment in path.split("."):
        if isinstance(value, dict):
            value = value.get(segment, MISSING) if segment in value else MISSING
        elif isinstance(value, list) and segment.isascii() and segment.isdigit():  # "²" is a digit to isdigit
            # no list is longer than 18 digits count; int() of thousands of digits raises
            index = int(segment) if len(segment) <= _MAX_INDEX_DIGITS else len(value)
            value = value[index] if index < len(value) else MISSING
        elif isinstance(value, list) and segment == "length":  # an array is an object: its length reads
            value = len(value)
        else:
            return MISSING
        if value is MISSING:
            return MISSING
    return value


def _rooted(expr: str, root: str) -> str | None:
    if expr == root:
        return ""
    if expr.startswith(root + "."):
        return expr[len(root) + 1:]
    return None


def resolve_value(expr: str, scope: Scope) -> Any:
    """What ``expr`` reads in ``scope`` (the table above); :data:`MISSING` where nothing is. An
    empty expression is the key ``""`` of the cast's data, as pi-materia's ``getPath(data, "")``
    reads it -- never the whole data (``assign: {"x": ""}`` doubled the data at every visit)."""
    expr = expr.strip()
    if not expr:
        return scope.data.get("", MISSING)
    if expr == "$":
        return scope.parsed
    if expr.startswith("$."):
        return walk(scope.parsed, expr[2:]) if scope.parsed is not MISSING else MISSING
    for root, base in (("state", scope.data), ("item", scope.data.get("item", MISSING)),
                       ("lastJson", scope.last_json)):
        rest = _rooted(expr, root)
        if rest is not None:
            return MISSING if base is MISSING else walk(base, rest)
    if expr == "lastOutput":
        return scope.last_output
    return walk(scope.data, expr)


#: A bracket step of JSONPath whose dotted form castor reads: ``['name']``, ``["name"]`` or ``[0]``.
_BRACKET_STEP = re.compile(r"""\[\s*(?:'([^'.\[\]]*)'|"([^".\[\]]*)"|([0-9]+))\s*\]""")
_EXPRESSION_ROOTS = ("state", "item", "lastJson")


def unreadable_path(expr: str) -> tuple[str, str | None] | None:
    """Why ``expr`` (an ``assign`` source, an ``items`` expression) reads nothing whatever the data
    -- JSONPath written where a dotted path is read -- and the dotted path that reads what it
    meant (None when there is none: a wildcard, a recursive descent, a filter); None for an
    expression castor's syntax reads. Never raises."""
    text = expr.strip()
    if not text:
        return "the expression is empty: nothing is read", None
    if text in ("$", "lastOutput"):
        return None
    if text.startswith("$") and not text.startswith(("$.", "$[")):
        return (f"it reads the key \"{text.split('.')[0]}\" of the cast's data, not the output (\"$\" is the "
                "parsed output, \"$.a.b\" a path into it)"), "$." + text[1:]
    segments = text.split(".")
    if "*" in segments or "[*]" in text:
        return "a JSONPath wildcard (*) is no step of a dotted path: nothing is read", None
    if ".." in text:
        return "a JSONPath recursive descent (..) is no step of a dotted path: nothing is read", None
    if "?(" in text or "@" in text:
        return "a JSONPath filter (?(...), @) is no step of a dotted path: nothing is read", None
    if "[" not in text and "]" not in text:
        if "" in segments:
            return "a step of the path is empty (a leading or trailing dot): nothing is read", None
        return None
    dotted = _BRACKET_STEP.sub(lambda m: "." + next(g for g in m.groups() if g is not None), text)
    readable = "[" not in dotted and "]" not in dotted and "" not in dotted.split(".")
    return ("JSONPath's brackets are no step of a dotted path (a key is a dotted step, a list index a numeric "
            "one): they are read as part of a key, and nothing is found", dotted if readable else None)


def misread_target(target: str) -> tuple[str, str | None] | None:
    """Why assign target ``target`` writes where the expression it looks like does not read --
    ``"$.x"`` writes the key ``"$"`` of the cast's data (``$.x`` reads the output), ``"state.x"``
    writes ``data.state.x`` (``state.x`` reads ``data.x``), as do ``lastJson.``/``lastOutput``, and
    JSONPath's brackets are part of a key -- with the target meant (None when there is none); None
    for a plain dotted path. Never raises."""
    text = target.strip()
    dotted = _BRACKET_STEP.sub(lambda m: "." + next(g for g in m.groups() if g is not None), text)
    key = text.split(".")[0]
    if text == "$" or text.startswith(("$.", "$[")) or key in ("state", "lastJson", "lastOutput"):
        root = "$" if dotted.startswith("$.") or dotted == "$" else key
        rest = dotted[len(root) + 1:] if dotted.startswith(root + ".") else dotted[1:] if root.startswith("$") else ""
        meant = rest if rest and unreadable_path(rest) is None else None
        return (f"a target is a dotted path into the cast's data, not an expression: it writes the key "
                f"\"{key}\" of the data, where \"{text}\" does not read it back"), meant
    found = unreadable_path(text) if "[" in text or "]" in text else None
    if found is not None and found[1] is not None:  # "items[0]" meant "items.0": a list's index (set_path)
        bracketed = next(segment for segment in text.split(".") if "[" in segment or "]" in segment)
        return (f"it writes the key \"{bracketed}\" (JSONPath's brackets are part of a target's key, which no "
                "expression reads as a step)"), found[1]
    return None


def path_segments(target: str) -> list[str]:
    """The keys a dotted assign target names, empty segments dropped."""
    return [part for part in target.strip().split(".") if part]


def set_path(data: dict[str, Any], target: str, value: Any) -> None:
    """Write ``value`` at dotted ``target`` in ``data`` (in place).

    Intermediates are created; a primitive (or ``null``) intermediate is replaced by an object.
    Writing :data:`MISSING` removes the key (JSON has no ``undefined``). Empty segments are dropped,
    as pi-materia drops them (``"a..b"`` is ``a.b``, ``"result."`` is ``result``); a target with no
    segment at all is refused (pi-materia writes it under the key ``"undefined"``).

    A list on the way is an object to pi-materia (an array is one): a step into it is an index, as
    :func:`walk` reads it -- ``"items.0.done"`` writes into the first item, ``"items.2"`` of a
    two-item list appends. A step a list has no slot for (a key that is no index, an index past
    its end) is an :class:`AssignError` (``invalid_config``) raised before anything is written:
    the list is never replaced by an object (that lost its items), nor given a key no JSON keeps.
    """
    parts = path_segments(target)
    if not parts:
        raise AssignError(f"invalid assign target {target!r}: a non-empty dotted path is required")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            index = _list_slot(node, part, target, depth, appending=False)
            child = node[index]
            if not isinstance(child, (dict, list)):
                child = {}
                node[index] = child
        else:
            child = node.get(part)
            if not isinstance(child, (dict, list)):
                child = {}
                node[part] = child
        node = child
    if isinstance(node, list):
        index = _list_slot(node, parts[-1], target, len(parts) - 1, appending=True)
        written = None if value is MISSING else value  # JSON.stringify writes an undefined item as null
        if index == len(node):
            node.append(written)
        else:
            node[index] = written
    elif value is MISSING:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value


def _list_slot(node: list[Any], part: str, target: str, depth: int, *, appending: bool) -> int:
    """The index step ``part`` of ``target`` names in list ``node`` (its end too when
    ``appending``), else :class:`AssignError`."""
    shown = target if len(target) <= 80 else target[:77] + "..."
    where = ".".join(path_segments(target)[:depth]) or "the data"
    if not (part.isascii() and part.isdigit()):
        raise AssignError(f"assign target {shown!r}: {where!r} holds a list, and the step {part[:40]!r} is no "
                          "index of it (a list's steps are 0, 1, ...); nothing was written")
    last = len(node) if appending else len(node) - 1
    index = int(part) if len(part) <= _MAX_INDEX_DIGITS else last + 1
    if index > last:
        reach = f"0 to {last}" if last >= 0 else "none"
        raise AssignError(f"assign target {shown!r}: {where!r} holds a list of {len(node)} item(s), and index "
                          f"{part[:40]} is past it (indexes written: {reach}); nothing was written")
    return index


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


_EXISTS = re.compile(r"^(!?)exists\((.+)\)$")  # something inside, as pi-materia requires
# pi-materia's ``^(.+?)\s*(==|!=)\s*(.+)$`` read in linear time (that pattern backtracks over a run
# of spaces once per position before it: a megabyte-long condition held the cast for hours). On
# a stripped condition the lazy left side ends at the first operator and never in whitespace.
_COMPARE_LEFT = re.compile(r"(.*?\S)\s*(==|!=)")
_NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")  # pi-materia's literal: ASCII digits (JavaScript's \d), no exponent


def _literal(text: str, scope: Scope) -> Any:
    text = text.strip()
    if text == "true":
        return True
    if text == "false":
        return False
    if text == "null":
        return None
    if _NUMBER.match(text):  # as Number() reads it: "01" is 1 (json.loads refused it: a crash)
        return _js_number(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return resolve_value(text, scope)


def _js_number(text: str) -> int | float:
    """A decimal literal as JavaScript's ``Number()`` holds it, in the form a model's JSON is read
    in (:func:`castor.domain.jsontext.js_float`): an integral value below 1e21 an ``int`` (past
    2**53 the nearest double's), out of range ``±inf`` -- never ``int()`` of the text, which
    raises past 4,300 digits and keeps digits no double has."""
    number = float(text)  # any length; past the range it is inf, as Number("1e999") is Infinity
    if not math.isfinite(number):
        return number
    held = js_float(text)
    return held if held is not None else number


def _split_compare(cond: str) -> tuple[str, str, str] | None:
    """(left, operator, right) of a stripped ``left ==/!= right``, as pi-materia's pattern splits it
    (neither side crosses a line break), or None."""
    match = _COMPARE_LEFT.match(cond)
    if match is None:
        return None
    right = cond[match.end():].lstrip()
    if not right or "\n" in right:
        return None
    return match.group(1), match.group(2), right


def evaluate_condition(condition: str, scope: Scope) -> bool:
    """``always`` | ``satisfied`` | ``not_satisfied`` | ``[!]exists(expr)`` | ``expr ==/!= literal``."""
    cond = condition.strip()
    if cond == "always":
        return True
    if cond in ("satisfied", "not_satisfied"):
        flag = walk(scope.parsed, "satisfied") if isinstance(scope.parsed, dict) else MISSING
        return flag is (cond == "satisfied")
    match = _EXISTS.match(cond)
    if match:
        found = resolve_value(match.group(2), scope) is not MISSING  # a stored null exists (null !== undefined)
        return found if not match.group(1) else not found
    parts = _split_compare(cond)
    if parts is not None:
        left = resolve_value(parts[0], scope)
        right = _literal(parts[2], scope)
        # MISSING is JavaScript's undefined: equal to itself only, never to null (===)
        equal = left == right and type(left) is type(right) if isinstance(left, bool) or isinstance(right, bool) \
            else left == right
        return equal if parts[1] == "==" else not equal
    raise ConditionError(f"Unsupported Materia condition: {condition}")
