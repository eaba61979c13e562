"""Field-level config checks: obsolete fields, materia entries, budget/limits, compaction tiers.

Each check returns a list of :class:`ConfigIssue` (empty when fine) and never raises.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from castor.domain.jsontext import json_kind, json_shown
from castor.domain.materia.config import (
    THINKING_LEVELS,
    TOOL_SCOPES,
    ConfigIssue,
    Loop,
    ResolvedSocket,
    is_plain_object,
    pointer,
    warning,
)
from castor.domain.materia.expressions import misread_target, unreadable_path

OBSOLETE_TOP = {"roles": "use \"materia\"", "materiaDefinitions": "use \"materia\""}
OBSOLETE_LOADOUT = ("prompt", "systemPrompt")
OBSOLETE_SOCKET_AT_LOAD = ("role", "prompt", "systemPrompt")


def _obsolete(path: str, field: str, source: str | None, hint: str) -> ConfigIssue:
    where = f" in {source}" if source else ""
    return ConfigIssue(
        code="obsolete-field",
        path=path,
        message=f"obsolete field \"{field}\"{where}: {hint}",
        source=source,
    )


def check_obsolete(raw: dict[str, Any], source: str | None) -> list[ConfigIssue]:
    """Obsolete fields of one layer file. ``generates`` non-null is rejected too."""
    issues: list[ConfigIssue] = []
    for field, hint in OBSOLETE_TOP.items():
        if field in raw:
            issues.append(_obsolete(pointer(field), field, source, hint))
    materia = raw.get("materia")
    if is_plain_object(materia):
        for name, entry in materia.items():
            if not is_plain_object(entry):
                continue
            if "systemPrompt" in entry:
                issues.append(_obsolete(pointer("materia", name, "systemPrompt"), "systemPrompt", source,
                                        "materia systemPrompt is obsolete; put the text in \"prompt\""))
            if entry.get("generates") is not None:
                issues.append(ConfigIssue(
                    code="obsolete-field",
                    path=pointer("materia", name, "generates"),
                    message=(f"materia \"{name}\" has obsolete generates metadata"
                             f"{' in ' + source if source else ''}: use generator: true, which always "
                             "produces canonical workItems"),
                    source=source,
                ))
    loadouts = raw.get("loadouts")
    if is_plain_object(loadouts):
        for lname, loadout in loadouts.items():
            if not is_plain_object(loadout):
                continue
            for field in OBSOLETE_LOADOUT:
                if field in loadout:
                    issues.append(_obsolete(pointer("loadouts", lname, field), field, source,
                                            "loadout-level prompts are obsolete; use materia prompts"))
            sockets = loadout.get("sockets")
            if not is_plain_object(sockets):
                continue
            for sid, sock in sockets.items():
                if not is_plain_object(sock):
                    continue
                for field in OBSOLETE_SOCKET_AT_LOAD:
                    if field in sock:
                        issues.append(_obsolete(pointer("loadouts", lname, "sockets", sid, field), field, source,
                                                "socket-level role/prompt is obsolete; reference a materia"))
    return issues


def check_materia_entry(name: str, entry: Any, source: str | None = None) -> list[ConfigIssue]:
    """One materia definition (agent or utility)."""
    base = ("materia", name)
    if not is_plain_object(entry):
        return [ConfigIssue(code="invalid-materia", path=pointer(*base), source=source,
                            message=f"materia \"{name}\" must be an object, not {json_kind(entry)}")]
    issues: list[ConfigIssue] = []

    def bad(field: str, message: str) -> None:
        issues.append(ConfigIssue(code="invalid-materia", path=pointer(*base, field), source=source,
                                  message=f"materia \"{name}\": {message}"))

    mtype = entry.get("type", "agent")
    if mtype is None:
        mtype = "agent"
    if mtype == "agent":
        if not isinstance(entry.get("prompt"), str):
            bad("prompt", "invalid prompt (a string is required)")
        if "tools" not in entry:
            bad("tools", f"invalid tools: tools is missing (one of {', '.join(TOOL_SCOPES)})")
        elif entry["tools"] not in TOOL_SCOPES:
            bad("tools", f"invalid tools {json_shown(entry['tools'])} (one of {', '.join(TOOL_SCOPES)})")
        model = entry.get("model")
        if model is not None and not isinstance(model, str):
            bad("model", "model must be a string")
        thinking = entry.get("thinking")
        if thinking is not None and not isinstance(thinking, str):
            bad("thinking", "invalid thinking (a string is required)")
        elif isinstance(thinking, str) and thinking.strip() and thinking not in THINKING_LEVELS:
            # pi-materia accepts any string and falls back to the host's level at run time.
            issues.append(warning("unknown-thinking", pointer(*base, "thinking"), source=source,
                                  message=f"materia \"{name}\": unknown thinking level {json_shown(thinking)} (one of "
                                          f"{', '.join(THINKING_LEVELS)}); its turns keep the harness's "
                                          "current thinking level"))
        for flag in ("multiTurn", "generator"):
            if flag in entry and entry[flag] is not None and not isinstance(entry[flag], bool):
                bad(flag, f"{flag} must be a boolean")
        parse = entry.get("parse")
        if parse is not None and parse not in ("text", "json"):
            bad("parse", f"unsupported parse mode {json_shown(parse)}")
    elif mtype == "utility":
        if "prompt" in entry:
            bad("prompt", "a utility materia must not have a prompt")
        if not entry.get("utility") and not entry.get("command"):
            bad("utility", "a utility materia needs \"utility\" or \"command\"")
        elif entry.get("utility") is not None and not isinstance(entry["utility"], str):
            bad("utility", "utility must be a string (a built-in utility's name)")
        parse = entry.get("parse")
        if parse is not None and parse not in ("text", "json"):
            bad("parse", f"unsupported parse mode {json_shown(parse)}")
        issues.extend(_command_issues(entry.get("command"), base, source, f"materia \"{name}\""))
        issues.extend(_timeout_issues(entry.get("timeoutMs"), base, source, f"materia \"{name}\""))
    else:
        bad("type", f"unsupported type {json_shown(mtype)} (agent or utility)")
    return issues


def _command_issues(command: Any, base: tuple[str | int, ...], source: str | None, who: str) -> list[ConfigIssue]:
    if command is None:
        return []
    if not isinstance(command, list) or not command:
        return [ConfigIssue(code="invalid-socket", path=pointer(*base, "command"), source=source,
                            message=f"{who}: command must be a non-empty array of non-empty strings")]
    out = []
    for i, element in enumerate(command):
        if not isinstance(element, str) or not element:
            out.append(ConfigIssue(code="invalid-socket", path=pointer(*base, "command", i), source=source,
                                   message=f"{who}: malformed command element at index {i}"))
        elif "\0" in element:  # no program can receive it: an argument ends at its first NUL
            out.append(ConfigIssue(code="invalid-socket", path=pointer(*base, "command", i), source=source,
                                   message=f"{who}: command element at index {i} holds a NUL character"))
    return out


#: The longest ``timeoutMs`` (about 24.8 days): JavaScript's timers hold no longer one (pi-materia's
#: fires at once past it), and a wait of 1e300 ms crashed the utility slot that ran the command.
MAX_TIMEOUT_MS = 2**31 - 1


def _timeout_issues(timeout: Any, base: tuple[str | int, ...], source: str | None, who: str) -> list[ConfigIssue]:
    if timeout is None:
        return []
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        return [ConfigIssue(code="invalid-socket", path=pointer(*base, "timeoutMs"), source=source,
                            message=f"{who}: timeoutMs must be a positive number")]
    if timeout > MAX_TIMEOUT_MS:
        return [ConfigIssue(code="invalid-socket", path=pointer(*base, "timeoutMs"), source=source,
                            message=f"{who}: timeoutMs {json_shown(timeout)} is longer than any timer holds: at most "
                                    f"{MAX_TIMEOUT_MS} ms (about 24.8 days; pi-materia's timer fires at once past it)")]
    return []


command_issues = _command_issues
timeout_issues = _timeout_issues


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


#: The largest whole-number limit castor holds (a 64-bit integer): one larger (``1e300``) is refused.
MAX_WHOLE_LIMIT = 2**63 - 1


def check_budget_limits(config: dict[str, Any], source: str | None = None) -> list[ConfigIssue]:
    """``budget`` and ``limits`` must be objects with sensible numbers when present."""
    issues: list[ConfigIssue] = []
    budget = config.get("budget")
    if budget is not None:
        if not is_plain_object(budget):
            issues.append(ConfigIssue(code="invalid-budget", path=pointer("budget"), source=source,
                                      message=f"budget must be an object, not {json_kind(budget)}"))
        else:
            for key in ("maxTokens", "maxCostUsd", "warnAtPercent"):
                if budget.get(key) is not None and (not _number(budget[key]) or budget[key] < 0):
                    issues.append(ConfigIssue(code="invalid-budget", path=pointer("budget", key), source=source,
                                              message=f"budget.{key} must be a non-negative number"))
            if budget.get("stopAtLimit") is not None and not isinstance(budget["stopAtLimit"], bool):
                issues.append(ConfigIssue(code="invalid-budget", path=pointer("budget", "stopAtLimit"),
                                          source=source, message="budget.stopAtLimit must be a boolean"))
    limits = config.get("limits")
    if limits is not None:
        if not is_plain_object(limits):
            issues.append(ConfigIssue(code="invalid-limits", path=pointer("limits"), source=source,
                                      message=f"limits must be an object, not {json_kind(limits)}"))
        else:
            for key in ("maxSocketVisits", "maxEdgeTraversals"):
                value = limits.get(key)
                # JSON has one kind of number: 3.0 is 3 to pi-materia (JavaScript), so to castor too.
                whole = (isinstance(value, int) and not isinstance(value, bool)) or (
                    isinstance(value, float) and value.is_integer())
                if value is not None and (not whole or value < 1):
                    issues.append(ConfigIssue(code="invalid-limits", path=pointer("limits", key), source=source,
                                              message=f"limits.{key} must be a positive integer"))
                elif value is not None and value > MAX_WHOLE_LIMIT:  # refused later as a pydantic int, pointed wrong
                    issues.append(ConfigIssue(code="invalid-limits", path=pointer("limits", key), source=source,
                                              message=f"limits.{key} must be a positive integer of at most "
                                                      f"{MAX_WHOLE_LIMIT}, not {json_shown(value)}"))
    return issues


def check_compaction(compaction: Any, source: str | None = None) -> list[ConfigIssue]:
    """Compaction config: a percent in [0,100] and/or a contiguous tier list."""
    if compaction is None:
        return []
    base = ("compaction",)

    def issue(message: str, *parts: str | int) -> ConfigIssue:
        return ConfigIssue(code="invalid-compaction", path=pointer(*base, *parts), source=source, message=message)

    if not is_plain_object(compaction):
        return [issue(f"compaction must be an object, not {json_kind(compaction)}")]
    issues: list[ConfigIssue] = []
    pct = compaction.get("proactiveThresholdPercent")
    if pct is not None and (not _number(pct) or not 0 <= pct <= 100):
        issues.append(issue("proactiveThresholdPercent must be a number between 0 and 100",
                            "proactiveThresholdPercent"))
    tiers = compaction.get("proactiveThresholdTiers")
    if tiers is None:
        return issues
    if not isinstance(tiers, list) or not tiers:
        issues.append(issue("proactiveThresholdTiers must be a non-empty array", "proactiveThresholdTiers"))
        return issues
    previous_max: int | None = None
    for i, tier in enumerate(tiers):
        at = ("proactiveThresholdTiers", i)
        if not is_plain_object(tier):
            issues.append(issue(f"each tier must be an object, not {json_kind(tier)}", *at))
            return issues
        threshold = tier.get("thresholdPercent")
        if not isinstance(threshold, (int, float)) or not _number(threshold) or not 0 <= threshold <= 100:
            issues.append(issue("thresholdPercent must be a number between 0 and 100", *at, "thresholdPercent"))
        lo = tier.get("minContextWindow", 0)
        hi = tier.get("maxContextWindow")
        if not isinstance(lo, int) or isinstance(lo, bool) or lo < 0:
            issues.append(issue("minContextWindow must be a non-negative integer", *at, "minContextWindow"))
            return issues
        if i == 0 and lo != 0:
            issues.append(issue("the tiers must cover every context window without gaps or overlaps: the first "
                                f"tier must start at minContextWindow 0, not {lo}", *at, "minContextWindow"))
        if previous_max is not None and lo != previous_max:
            kind = "a gap" if lo > previous_max else "an overlap"
            issues.append(issue(f"the tiers must cover every context window without gaps or overlaps: tier {i} "
                                f"leaves {kind} (minContextWindow {lo} must equal the previous tier's "
                                f"maxContextWindow {previous_max})", *at, "minContextWindow"))
        last = i == len(tiers) - 1
        if hi is None:
            if not last:
                issues.append(issue("only the final tier may omit maxContextWindow", *at, "maxContextWindow"))
                return issues
        else:
            if not isinstance(hi, int) or isinstance(hi, bool) or hi <= lo:
                issues.append(issue("maxContextWindow must be an integer greater than minContextWindow",
                                    *at, "maxContextWindow"))
                return issues
            if last:
                issues.append(
                    issue("the final tier must be open-ended: omit its maxContextWindow", *at, "maxContextWindow")
                )
        previous_max = hi
    return issues


#: The fields each place of a config has, pi-materia's and castor's (UI-only ones included):
#: a key outside these is read by neither, so it is most likely a misspelling of one of them.
KNOWN_TOP = ("$schema", "artifactDir", "budget", "limits", "compaction", "materia", "loadouts", "activeLoadout",
             *OBSOLETE_TOP)
KNOWN_OBJECT_FIELDS = {
    "budget": ("maxTokens", "maxCostUsd", "warnAtPercent", "stopAtLimit"),
    "limits": ("maxSocketVisits", "maxEdgeTraversals"),
    "compaction": ("proactiveThresholdPercent", "proactiveThresholdTiers"),
}
KNOWN_MATERIA = ("type", "prompt", "tools", "model", "thinking", "multiTurn", "generator", "parse", "label",
                 "description", "group", "color", "generates", "systemPrompt", "utility", "command", "params",
                 "timeoutMs", "assign")
KNOWN_SOCKET = ("type", "materia", "utility", "command", "params", "timeoutMs", "parse", "assign", "edges", "next",
                "foreach", "advance", "limits", "socketKind", "empty", "layout", "label", "description",
                "budget", *OBSOLETE_SOCKET_AT_LOAD, "multiTurn")


def _unknown(path: tuple[str | int, ...], key: str, where: str, known: tuple[str, ...],
             source: str | None) -> ConfigIssue:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6) or [
        k for k in known if k.lower() == key.lower()]
    hint = f"; did you mean \"{close[0]}\"?" if close else f" (known: {', '.join(k for k in known if k[0] != '$')})"
    return warning("unknown-field", pointer(*path, key), source=source,
                   message=f"{where} has a field \"{key}\" that neither castor nor pi-materia reads: it is "
                           f"ignored{hint}")


def unknown_field_warnings(merged: dict[str, Any], lname: str, loadout: dict[str, Any],
                           source: str | None) -> list[ConfigIssue]:
    """A field nothing reads -- at the top level, in ``budget``/``limits``/``compaction``, in a
    materia, or in a socket of loadout ``lname`` -- is loaded and ignored (as pi-materia ignores it)
    and named: ``"maxCostUSD"`` for ``maxCostUsd`` is a cast with no cost limit at all."""
    issues = [_unknown((), key, "the config", KNOWN_TOP, source) for key in merged if key not in KNOWN_TOP]
    for field, known in KNOWN_OBJECT_FIELDS.items():
        value = merged.get(field)
        if is_plain_object(value):
            issues += [_unknown((field,), key, field, known, source) for key in value if key not in known]
    materia = merged.get("materia")
    for name, entry in (materia.items() if is_plain_object(materia) else ()):
        if is_plain_object(entry):
            issues += [_unknown(("materia", name), key, f"materia \"{name}\"", KNOWN_MATERIA, source)
                       for key in entry if key not in KNOWN_MATERIA]
    sockets = loadout.get("sockets")
    for sid, socket in (sockets.items() if is_plain_object(sockets) else ()):
        if is_plain_object(socket):
            issues += [_unknown(("loadouts", lname, "sockets", sid), key, f"loadout \"{lname}\": {sid}",
                                KNOWN_SOCKET, source) for key in socket if key not in KNOWN_SOCKET]
    return issues


#: castor's expression syntax, as a warning about an expression it cannot read spells it out.
EXPRESSION_SYNTAX = ("castor's expressions are dotted paths: \"$\" or \"$.a.b\" (the parsed output), "
                     "\"state.a.b\", \"item.x\", \"lastJson.x\", \"lastOutput\", or a path into the cast's data; "
                     "a numeric step indexes a list (\"$.items.0\")")


def unreadable_expression_warnings(lname: str, sockets: dict[str, ResolvedSocket], loops: dict[str, Loop],
                                   source: str | None) -> list[ConfigIssue]:
    """An ``assign`` source or an ``items`` expression (``foreach``, ``advance``, a loop's
    ``iterator``) written in a syntax castor's dotted paths do not read -- JSONPath's
    ``$['x']``, ``$.items[0]``, ``$..x``, ``[*]`` -- reads nothing on every run: the target is
    never set, the list is empty. pi-materia loads and runs it without a word; castor runs it the
    same and warns at load, naming the field, the syntax, and the dotted path meant where there is one.
    So for a target written as an expression (``"$.result"``, ``"state.x"``, ``"items['a']"``): it
    writes a key of the data that no such expression reads back (``expression-as-assign-target``)."""
    places: list[tuple[tuple[str | int, ...], str, str, str]] = []
    for sid, rs in sockets.items():
        sock = rs.socket
        base: tuple[str | int, ...] = ("loadouts", lname, "sockets", sid)
        places += [((*base, "assign", target), f"{sid}.assign[\"{target}\"]", expr, "its target is never set")
                   for target, expr in sock.assign.items()]
        for field, block in (("foreach", sock.foreach), ("advance", sock.advance)):
            if block is not None:
                places.append(((*base, field, "items"), f"{sid}.{field}.items", block.items, "its list is empty"))
    for loop_id, loop in loops.items():
        if loop.iterator is not None:
            places.append((("loadouts", lname, "loops", loop_id, "iterator", "items"),
                           f"loop \"{loop_id}\" iterator.items", loop.iterator.items, "its list is empty"))
    issues = []
    for sid, rs in sockets.items():
        for target in rs.socket.assign:
            misread = misread_target(target)
            if misread is None:
                continue
            reason, meant = misread
            advice = f" Write \"{meant}\" (read back as \"state.{meant}\")." if meant is not None else ""
            issues.append(warning("expression-as-assign-target",
                                  pointer("loadouts", lname, "sockets", sid, "assign", target), source=source,
                                  message=f"loadout \"{lname}\": {sid}.assign target {json_shown(target)}: {reason} "
                                          f"(pi-materia writes it there too, without a word).{advice}"))
    for where, field, expr, effect in places:
        found = unreadable_path(expr)
        if found is None:
            continue
        reason, meant = found
        advice = f" Write \"{meant}\"." if meant is not None else ""
        issues.append(warning("unreadable-expression", pointer(*where), source=source,
                              message=f"loadout \"{lname}\": {field} = {json_shown(expr)}: {reason}, so {effect} "
                                      f"(pi-materia reads nothing there either, without a word).{advice} "
                                      f"{EXPRESSION_SYNTAX}."))
    return issues


#: The built-in utilities a socket's ``utility`` may name (the engine's inline ``noop``/``echo`` and
#: its IO built-ins, :data:`castor.domain.materia.engine.IO_BUILTINS`).
KNOWN_UTILITIES = ("noop", "echo", "project.ensureIgnored", "vcs.detect")


def unknown_utility_warnings(lname: str, sockets: dict[str, ResolvedSocket], source: str | None) -> list[ConfigIssue]:
    """A utility socket naming a built-in that does not exist (``"vcs.detekt"``), with no ``command``
    and no ``params.output`` to run instead, fails the cast when it is reached ("Unknown utility
    alias"); pi-materia loads it the same. castor loads it too and names it at load, with the
    built-in it most resembles, so ``castor validate`` does not call such a config valid unseen."""
    issues = []
    for sid, rs in sockets.items():
        sock = rs.socket
        if sock.type != "utility" or sock.command or "output" in (sock.params or {}) or not sock.utility \
                or sock.utility in KNOWN_UTILITIES:
            continue
        close = difflib.get_close_matches(sock.utility, KNOWN_UTILITIES, n=1, cutoff=0.6)
        hint = f"; did you mean \"{close[0]}\"?" if close else f" (the built-ins: {', '.join(KNOWN_UTILITIES)})"
        issues.append(warning("unknown-utility", pointer("loadouts", lname, "sockets", sid, "utility"), source=source,
                              message=f"loadout \"{lname}\": {sid} names utility {json_shown(sock.utility)}, which is "
                                      f"no built-in: a cast that reaches {sid} fails there (\"Unknown utility alias\"; "
                                      f"pi-materia loads it the same){hint}"))
    return issues
