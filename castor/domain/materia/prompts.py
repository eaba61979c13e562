"""Prompt assembly: template rendering, socket prompts, the synthetic cast
context, the system-prompt suffix, context artifacts and transcript isolation.

Socket prompt = sections joined by blank lines:

1. ``<materia-instructions>`` rendered materia prompt ``</materia-instructions>``
2. adapter context — text socket: current work item + guidance; JSON generator socket (not refining): generator block
3. multi-turn: refinement guidance (refinement turns); finalization = synthetic context + adapter + "Command-triggered
finalization" + final format
4. single-turn JSON socket: "Return only JSON" final instruction + handoff contract
"""

from __future__ import annotations

import re
from typing import Any

from castor.domain.jsontext import JS_WHITESPACE, js_trim, pretty_json
from castor.domain.materia import handoff
from castor.domain.materia.cast_messages import READ_ONLY_TOOLS
from castor.domain.materia.config import ResolvedSocket
from castor.domain.materia.expressions import MISSING, walk
from castor.domain.materia.graph import socket_ordinal_text
from castor.domain.materia.socket_facts import SocketFacts, facts_of
from castor.domain.materia.state import CastState
from castor.domain.materia.surface import command

OPEN_TAG = "<materia-instructions>"
CLOSE_TAG = "</materia-instructions>"


def _render_value(value: Any) -> str:
    if value is MISSING or value is None:
        return ""
    if isinstance(value, str):
        return value
    return pretty_json(value)


def template_value(key: str, state: CastState) -> Any:
    data = state.data
    if key == "request":
        return state.request
    if key == "stateJson":
        return pretty_json(data)
    if key == "itemJson":  # JSON.stringify(undefined) is undefined: no item renders nothing
        return pretty_json(data["item"]) if "item" in data else MISSING
    if key == "lastOutput":
        return state.last_output or ""
    if key == "lastJson":
        return state.last_json if state.last_json is not None else MISSING
    if key.startswith("cursor."):  # the cursor of that name, dots and all (not a path)
        return state.cursors.get(key[len("cursor."):], MISSING)
    for root, base in (("state.", data), ("item.", data.get("item", MISSING)),
                       ("lastJson.", state.last_json if state.last_json is not None else MISSING)):
        if key.startswith(root):
            return MISSING if base is MISSING else walk(base, key[len(root):])
    return walk(data, key)


def render_template(template: str, state: CastState) -> str:
    r"""``{{ key }}`` substitution; missing/null → "", strings raw, other values as 2-space JSON.

    The placeholders pi-materia's ``{{\s*([^}]+?)\s*}}`` finds, found in linear time (that
    pattern backtracks cubically over whitespace after an unclosed ``{{``): from a ``{{``, the
    text up to the first ``}`` is the key (trimmed) when it is not empty and that ``}`` is
    followed by another; else the search goes on one character later. ``{{}}`` stays as written.
    """
    out: list[str] = []
    done = search = 0
    close = -1  # the first "}" at or after the current key's start
    while True:
        start = template.find("{{", search)
        if start < 0:
            break
        if close < start + 2:
            close = template.find("}", start + 2)
            if close < 0:
                break
        if close > start + 2 and template.startswith("}", close + 1):
            out.append(template[done:start])
            out.append(_render_value(template_value(template[start + 2:close].strip(), state)))
            done = search = close + 2
        else:
            search = start + 1
    out.append(template[done:])
    return "".join(out)


def adapter_context(facts: SocketFacts, state: CastState, *, refining: bool) -> str | None:
    if not facts.is_json:
        data = state.data
        item = next((data[k] for k in ("item", "currentWorkItem", "workItem") if k in data), None)
        return handoff.text_adapter_context(item, data.get("guidance"))
    if facts.is_generator and not refining:  # a JSON generator
        return handoff.generator_adapter_context(state.data.get("workItems"))
    return None


def _mode_text(facts: SocketFacts, state: CastState, mode: str) -> str:
    """The ``Mode:`` line as pi-materia writes it for the turn being sent (which awaits the agent):
    a multi-turn socket's ``multi-turn refinement (…)``, finalizing or not; else the socket state."""
    if facts.multi_turn:
        detail = f"{command(state.surface, 'continue', state.cast_id, bare_in_harness=True)} finalization" \
            if mode == "finalization" else "awaiting_agent_response"
        return f"multi-turn refinement ({detail})"
    return "awaiting_agent_response"


def synthetic_context(socket: ResolvedSocket, state: CastState, *, mode: str) -> str:
    return _synthetic_context(facts_of(socket), state, mode=mode)


