"""The handoff contract: JSON extraction, envelope validation and application, ``assign``,
and the contract text each JSON socket's prompt carries.

Extraction (:func:`extract_json`) — more forgiving than pi-materia's (a deliberate difference):
candidates are every fenced block in order, then the whole text. A candidate that is JSON as a
whole is the value (as ``JSON.parse`` of it: a whole-reply array is an array, and fails
validation). Otherwise, in each, every ``{``/``[`` is tried in order (a prefix parse, then a
balanced scan that honours strings and escapes); an opener inside a value already read, or inside
a bracketed span that did not parse, is part of it and is skipped. The first JSON **object** found
wins; if there is none, the first JSON value; if nothing parses, :class:`HandoffError`. ``NaN``/``Infinity`` are not
JSON (refused, as by ``JSON.parse``), a number out of range is ``null``, and a value nested deeper
than :data:`MAX_DEPTH` is refused (a state holding it could not be saved). So prose with stray
brackets before the real object no longer breaks a cast. The only exception it ever raises is :class:`HandoffError`.

Validation (:func:`validate_handoff`) — a top-level object; ``satisfied`` a boolean
when present and **required** when routing depends on it; ``feedback`` a string; ``missing``
a list. ``passed`` is never read; its presence only adds a note to the error.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from castor.domain.jsontext import js_float, js_int, nested_deeper_than, pretty_json, well_formed
from castor.domain.materia.config import Socket, object_at
from castor.domain.materia.expressions import MISSING, AssignError, Scope, path_segments, resolve_value, set_path
from castor.messages.errors import CastorError, ErrorCode

CANONICAL_FIELDS = ("summary", "workItems", "guidance", "decisions", "risks", "satisfied", "feedback", "missing")
RESERVED_EVALUATOR_FIELDS = ("satisfied", "feedback", "missing")
GUARDED = ("satisfied", "not_satisfied")

# The opening fence's tag is taken atomically (?>...): it holds no backtick, so giving any of it back
# to the body can never find a closing fence the greedy reading missed -- but the backtracking tried
# every split of a run of spaces and scanned the rest of the reply for each (cubic: 2,000 spaces
# after an unclosed fence took 53 s).
_FENCE = re.compile(r"```(?>[ \t]*(?:json)?[ \t]*\r?\n?)(.*?)```", re.IGNORECASE | re.DOTALL)
_MAX_OPENERS = 256  # bounds the work on adversarial text (each attempt is linear)
_JSON_NEXT = re.compile(r"\s*[\"{\[\]}]")
_SCAN_BUDGET = 2 * 1024 * 1024
"""Characters the pure-Python balanced-span fallback may scan per extraction, over all openers:
without it, a reply of a few MB of ``[`` would hold the cast's actor for minutes (abort too)."""
#: The deepest JSON castor takes from a reply: a state holding deeper data cannot be saved (its
#: serializer stops at about 255 levels), so a deeper reply was a crash on every restart.
MAX_DEPTH = 200


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # as JSON.parse: NaN and Infinity are not values


# strict=False: a raw line break or tab inside a string is taken (models write them; a deliberate
# difference, docs/materia.md); NaN/Infinity literals are not JSON and are refused, as JSON.parse does;
# numbers are read as JavaScript holds them (1.0 is 1, 1e999 is null: castor.domain.jsontext.js_float).
_DECODER = json.JSONDecoder(strict=False, parse_constant=_no_constant, parse_float=js_float, parse_int=js_int)


class HandoffError(CastorError):
    """Assistant output could not become a valid handoff. ``data["reason"]`` is stable:
    ``no-json`` | ``unparseable`` | ``invalid-handoff``."""

    code = ErrorCode.INVALID_PARAMS

    @property
    def reason(self) -> str:
        return str(self.data.get("reason", ""))


def _preview(text: str) -> str:
    return text[:400]


def _balanced_span(text: str, start: int, budget: list[int]) -> str | None:
    """The span from ``start`` to its matching closer, scanning at most ``budget[0]`` characters
    (what it scans is taken from the budget; an exhausted budget finds nothing)."""
    opener = text[start]
    closer = "}" if opener == "{" else "]"
    depth = 0
    in_string = False
    escaped = False
    end = min(len(text), start + budget[0])
    for i in range(start, end):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch == opener:
            depth += 1
        elif ch == closer:
            depth -= 1
            if depth == 0:
                budget[0] -= i + 1 - start
                return text[start:i + 1]
    budget[0] -= end - start
    return None


def _parse_at(text: str, start: int, budget: list[int]) -> tuple[bool, Any, int]:
    """The JSON value at ``start`` (escapes of lone surrogates come out as U+FFFD), and on failure
    where the broken value ends: the openers before that are its parts, never the reply's value (a
    reply with one slip, a trailing comma, is "unparseable", not its first work item taken for the
    whole handoff). A span that never closes covers the rest of the text when it starts as JSON does
    (a quote or a bracket next: a truncated reply); a lone bracket in prose covers nothing."""
    try:
        value, _end = _DECODER.raw_decode(text, start)
        return True, well_formed(value), _end
    except (ValueError, RecursionError):
        pass
    if budget[0] <= 0:
        return False, None, start + 1
    span = _balanced_span(text, start, budget)
    if span is None:
        return False, None, len(text) if _JSON_NEXT.match(text, start + 1) else start + 1
    try:
        return True, well_formed(_DECODER.decode(span)), start + len(span)
    except (ValueError, RecursionError):
        return False, None, start + len(span)


def _candidates(text: str) -> list[str]:
    fenced = [m.group(1).strip() for m in _FENCE.finditer(text)]
    return [c for c in fenced if c] + [text.strip()]


def extract_json(text: Any) -> Any:
    """The JSON value an assistant meant to return (see module doc). Raises HandoffError only."""
    value = _extract(text)
    if nested_deeper_than(value, MAX_DEPTH):
        raise HandoffError(f"Agent output JSON is nested deeper than {MAX_DEPTH} levels: {_preview(text)}",
                           data={"reason": "unparseable"})
    return value


def _extract(text: Any) -> Any:
    if not isinstance(text, str):
        raise HandoffError("No JSON found in agent output: <not text>", data={"reason": "no-json"})
    for candidate in _candidates(text):  # a candidate that is JSON as a whole is the value (JSON.parse's)
        if candidate[:1] in ("{", "["):
            try:
                return well_formed(_DECODER.decode(candidate))
            except (ValueError, RecursionError):
                pass
    first_value: Any = MISSING
    saw_opener = False
    tried = 0
    budget = [_SCAN_BUDGET]
    for candidate in _candidates(text):
        inside_until = 0  # openers before this lie inside a broken value
        for match in re.finditer(r"[\[{]", candidate):
            if match.start() < inside_until:
                continue
            saw_opener = True
            tried += 1
            if tried > _MAX_OPENERS:
                break
            ok, value, inside_until = _parse_at(candidate, match.start(), budget)
            if not ok:
                continue
            if isinstance(value, dict):
                return value
            if first_value is MISSING:
                first_value = value
        if tried > _MAX_OPENERS:
            break
    if first_value is not MISSING:
        return first_value
    if not saw_opener:
        raise HandoffError(f"No JSON found in agent output: {_preview(text)}", data={"reason": "no-json"})
    raise HandoffError(f"Could not parse JSON from agent output: {_preview(text)}", data={"reason": "unparseable"})


def requires_satisfied(socket: Socket) -> bool:
    """True when routing depends on ``satisfied`` (a guarded edge or a guarded ``advance.when``)."""
    if any(edge.when in GUARDED for edge in socket.edges):
        return True
    return bool(socket.advance and (socket.advance.when or "").strip() in GUARDED)


def validate_handoff(parsed: Any, socket_id: str, *, require_satisfied: bool) -> dict[str, Any]:
    """Returns the object; raises HandoffError(reason="invalid-handoff") with every problem."""
    prefix = f'Invalid handoff JSON output for socket "{socket_id}":'
    if not isinstance(parsed, dict):
        raise HandoffError(f"{prefix} expected a JSON object at the top level", data={"reason": "invalid-handoff"})
    problems = []
    if "satisfied" in parsed and not isinstance(parsed["satisfied"], bool):
        problems.append('reserved control field "satisfied" must be a boolean')
    if "feedback" in parsed and not isinstance(parsed["feedback"], str):
        problems.append('reserved evaluator field "feedback" must be a string')
    if "missing" in parsed and not isinstance(parsed["missing"], list):
        problems.append('reserved evaluator field "missing" must be an array')
    if require_satisfied and "satisfied" not in parsed:
        note = (' Legacy field "passed" is not canonical and is never read; use "satisfied".'
                if "passed" in parsed else "")
        problems.append('must include reserved boolean field "satisfied" because this socket routes on it.' + note)
    if problems:
        raise HandoffError(f"{prefix} " + "; ".join(problems), data={"reason": "invalid-handoff"})
    return parsed


def apply_envelope(data: dict[str, Any], parsed: Any, *, adopt_work_items: bool) -> dict[str, Any]:
    """Apply the envelope to a copy of ``data``. ``adopt_work_items``: the socket is a generator agent socket.

    ``data["envelope"]`` is written only when it holds something (the previous envelope or a
    canonical field of ``parsed``), as pi-materia's ``applyGenericHandoffEnvelope``: an output
    with no canonical field leaves no empty ``envelope`` in the cast's data."""
    out = copy.deepcopy(data)
    if not isinstance(parsed, dict):
        return out
    envelope = dict(out.get("envelope") or {}) if isinstance(out.get("envelope"), dict) else {}
    for key in CANONICAL_FIELDS:
        if key in parsed:
            envelope[key] = copy.deepcopy(parsed[key])
    if envelope:
        out["envelope"] = envelope
    items = parsed.get("workItems")
    if isinstance(items, list) and items:
        current = out.get("workItems")
        if not (isinstance(current, list) and current) or adopt_work_items:
            out["workItems"] = copy.deepcopy(items)
    guidance = parsed.get("guidance")
    if isinstance(guidance, dict):
        base = object_at(out, "guidance")
        out["guidance"] = {**base, **copy.deepcopy(guidance)}
    summary = parsed.get("summary")
    if isinstance(summary, str) and summary.strip():
        out["summary"] = summary
    for key in ("decisions", "risks"):
        if isinstance(parsed.get(key), list) and parsed[key]:
            out[key] = copy.deepcopy(parsed[key])
    return out


def apply_assign(data: dict[str, Any], assign: dict[str, str], scope: Scope) -> dict[str, Any]:
    """Apply ``assign`` (target ← source expression) on a copy of ``data``, in declaration order;
    ``data`` itself when there is nothing to assign (no copy: it is never changed)."""
    if not assign:
        return data
    out = copy.deepcopy(data)
    for target, source in assign.items():
        value = resolve_value(source, Scope(data=out, parsed=scope.parsed, last_json=scope.last_json,
                                            last_output=scope.last_output))
        depth = len(path_segments(target))
        if depth > MAX_DEPTH or nested_deeper_than(value, MAX_DEPTH - depth):
            shown = target if len(target) <= 80 else target[:77] + "..."
            raise AssignError(f"assign target {shown!r} would nest the cast's data deeper than {MAX_DEPTH} levels "
                              "(a state holding it could not be saved)")
        set_path(out, target, copy.deepcopy(value))
    return out


# --------------------------------------------------------------------------- contract text

ENVELOPE_SHAPE = (
    '{"summary": string, "workItems": WorkItem[], "guidance": object, "decisions": array, '
    '"risks": array, "satisfied": boolean, "feedback": string, "missing": array}'
)
WORK_ITEM_SHAPE = (
    '{"id": string, "title": string, "description": string, "acceptance": string[], '
    '"context": {"architecture"?: string, "constraints": string[], "dependencies": string[], "risks": string[]}}'
)


def contract_text() -> str:
    """The handoff contract every JSON socket is shown."""
    return "\n".join([
        "Handoff contract:",
        f"- The output is one JSON object, the handoff envelope: {ENVELOPE_SHAPE}. Every field is optional; "
        "add socket-specific fields beside them when the instructions ask for them.",
        f"- A work item looks like {WORK_ITEM_SHAPE}.",
        '- Units of work are always called "workItems", never "tasks" or another name.',
        "- Keep the context you were given: carry forward and extend the envelope, do not drop it.",
        '- "satisfied", "feedback" and "missing" are reserved for evaluation; do not use them for anything else.',
        '- "satisfied" is the one routing flag. When you give it, it must be a real JSON boolean (true/false), '
        "not a string.",
        "- Extra fields may sit beside the envelope but must not restate or shadow the reserved meanings.",
        '- Do not invent other routing flags such as "passed"; they are ignored.',
        "- Return the object and nothing else.",
    ])


def json_final_instruction() -> str:
    """The closing instruction of a single-turn (or finalizing) JSON socket."""
    return "\n".join([
        "Final output format: Return only JSON for this socket adapter.",
        "Do not wrap it in markdown fences and do not add prose or commentary around it. "
        'If the instructions above speak of "tasks", emit them as "workItems". Keep and extend any envelope '
        "context you were given.",
        contract_text(),
    ])


def generator_adapter_context(upstream_work_items: Any) -> str:
    lines = [
        "Generator socket adapter context:",
        "- This socket generates work; return only the handoff envelope.",
        '- The generated units go in "workItems" (read downstream as $.workItems); no "tasks" or other aliases.',
        "- The reserved fields satisfied/feedback/missing must not carry generated payload.",
    ]
    if isinstance(upstream_work_items, list) and upstream_work_items:
        lines.append("- Earlier work items are below; transform or refine them into a new workItems array:")
        lines.append(pretty_json(upstream_work_items))
    lines.append('- The old "generates" setting is only a migration aid; generator: true always means workItems.')
    return "\n".join(lines)


def text_adapter_context(current_item: Any, guidance: Any) -> str:
    item_json = pretty_json(current_item) if current_item is not MISSING else "null"
    guidance_json = pretty_json(guidance if isinstance(guidance, dict) else {})
    return "\n".join([
        "Socket adapter context:",
        f"Current workItem JSON: {item_json}",
        f"Global guidance JSON: {guidance_json}",
        "When you are done, reply with a concise summary of what you implemented.",
    ])


REFINEMENT_GUIDANCE = (
    "Current multi-turn mode: refinement conversation. Work with the user on this step; answer, ask and "
    "revise as needed. The step is finalized only when the user runs /materia continue, so do not emit "
    "the final JSON handoff yet."
)

FINALIZATION_NOTE = (
    "Command-triggered finalization: the user ran /materia continue. Turn the conversation so far into "
    "this step's final output now."
)

TEXT_FINAL_INSTRUCTION = "Final output format: return the final plain-text implementation summary for this step."