def _synthetic_context(facts: SocketFacts, state: CastState, *, mode: str) -> str:
    refining = mode == "refinement"
    lines = ["Materia isolated context.",
             "Use only this context and the instructions of the current socket; earlier conversation is hidden."]
    if refining:
        lines.append(handoff.REFINEMENT_GUIDANCE)
    elif facts.is_json:
        lines += ["Canonical handoff contract context:", handoff.contract_text()]
    lines += [
        f"Cast id: {state.cast_id}",
        f"Original request: {state.request}",
        f"Current socket: {facts.id}",
        f"Current materia: {facts.materia_name or '-'}",
        f"Current item: {state.current_item_label or state.current_item_key or '-'}",
        f"Mode: {_mode_text(facts, state, mode)}",
        f"Effective model: {facts.turn_model or 'active Pi model'}" if facts.materia else "Effective model: -",
        (f"Effective thinking: {facts.applied_thinking or 'active Pi thinking'}" if facts.materia
         else "Effective thinking: -"),
        f"Artifact directory: {state.run_dir}",
        "Generic cast data:",
        pretty_json(state.data),
        "Previous output:",
        state.last_assistant_text if state.last_assistant_text is not None else (state.last_output or ""),
    ]
    return "\n".join(lines)


def _instructions(rs: ResolvedSocket, state: CastState) -> str:
    return _wrap_instructions(render_template(facts_of(rs).prompt, state))


def _wrap_instructions(rendered: str) -> str:
    return f"{OPEN_TAG}\n{rendered}\n{CLOSE_TAG}"


def _tail_sections(facts: SocketFacts, state: CastState, mode: str) -> list[str]:
    sections: list[str] = []
    if mode == "finalization":
        sections.append(_synthetic_context(facts, state, mode=mode))
    ctx = adapter_context(facts, state, refining=mode == "refinement")
    if ctx:
        sections.append(ctx)
    if mode == "refinement":
        sections.append(handoff.REFINEMENT_GUIDANCE)
    elif mode == "finalization":
        sections.append(handoff.FINALIZATION_NOTE)
        sections.append(handoff.json_final_instruction() if facts.is_json else handoff.TEXT_FINAL_INSTRUCTION)
    elif facts.is_json:
        sections.append(handoff.json_final_instruction())
    return sections


def refinement_turn_prompt(rs: ResolvedSocket, state: CastState, synthetic: str) -> str:
    """The prompt stored for a user-driven refinement turn: instructions, ``synthetic`` (its
    :func:`synthetic_context`, which also heads its isolated transcript) and guidance."""
    return "\n\n".join([_instructions(rs, state), synthetic, handoff.REFINEMENT_GUIDANCE])


def socket_prompt_and_suffix(socket: ResolvedSocket, state: CastState, *, mode: str) -> tuple[str, str]:
    """One agent turn's hidden prompt in ``mode`` (normal | refinement | finalization) and the
    suffix appended to the host's system prompt while it runs (``before_agent_start``),
    rendering the materia prompt once."""
    facts = facts_of(socket)
    rendered = render_template(facts.prompt, state)
    tail = _tail_sections(facts, state, mode)
    prompt = "\n\n".join([_wrap_instructions(rendered), *tail])
    return prompt, f"Materia active materia ({facts.id}):\n" + "\n\n".join([rendered, *tail])


#: What the ``active tools:`` line of a context says for a ``coding`` turn: the harness activates its
#: whole tool set then, whose names castor is not told (pi-materia lists the host's names here).
CODING_TOOLS_TEXT = "all of the host's tools (coding)"


def active_tools(scope: str) -> str:
    """The ``active tools:`` value of a context artifact for a materia tool scope: the tool names
    the turn runs with, comma-separated as pi-materia writes them (``none`` for none)."""
    if scope == "readOnly":
        return ", ".join(READ_ONLY_TOOLS)
    if scope == "coding":
        return CODING_TOOLS_TEXT
    return "none"


def context_artifact(socket: ResolvedSocket, state: CastState, *, mode: str, prompt: str, at_iso: str) -> str:
    """The ``contexts/…md`` artifact of one prompt, laid out as pi-materia writes it: the header,
    plain ``name: value`` lines (``at_iso`` as ``toISOString`` writes it: milliseconds, ``Z``), the
    synthetic cast context and the hidden prompt."""
    facts = facts_of(socket)
    lines = [
        "# Materia Isolated Context", "",
        f"cast: {state.cast_id}",
        f"socket: {facts.id}",
        f"materia: {facts.materia_name or '-'}",
        f"item: {state.current_item_label or state.current_item_key or '-'}",
        f"visit: {state.visit}",
        f"model: {facts.turn_model or 'active Pi model'}",  # blank: unset
        "model source: " + ("configured materia setting" if facts.turn_model else "active Pi model fallback"),
        f"thinking: {facts.applied_thinking or 'active Pi thinking'}",
        "thinking source: " + ("configured materia setting" if facts.applied_thinking
                               else "active Pi thinking fallback"),
        f"active tools: {active_tools(facts.tools)}",
        f"timestamp: {at_iso}",
        "", "## Synthetic cast context", "", _synthetic_context(facts, state, mode=mode),
        "", "## Hidden materia prompt", "", prompt, "",
    ]
    return "\n".join(lines)


def isolate_context(messages: list[dict[str, Any]], synthetic: str) -> list[dict[str, Any]]:
    """Replace everything before the newest non-assistant message holding the materia tags with one
    synthetic user message (the isolated context). Unchanged if no such message exists."""

    def text_of(message: dict[str, Any]) -> str:
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return ""

    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") in ("assistant", "tool", "toolResult"):
            continue
        text = text_of(message)
        if OPEN_TAG in text and CLOSE_TAG in text:
            return [{"role": "user", "content": [{"type": "text", "text": synthetic}]}, *messages[index:]]
    return list(messages)


_LEGACY_SOCKET_SUFFIX = re.compile(f"[{JS_WHITESPACE}]+(Socket-[1-9][0-9]*)$")


def shown_materia_name(materia_name: str | None, socket_id: str) -> tuple[str, str | None]:
    """The materia's name as a turn's visible line and its message show it, and the socket's
    ordinal (the N of ``Socket-N``, as written), as pi-materia derives both: the name trimmed
    ("materia" when blank), a legacy `` Socket-N`` suffix of it not shown (its N the ordinal when
    the socket id has none)."""
    name = js_trim(materia_name or "") or "materia"
    ordinal = socket_ordinal_text(socket_id)
    if name.endswith(f" {socket_id}"):
        name = js_trim(name[: -len(socket_id) - 1]) or "materia"
    else:
        suffix = _LEGACY_SOCKET_SUFFIX.search(name)
        if suffix is not None:
            name = js_trim(name[: suffix.start()]) or "materia"
            ordinal = ordinal if ordinal is not None else socket_ordinal_text(suffix.group(1))
    return name, ordinal


def cast_summary(materia_name: str | None, socket_id: str, ordinal: str | None, item_label: str | None) -> str:
    """The visible line of a turn, as pi-materia formats it: ``Casting **<materia> (<N>)**``, then the
    current item's label (trimmed) as a paragraph of its own when it is not blank. The materia name
    is :func:`shown_materia_name`'s; ``ordinal`` is the socket id's (else the legacy suffix's)."""
    name, shown_ordinal = shown_materia_name(materia_name, socket_id)
    ordinal = ordinal if ordinal is not None else shown_ordinal
    label = f"{name} ({ordinal})" if ordinal is not None else name
    item = js_trim(item_label or "")
    return f"Casting **{label}**\n\n{item}" if item else f"Casting **{label}**"


def turn_message_details(*, socket_id: str, materia_name: str | None, item_key: str | None,
                         item_label: str | None, materia_model: dict[str, Any] | None) -> tuple[dict[str, Any],
                                                                                                dict[str, Any]]:
    """The ``details`` pi-materia gives a turn's two messages: the visible "Casting" line's (what
    its renderer labels the message by: ``prefix``, ``eventType``, the socket, the materia's shown
    name and the socket's ordinal as a number, the item, the ``materiaModel`` record) and the hidden
    prompt's (the phase -- the socket --, the socket, the materia as configured, the item, the
    record). A field with no value is left out, as pi-materia's JSON leaves out what is undefined."""
    shown, ordinal = shown_materia_name(materia_name, socket_id)
    visible = {"prefix": "materia", "socketId": socket_id, "materiaName": shown,
               "socketOrdinal": int(ordinal) if ordinal is not None else None, "itemKey": item_key,
               "itemLabel": item_label, "eventType": "materia_prompt", "materiaModel": materia_model}
    hidden = {"phase": socket_id, "socketId": socket_id, "materiaName": materia_name, "itemKey": item_key,
              "itemLabel": item_label, "materiaModel": materia_model}
    return ({k: v for k, v in visible.items() if v is not None}, {k: v for k, v in hidden.items() if v is not None})
